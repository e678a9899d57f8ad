// Tensor parallelism's CPU simulation (shard.h): every family fixture split over 2 ranks (and 1) by its
// description, the ranks running the same forward() on threads of their own with the all-reduce as a sum in rank
// order, gives the unsharded model's logits (prefill of every position, then decode steps through the KV caches).
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "lowbit/core/error.h"
#include "lowbit/core/thread_pool.h"
#include "lowbit/model/shard.h"
#include "model/family_fixtures.h"

namespace lowbit::model {
namespace {

using testing::kFamilyFixtures;

// The sharded logits of a prefill of `tokens` and `steps` greedy decode steps after it, next to the unsharded ones.
struct Logits {
  std::vector<float> full, sharded;
};

Logits run_sharded(const Model& m, const std::vector<int32_t>& tokens, int ranks, int steps) {
  const int64_t vocab = m.config.vocab, ctx = m.config.max_seq;
  std::vector<std::unique_ptr<Model>> shards;
  shards.reserve(static_cast<size_t>(ranks));
  const auto comms = local_group(ranks);
  for (int r = 0; r < ranks; ++r) shards.push_back(shard_model(m, r, ranks, comms[static_cast<size_t>(r)], "fixture"));
  std::vector<const Model*> models;
  std::vector<std::unique_ptr<KvCache>> caches;
  std::vector<KvCache*> cache_ptrs;
  std::vector<std::unique_ptr<ThreadPool>> pools;
  std::vector<ThreadPool*> pool_ptrs;
  for (const auto& s : shards) {
    models.push_back(s.get());
    caches.push_back(std::make_unique<KvCache>(s->config, ctx));
    cache_ptrs.push_back(caches.back().get());
    pools.push_back(std::make_unique<ThreadPool>(1));
    pool_ptrs.push_back(pools.back().get());
  }
  ThreadPool pool(2);
  KvCache cache(m.config, ctx);
  Logits run;
  run.full.resize(tokens.size() * static_cast<size_t>(vocab));
  run.sharded.resize(run.full.size());
  forward(m, cache, tokens, 0, run.full.data(), true, pool);
  forward_ranks(models, cache_ptrs, pool_ptrs, tokens, 0, run.sharded.data(), true);
  // greedy from the unsharded logits, so both decode the same tokens
  std::vector<float> full(static_cast<size_t>(vocab)), sharded(full.size());
  std::copy(run.full.end() - vocab, run.full.end(), full.begin());
  for (int i = 0; i < steps; ++i) {
    const int32_t next = testing::argmax_of(full);
    const auto pos = static_cast<int64_t>(tokens.size()) + i;
    forward(m, cache, std::span(&next, 1), pos, full.data(), false, pool);
    forward_ranks(models, cache_ptrs, pool_ptrs, std::span(&next, 1), pos, sharded.data(), false);
    run.full.insert(run.full.end(), full.begin(), full.end());
    run.sharded.insert(run.sharded.end(), sharded.begin(), sharded.end());
  }
  return run;
}

class ShardFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(ShardFixture, ShardedLogitsEqualUnsharded) {
  const testing::FamilyExpected e = testing::family_expected_for(kFamilyFixtures / GetParam(), false);
  const int steps = static_cast<int>(e.greedy.size());
  const auto m = load_model(kFamilyFixtures / GetParam(), LoadOptions{static_cast<int64_t>(e.tokens.size()) + steps});
  for (const int ranks : {1, 2}) {
    const Logits r = run_sharded(*m, e.tokens, ranks, steps);
    const double rel = testing::max_relative_diff(r.sharded, r.full);
    std::cout << "[ shard    ] " << GetParam() << " over " << ranks
              << " ranks: max |sharded - whole| / max |whole| = " << rel << "\n";
    EXPECT_LE(rel, 1e-5) << GetParam() << " over " << ranks << " ranks";
  }
}

INSTANTIATE_TEST_SUITE_P(Families, ShardFixture, ::testing::ValuesIn(testing::family_fixture_dirs()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// llama.cpp's GGUF of the llama fixture: q/k rows in interleaved RoPE order, quantized where the converter did.
TEST(Shard, GgufModelSplits) {
  const auto dir = kFamilyFixtures / "llama";
  const testing::FamilyExpected e = testing::family_expected_for(dir, true);
  const auto m = load_model(dir / "model.gguf", LoadOptions{static_cast<int64_t>(e.tokens.size()) + 2});
  const Logits r = run_sharded(*m, e.tokens, 2, 2);
  EXPECT_LE(testing::max_relative_diff(r.sharded, r.full), 1e-5);
}

// A llama of random weights with every linear (the embedding and head included) in 4-bit affine storage of
// `group` columns per group.
std::unique_ptr<Model> affine_model(int64_t group) {
  ModelConfig c;
  c.arch = "llama";
  c.dim = 64;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.hidden_dim = 128;
  c.vocab = 64;
  c.max_seq = 32;
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> u(-0.5f, 0.5f);
  const codec::Codec& affine = codec::codec_or_throw("affine", "test");
  ModelBuilder b;
  const auto add = [&](const std::string& name, const Shape& shape, float offset) {
    std::vector<float> v(static_cast<size_t>(shape[0] * (shape.size() == 2 ? shape[1] : 1)));
    for (float& x : v) x = offset + u(rng);
    if (shape.size() == 1) return b.add_f32(name, shape, std::move(v));
    auto e = std::make_shared<codec::EncodedTensor>(
        affine.encode({{"bits", 4}, {"group_size", group}, {"scale_dtype", "f16"}}, shape, v.data(), {}));
    b.add(name, {&affine, e->params, shape, e->views()}, e);
  };
  const ModelDesc d = describe_model(c, "affine llama");
  add(std::string(kEmbedTensor), {c.vocab, c.dim}, 0.0f);
  for (int64_t l = 0; l < c.n_layers; ++l)
    for (const TensorSpec& t : d.layers[static_cast<size_t>(l)].tensors)
      add(hf_tensor_name(l, t),
          t.linear() ? Shape{dim_size(t.rows, c), dim_size(t.cols, c)} : Shape{dim_size(t.rows, c)},
          t.linear() ? 0.0f : 1.0f);
  add(std::string(kFinalNormTensor), {c.dim}, 1.0f);
  add(std::string(kLmHeadTensor), {c.vocab, c.dim}, 0.0f);
  return b.finish(c, "affine llama");
}

// Shards of packed weights run through the affine kernels: o and down split their columns at 32 of 64 and 64 of
// 128, on group boundaries of 32; with groups of 64 the split of o would cut a group, which is refused naming it.
TEST(Shard, QuantizedShardsKeepTheirGroups) {
  const auto m = affine_model(32);
  const std::vector<int32_t> tokens{1, 5, 9, 2, 33, 60, 7};
  // one rank: the same kernels over the same packed rows, so the same sums
  const Logits one = run_sharded(*m, tokens, 1, 3);
  EXPECT_EQ(one.sharded, one.full);
  // two: the dot products of o, down and the head's rows split into partial sums, so f32 rounding differs; the
  // random weights of +-0.5 make logits of tens, hence the family test's bound rather than 1e-5
  const Logits r = run_sharded(*m, tokens, 2, 3);
  const double rel = testing::max_relative_diff(r.sharded, r.full);
  std::cout << "[ shard    ] affine 4-bit over 2 ranks: max |sharded - whole| / max |whole| = " << rel << "\n";
  EXPECT_LE(rel, testing::kFamilyTolerance);
  const auto coarse = affine_model(64);
  try {
    shard_model(*coarse, 0, 2, local_group(2)[0], "affine llama");
    FAIL() << "split a group of 64 at column 32";
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), Errc::shape);
    EXPECT_NE(std::string(err.what()).find("o_proj"), std::string::npos) << err.what();
    EXPECT_NE(std::string(err.what()).find("cuts a group"), std::string::npos) << err.what();
  }
}

TEST(Shard, PlanFollowsTheDescription) {
  const auto m = load_model(kFamilyFixtures / "phi3");
  const LayerDesc& layer = m->desc.layers[0];
  EXPECT_EQ(split_of(*layer.find(Role::qkv), layer), Split::rows);
  EXPECT_EQ(split_of(*layer.find(Role::o), layer), Split::cols);
  EXPECT_EQ(split_of(*layer.find(Role::gate_up), layer), Split::rows);
  EXPECT_EQ(split_of(*layer.find(Role::down), layer), Split::cols);
  EXPECT_EQ(split_of(*layer.find(Role::attn_norm), layer), Split::replicated);
  const ModelConfig& c = m->config;
  // rank 1 of 2 of the fused qkv: its q heads, then its k and v heads, each after the parts before it
  const std::vector<codec::Range> qkv = dim_ranges(Dim::qkv_dim, c, 1, 2);
  ASSERT_EQ(qkv.size(), 3u);
  EXPECT_EQ(qkv[0].begin, c.q_dim() / 2);
  EXPECT_EQ(qkv[1].begin, c.q_dim() + c.kv_dim() / 2);
  EXPECT_EQ(qkv[2].end, c.q_dim() + 2 * c.kv_dim());
  const ModelDesc d = shard_desc(m->desc);
  const auto reduces = std::count_if(d.layers[0].ops.begin(), d.layers[0].ops.end(),
                                     [](const Op& op) { return op.kind == Op::Kind::all_reduce; });
  EXPECT_EQ(reduces, 2);
  const auto moe = load_model(kFamilyFixtures / "qwen3_moe");
  const LayerDesc& moe_layer = moe->desc.layers[0];
  EXPECT_EQ(split_of(*moe_layer.find(Role::router), moe_layer), Split::replicated);
  EXPECT_EQ(split_of(*moe_layer.find(Role::expert_up), moe_layer), Split::by_expert);
}

TEST(Shard, RefusesWhatDoesNotSplit) {
  const auto m = load_model(kFamilyFixtures / "llama");
  const auto comms = local_group(4);
  // 2 KV heads over 4 devices
  try {
    shard_model(*m, 0, 4, comms[0], "llama fixture");
    FAIL() << "sharded 2 KV heads over 4 ranks";
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), Errc::usage);
    EXPECT_NE(std::string(err.what()).find("KV heads"), std::string::npos) << err.what();
  }
  const auto cpu_only = load_model(kFamilyFixtures / "llama", LoadOptions{.cpu_only = true});
  EXPECT_THROW(shard_model(*cpu_only, 0, 2, local_group(2)[0], "llama fixture"), Error);
}

}  // namespace
}  // namespace lowbit::model
