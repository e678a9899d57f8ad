// The GPU model runtime against the CPU forward pass: logits of small random models (dense f32, affine 4-bit and
// trellis, every architecture flag, prefill passes and decode steps, batched sequences), graph replay against
// eager launches, stories260K's greedy tokens and its preset-quantized artifacts. Skips when no CUDA device is
// present.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <map>
#include <numeric>
#include <random>
#include <string>

#include "lowbit/core/error.h"
#include "lowbit/core/thread_pool.h"
#include "lowbit/kernels/cuda.h"
#include "lowbit/kernels/cuda_model_ops.h"
#include "lowbit/model/cuda_model.h"
#include "lowbit/model/sampler.h"
#include "model/tiny_model.h"
#include "quant/quant_fixture.h"

namespace lowbit::model {
namespace {

namespace fs = std::filesystem;

class CudaModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!kernels::cuda::device_available(&why)) GTEST_SKIP() << "no usable CUDA device: " << why;
  }
  ThreadPool pool{2};
};

// ||a - b|| / ||b||; NaN (an unwritten or broken output) never passes a bound.
double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// Logits [tokens, vocab]: a prefill of the first `prefill` tokens (every position), then one decode step each.
std::vector<float> run_logits(const Model& m, const std::vector<int32_t>& tokens, int64_t prefill, ThreadPool& pool) {
  const auto n = static_cast<int64_t>(tokens.size());
  KvCache cache(m.config, n);
  std::vector<float> out(static_cast<size_t>(n * m.config.vocab));
  forward(m, cache, std::span(tokens).first(prefill), 0, out.data(), true, pool);
  for (int64_t i = prefill; i < n; ++i)
    forward(m, cache, std::span(&tokens[i], 1), i, out.data() + i * m.config.vocab, false, pool);
  return out;
}

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = d(rng);
  return t;
}

ModelConfig variant_config(int variant) {
  ModelConfig c = testing::tiny_config();
  if (variant == 1) c.rope_style = RopeStyle::interleaved;
  if (variant == 2) c.qkv_bias = true;
  if (variant == 3) {
    c.arch = "qwen3";  // q/k norms
    c.head_dim = 8;  // qwen3 sets head_dim apart from dim / n_heads
  }
  return c;
}

// 20 tokens: a prefill of 18 (one pass) and two decode steps.
TEST_F(CudaModelTest, DenseLogitsMatchCpuForEveryArchitectureFlag) {
  for (int variant = 0; variant < 4; ++variant) {
    const ModelConfig c = variant_config(variant);
    const auto cpu = testing::tiny_model(c, 7);
    auto gpu = testing::tiny_model(c, 7);
    use_device(*gpu, "cuda");
    const auto tokens = random_tokens(20, c.vocab, variant);
    const double err = relative_error(run_logits(*gpu, tokens, 18, pool), run_logits(*cpu, tokens, 18, pool));
    EXPECT_LT(err, 1e-4) << "variant " << variant;
  }
}

// A random model whose 2-D weights (embedding included) are stored in `codec_id`, for GPU/CPU comparisons.
std::unique_ptr<Model> encoded_model(const ModelConfig& c, const std::string& codec_id, const codec::Params& params,
                                     uint64_t seed) {
  const auto dense = testing::tiny_model(c, seed);
  const codec::Codec& codec = codec::codec_or_throw(codec_id, "test");
  auto storage = std::make_shared<std::vector<codec::EncodedTensor>>();
  storage->reserve(dense->tensors.size());
  ModelBuilder b;
  for (const NamedTensor& t : dense->tensors) {
    if (t.ref.shape.size() != 2) {
      b.add_f32(t.name, t.ref.shape, codec::decode_all(t.ref));
      continue;
    }
    const std::vector<float> w = codec::decode_all(t.ref);
    codec::EncodedTensor& e = storage->emplace_back(codec.encode(params, t.ref.shape, w.data(), {}));
    b.add(t.name, {&codec, e.params, t.ref.shape, e.views()});
  }
  b.keep_alive(storage);
  return b.finish(c, "encoded tiny");
}

ModelConfig wider_config() {
  ModelConfig c = testing::tiny_config();
  c.dim = 64;
  c.hidden_dim = 160;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.vocab = 96;
  return c;
}

TEST_F(CudaModelTest, Affine4LogitsMatchCpu) {
  const ModelConfig c = wider_config();
  const codec::Params affine4 = {{"bits", 4}, {"group_size", 32}, {"scale_dtype", "bf16"}};
  const auto cpu = encoded_model(c, "affine", affine4, 3);
  auto gpu = encoded_model(c, "affine", affine4, 3);
  use_device(*gpu, "cuda");
  const auto tokens = random_tokens(24, c.vocab, 11);
  EXPECT_LT(relative_error(run_logits(*gpu, tokens, 20, pool), run_logits(*cpu, tokens, 20, pool)), 1e-4);
}

// Trellis tensors keep their padded sizes in their parameters, so q/k/v do not stack and run as three matmuls.
TEST_F(CudaModelTest, TrellisLogitsMatchCpu) {
  const ModelConfig c = wider_config();
  const codec::Params trellis2 = {{"L", 12}, {"k", 2}, {"code", "1mad"}, {"rotate", "none"}};
  const auto cpu = encoded_model(c, "trellis", trellis2, 4);
  auto gpu = encoded_model(c, "trellis", trellis2, 4);
  use_device(*gpu, "cuda");
  const auto tokens = random_tokens(6, c.vocab, 12);
  EXPECT_LT(relative_error(run_logits(*gpu, tokens, 3, pool), run_logits(*cpu, tokens, 3, pool)), 1e-3);
}

// Logits of rows 0..batch-1 after one step.
std::vector<float> step_logits(CudaModel& gpu, std::span<const int32_t> tokens, std::span<const int32_t> pos,
                               std::span<const int32_t> slot) {
  gpu.step(tokens, pos, slot);
  std::vector<float> out(tokens.size() * gpu.config().vocab);
  gpu.download_logits(0, static_cast<int>(tokens.size()), out.data());
  return out;
}

TensorLookup lookup_of(const Model& m) {
  return [&m](const std::string& name) {
    const NamedTensor* t = m.find(name);
    return t ? &t->ref : nullptr;
  };
}

// Three sequences decoded side by side in one batch (slots 0..2) give each sequence's CPU logits; the replayed
// graph gives exactly what eager launches give.
TEST_F(CudaModelTest, BatchedDecodeMatchesCpuAndGraphReplayMatchesEager) {
  const ModelConfig c = wider_config();
  const auto cpu = testing::tiny_model(c, 5);
  constexpr int kBatch = 3, kSteps = 6;
  std::vector<std::vector<int32_t>> seqs;
  std::vector<std::vector<float>> expected;
  for (int b = 0; b < kBatch; ++b) {
    seqs.push_back(random_tokens(kSteps, c.vocab, 100 + b));
    expected.push_back(run_logits(*cpu, seqs.back(), 1, pool));
  }
  CudaModel graph(c, lookup_of(*cpu), {.max_batch = kBatch, .capacity = 16, .use_graphs = true});
  CudaModel eager(c, lookup_of(*cpu), {.max_batch = kBatch, .capacity = 16, .use_graphs = false});
  const std::vector<int32_t> slots{0, 1, 2};
  for (int s = 0; s < kSteps; ++s) {
    const std::vector<int32_t> tokens{seqs[0][s], seqs[1][s], seqs[2][s]}, pos(kBatch, s);
    const std::vector<float> g = step_logits(graph, tokens, pos, slots), e = step_logits(eager, tokens, pos, slots);
    EXPECT_EQ(g, e) << "step " << s;
    for (int b = 0; b < kBatch; ++b) {
      const std::vector<float> row(g.begin() + b * c.vocab, g.begin() + (b + 1) * c.vocab);
      const std::vector<float> want(expected[b].begin() + s * c.vocab, expected[b].begin() + (s + 1) * c.vocab);
      EXPECT_LT(relative_error(row, want), 1e-4) << "step " << s << " row " << b;
    }
  }
}

// A context long enough that the decode attention splits its positions over several blocks (the capacity of
// 400 allows 4 splits of at least 128 positions; 300 positions take 1, then 2, then 3 of them) and merges them:
// every step's logits still match the CPU's, and each step's replayed graph gives what eager launches give.
TEST_F(CudaModelTest, SplitAttentionOverLongContextMatchesCpu) {
  ModelConfig c = wider_config();
  c.max_seq = 512;
  const auto cpu = testing::tiny_model(c, 9);
  constexpr int kSteps = 300;
  const auto tokens = random_tokens(kSteps, c.vocab, 21);
  const std::vector<float> expected = run_logits(*cpu, tokens, 1, pool);
  ASSERT_EQ(kernels::cuda::attention_splits(400), 4);
  CudaModel graph(c, lookup_of(*cpu), {.max_batch = 1, .capacity = 400, .use_graphs = true});
  CudaModel eager(c, lookup_of(*cpu), {.max_batch = 1, .capacity = 400, .use_graphs = false});
  const std::vector<int32_t> slot{0};
  for (int s = 0; s < kSteps; ++s) {
    const std::vector<int32_t> token{tokens[s]}, pos{s};
    const std::vector<float> g = step_logits(graph, token, pos, slot), e = step_logits(eager, token, pos, slot);
    ASSERT_EQ(g, e) << "step " << s;
    const std::vector<float> want(expected.begin() + s * c.vocab, expected.begin() + (s + 1) * c.vocab);
    ASSERT_LT(relative_error(g, want), 1e-4) << "step " << s;
  }
}

// Head sizes of real models (64, 128, 256; the tests above use 4 to 16, one dim per lane), half and interleaved
// RoPE, q/k norm: 140 tokens as a prefill of 130 (one pass: the prefill attention's five tiles of 32 rows over up
// to five tiles of 32 keys, head_dim 256 in more than 48 KiB of shared memory) and 10 decode steps (prepare inside
// the decode attention kernel), so the decode attention runs several rounds per warp and, past 128 positions in a
// capacity of 256, two splits with their merge.
TEST_F(CudaModelTest, RealHeadSizesMatchCpu) {
  for (const int head_dim : {64, 128, 256}) {
    ModelConfig c = wider_config();
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.head_dim = head_dim;
    c.dim = 128;
    c.max_seq = 256;
    c.rope_style = head_dim == 128 ? RopeStyle::interleaved : RopeStyle::half;
    if (head_dim == 64) c.arch = "qwen3";  // q/k norms
    const auto cpu = testing::tiny_model(c, 17);
    auto gpu = testing::tiny_model(c, 17);
    use_device(*gpu, "cuda");
    const auto tokens = random_tokens(140, c.vocab, 31);
    EXPECT_LT(relative_error(run_logits(*gpu, tokens, 130, pool), run_logits(*cpu, tokens, 130, pool)), 1e-4)
        << "head_dim " << head_dim;
  }
}

// CudaModel::prefill in passes of 40 positions (a 90-token prompt: 40 + 40 + 10, so a pass has a partial tile of
// the attention's 32 rows and later passes attend over earlier passes' keys; every linear through
// CudaLinear::gemm) against the CPU forward, for dense f32, affine 4-bit and trellis 2-bit weights: every row's
// logits in slot 0, then decode steps after the prefill; in slot 1 the same prompt as two calls (positions 0..49
// without logits, then 50..89 from position 50) and only the last row's logits. Host outputs start as NaN, so a
// row left unwritten fails the bound.
TEST_F(CudaModelTest, PrefillPassesMatchCpu) {
  ModelConfig c = wider_config();
  c.max_seq = 128;
  const codec::Params affine4 = {{"bits", 4}, {"group_size", 32}, {"scale_dtype", "bf16"}};
  const codec::Params trellis2 = {{"L", 12}, {"k", 2}, {"code", "1mad"}, {"rotate", "none"}};
  struct Case {
    std::string name;
    std::unique_ptr<Model> model;
    double bound;
  };
  std::vector<Case> cases;
  cases.push_back({"dense", testing::tiny_model(c, 19), 1e-4});
  cases.push_back({"affine4", encoded_model(c, "affine", affine4, 20), 1e-4});
  cases.push_back({"trellis2", encoded_model(c, "trellis", trellis2, 21), 1e-3});
  constexpr int64_t kPrompt = 90, kSteps = 4, kSplit = 50;
  const int64_t vocab = c.vocab;
  const auto tokens = random_tokens(kPrompt + kSteps, vocab, 41);
  const std::span<const int32_t> prompt = std::span(tokens).first(kPrompt);
  for (const Case& t : cases) {
    const std::vector<float> want = run_logits(*t.model, tokens, kPrompt, pool);
    CudaModel gpu(c, lookup_of(*t.model), {.max_batch = 1, .prefill_rows = 40, .slots = 2, .capacity = 100});
    std::vector<float> got(want.size(), std::nanf(""));
    gpu.prefill(prompt, 0, 0, CudaModel::Logits::all, got.data());
    for (int64_t i = kPrompt; i < kPrompt + kSteps; ++i) {
      const std::vector<float> row = step_logits(gpu, std::span(&tokens[i], 1), std::vector{static_cast<int32_t>(i)},
                                                 std::vector<int32_t>{0});
      std::copy(row.begin(), row.end(), got.begin() + i * vocab);
    }
    EXPECT_LT(relative_error(got, want), t.bound) << t.name;
    std::vector<float> last(static_cast<size_t>(vocab), std::nanf(""));
    gpu.prefill(prompt.first(kSplit), 0, 1, CudaModel::Logits::none, nullptr);
    gpu.prefill(prompt.subspan(kSplit), kSplit, 1, CudaModel::Logits::last, last.data());
    const std::vector<float> want_last(want.begin() + (kPrompt - 1) * vocab, want.begin() + kPrompt * vocab);
    EXPECT_LT(relative_error(last, want_last), t.bound) << t.name << ", last row";
  }
}

// f16 and bf16 KV caches through decode steps and through a prefill (the prefill attention reads the stored type).
TEST_F(CudaModelTest, HalfPrecisionKvCacheStaysClose) {
  const ModelConfig c = wider_config();
  const auto cpu = testing::tiny_model(c, 9);
  const auto tokens = random_tokens(8, c.vocab, 3);
  const std::vector<float> want = run_logits(*cpu, tokens, 1, pool);
  for (const KvType kv : {KvType::f16, KvType::bf16}) {
    CudaModel gpu(c, lookup_of(*cpu), {.max_batch = 1, .slots = 2, .capacity = 8, .kv_type = kv});
    std::vector<float> got;
    for (int32_t i = 0; i < 8; ++i) {
      const std::vector<float> row = step_logits(gpu, std::span(&tokens[i], 1), std::vector<int32_t>{i}, std::vector<int32_t>{0});
      got.insert(got.end(), row.begin(), row.end());
    }
    EXPECT_LT(relative_error(got, want), 2e-2);
    std::vector<float> prefilled(want.size(), std::nanf(""));  // the same tokens as one prefill into slot 1
    gpu.prefill(tokens, 0, 1, CudaModel::Logits::all, prefilled.data());
    EXPECT_LT(relative_error(prefilled, want), 2e-2);
  }
}

// Greedy decoding on the device (argmax fed back without the host) follows the CPU's greedy tokens.
TEST_F(CudaModelTest, DeviceGreedyLoopMatchesCpuGreedy) {
  const ModelConfig c = wider_config();
  const auto cpu = testing::tiny_model(c, 13);
  constexpr int kSteps = 10;
  KvCache cache(c, kSteps + 1);
  std::vector<float> logits(static_cast<size_t>(c.vocab));
  std::vector<int32_t> want{7};
  for (int i = 0; i < kSteps; ++i) {
    forward(*cpu, cache, std::span(&want.back(), 1), i, logits.data(), false, pool);
    want.push_back(argmax(logits));
  }
  CudaModel gpu(c, lookup_of(*cpu), {.max_batch = 1, .capacity = kSteps + 1});
  gpu.set_rows(std::vector<int32_t>{7}, std::vector<int32_t>{0}, std::vector<int32_t>{0});
  gpu.decode_greedy(1, kSteps);
  std::vector<int32_t> last(1);
  gpu.download_tokens(1, last);
  EXPECT_EQ(last[0], want.back());
}

// The argmax split over several blocks per row (a vocabulary of 50000, float4 loads, and 20001, scalar loads)
// against the CPU's: the lowest id on ties, NaN never wins, the maximum in the last element found; with the
// greedy feedback, tokens take the winners and positions move on by one.
TEST_F(CudaModelTest, SplitArgmaxMatchesCpuArgmax) {
  namespace kc = kernels::cuda;
  constexpr int kBatch = 3;
  for (const int64_t vocab : {int64_t{50000}, int64_t{20001}}) {
    ASSERT_GT(kc::argmax_blocks(vocab), 1);
    std::mt19937_64 rng(static_cast<uint64_t>(vocab));
    std::uniform_real_distribution<float> d(-1.0f, 1.0f);
    std::vector<float> logits(static_cast<size_t>(kBatch * vocab));
    for (auto& v : logits) v = d(rng);
    logits[static_cast<size_t>(vocab - 7)] = 5.0f;  // row 0: a tie across blocks, the lower id wins
    logits[9000] = 5.0f;
    logits[static_cast<size_t>(2 * vocab - 1)] = 7.0f;  // row 1: the last element
    logits[static_cast<size_t>(2 * vocab + 123)] = std::nanf("");  // row 2: NaN among ordinary values
    std::vector<int32_t> want;
    want.reserve(kBatch);
    for (int b = 0; b < kBatch; ++b) want.push_back(argmax(std::span(logits).subspan(b * vocab, vocab)));
    ASSERT_EQ(want[0], 9000);
    const auto buffer = [](size_t bytes, const void* host) {
      kc::DeviceBuffer b(bytes);
      b.upload(host, bytes);
      return b;
    };
    const kc::DeviceBuffer dl = buffer(logits.size() * sizeof(float), logits.data());
    const size_t parts = static_cast<size_t>(kBatch) * static_cast<size_t>(kc::argmax_blocks(vocab));
    kc::DeviceBuffer values(parts * sizeof(float)), indices(parts * sizeof(int32_t)), counters(kBatch * 4), next(kBatch * 4);
    counters.fill(0);
    const std::vector<int32_t> pos0{5, 6, 7};
    kc::DeviceBuffer tokens(kBatch * 4);
    const kc::DeviceBuffer pos = buffer(kBatch * 4, pos0.data());
    const kc::ArgmaxScratch scratch{values.as<float>(), indices.as<int32_t>(), counters.as<uint32_t>()};
    for (int run = 0; run < 2; ++run) {  // the second run relies on the counters the first left at zero
      next.fill(0xFF);
      kc::launch_argmax(dl.as<float>(), vocab, kBatch, scratch, next.as<int32_t>(), tokens.as<int32_t>(),
                        pos.as<int32_t>(), nullptr);
      kc::check_last_error("argmax test");
      kc::synchronize("argmax test");
      std::vector<int32_t> got(kBatch), got_tokens(kBatch), got_pos(kBatch);
      next.download(got.data(), kBatch * 4);
      tokens.download(got_tokens.data(), kBatch * 4);
      pos.download(got_pos.data(), kBatch * 4);
      EXPECT_EQ(got, want) << "vocab " << vocab << " run " << run;
      EXPECT_EQ(got_tokens, want);
      for (int b = 0; b < kBatch; ++b) EXPECT_EQ(got_pos[b], pos0[b] + run + 1);
    }
  }
}

// A tiny model whose description is changed after loading to use the ops no built-in family of this branch has
// (family.h): the CPU interpreter runs `cpu` with its changed desc, the GPU a CudaModel of `gpu_desc` (the same
// description, or one with fused projections) over the model's tensors plus `extra`.
struct DescribedModel {
  std::unique_ptr<Model> cpu;
  ModelDesc gpu_desc;
  std::map<std::string, codec::TensorRef, std::less<>> extra;
  std::deque<std::vector<float>> storage;
  std::mt19937_64 rng{77};

  TensorLookup lookup() const {
    return [this](const std::string& name) -> const codec::TensorRef* {
      if (const auto it = extra.find(name); it != extra.end()) return &it->second;
      const NamedTensor* t = cpu->find(name);
      return t ? &t->ref : nullptr;
    };
  }

  // A new tensor extra[name] (and the CPU layer's vector of that role): uniform in offset + [-0.5, 0.5].
  void add_vector(int64_t layer, Role role, std::string_view name, Dim rows, float offset) {
    std::uniform_real_distribution<float> u(-0.5f, 0.5f);
    std::vector<float>& v = storage.emplace_back(static_cast<size_t>(dim_size(rows, cpu->config)));
    for (float& x : v) x = offset + u(rng);
    cpu->layers[static_cast<size_t>(layer)].vectors[static_cast<size_t>(role)] = v;
    cpu->desc.layers[static_cast<size_t>(layer)].tensors.push_back({role, name, name, rows});
    extra[hf_tensor_name(layer, cpu->desc.layers[static_cast<size_t>(layer)].tensors.back())] =
        dense_f32_ref({static_cast<int64_t>(v.size())}, v);
  }

  // The GPU description with q/k/v (gate/up) replaced by one fused tensor of their rows stacked, as a checkpoint
  // that stores them fused (phi3) describes them; the CPU keeps the parts.
  void fuse_on_gpu(Role fused, std::initializer_list<Role> parts, std::string_view name, Dim rows) {
    for (int64_t l = 0; l < cpu->config.n_layers; ++l) {
      LayerDesc& d = gpu_desc.layers[static_cast<size_t>(l)];
      std::vector<float>& stacked = storage.emplace_back();
      for (const Role r : parts) {
        const std::vector<float> part = codec::decode_all(cpu->find(hf_tensor_name(l, *d.find(r)))->ref);
        stacked.insert(stacked.end(), part.begin(), part.end());
      }
      std::erase_if(d.tensors, [&](const TensorSpec& t) {
        return std::find(parts.begin(), parts.end(), t.role) != parts.end();
      });
      d.tensors.push_back({fused, name, name, rows, Dim::dim});
      const Shape shape{dim_size(rows, cpu->config), cpu->config.dim};
      extra[hf_tensor_name(l, d.tensors.back())] = dense_f32_ref(shape, stacked);
    }
  }
};

// Gemma-shaped layers on a qwen3 tiny model (q/k norms): (1 + w) norms everywhere (head norms and the final norm
// too), post-norms of the attention and MLP outputs (norm h), GeGLU, a scaled embedding, per-layer attention
// scale, logit soft-capping in attention and on the output, a sliding window of 5 keys on layer 0, a second
// RoPE table (another base) with partial rotary on layer 1; on the GPU q/k/v and gate/up fused.
std::unique_ptr<DescribedModel> gemma_like(const ModelConfig& c, uint64_t seed) {
  auto m = std::make_unique<DescribedModel>();
  m->cpu = testing::tiny_model(c, seed);
  ModelDesc& d = m->cpu->desc;
  d.embed_scale = std::sqrt(static_cast<float>(c.dim));
  d.final_norm = NormKind::rms_unit_offset;
  d.final_softcap = 4.0f;
  const int64_t rope_dims = c.head_dim / 2;
  std::vector<float> second(static_cast<size_t>(rope_dims / 2));
  for (size_t i = 0; i < second.size(); ++i)
    second[i] = std::pow(1e6f, -2.0f * static_cast<float>(i) / static_cast<float>(rope_dims));
  d.rope_inv_freq.push_back(second);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    LayerDesc& layer = d.layers[static_cast<size_t>(l)];
    layer.norm = NormKind::rms_unit_offset;
    layer.activation = Activation::geglu_tanh;
    layer.attention.scale = 0.6f / std::sqrt(static_cast<float>(c.head_dim));
    layer.attention.softcap = 3.0f;
    layer.attention.window = l == 0 ? 5 : 0;
    if (l == 1) {
      layer.attention.rope = 1;
      layer.attention.rope_dims = rope_dims;
    }
    m->add_vector(l, Role::post_attn_norm, "post_attn_gain.weight", Dim::dim, 0.0f);
    m->add_vector(l, Role::post_ffn_norm, "post_ffn_gain.weight", Dim::dim, 0.0f);
    layer.ops = {{Op::Kind::norm, Reg::x, Role::attn_norm}, {Op::Kind::attention},
                 {Op::Kind::norm, Reg::h, Role::post_attn_norm}, {Op::Kind::add},
                 {Op::Kind::norm, Reg::x, Role::ffn_norm},        {Op::Kind::mlp},
                 {Op::Kind::norm, Reg::h, Role::post_ffn_norm},  {Op::Kind::add}};
  }
  m->gpu_desc = d;
  m->fuse_on_gpu(Role::qkv, {Role::q, Role::k, Role::v}, "fused_qkv.weight", Dim::qkv_dim);
  m->fuse_on_gpu(Role::gate_up, {Role::gate, Role::up}, "fused_gate_up.weight", Dim::gate_up_dim);
  return m;
}

// A speech-tower-shaped model on a llama tiny model with q/k/v biases: LayerNorms with biases (the final one
// too), a plain erf-GELU MLP (up with a bias, no gate), o and down biases.
std::unique_ptr<DescribedModel> layernorm_gelu(ModelConfig c, uint64_t seed) {
  c.qkv_bias = true;
  auto m = std::make_unique<DescribedModel>();
  m->cpu = testing::tiny_model(c, seed);
  ModelDesc& d = m->cpu->desc;
  d.final_norm = NormKind::layer;
  m->storage.emplace_back(static_cast<size_t>(c.dim));
  for (float& x : m->storage.back()) x = std::uniform_real_distribution<float>(-0.5f, 0.5f)(m->rng);
  m->cpu->final_norm_bias = m->storage.back();
  m->extra[std::string(kFinalNormBiasTensor)] = dense_f32_ref({c.dim}, m->storage.back());
  for (int64_t l = 0; l < c.n_layers; ++l) {
    LayerDesc& layer = d.layers[static_cast<size_t>(l)];
    layer.norm = NormKind::layer;
    layer.activation = Activation::gelu_erf;
    std::erase_if(layer.tensors, [](const TensorSpec& t) { return t.role == Role::gate; });
    m->add_vector(l, Role::attn_norm_bias, "attn_norm_bias.weight", Dim::dim, 0.0f);
    m->add_vector(l, Role::ffn_norm_bias, "ffn_norm_bias.weight", Dim::dim, 0.0f);
    m->add_vector(l, Role::o_bias, "o_bias.weight", Dim::dim, 0.0f);
    m->add_vector(l, Role::up_bias, "up_bias.weight", Dim::hidden, 0.0f);
    m->add_vector(l, Role::down_bias, "down_bias.weight", Dim::dim, 0.0f);
    layer.ops = {{Op::Kind::norm, Reg::x, Role::attn_norm, Role::attn_norm_bias}, {Op::Kind::attention},
                 {Op::Kind::add},
                 {Op::Kind::norm, Reg::x, Role::ffn_norm, Role::ffn_norm_bias},   {Op::Kind::mlp},
                 {Op::Kind::add}};
  }
  m->gpu_desc = d;
  return m;
}

// Prefill in passes of 7 positions (windows and soft-caps across pass boundaries), then decode steps, against
// the CPU interpreter; then three sequences decoded side by side from position 0 (batch 3, graph replay equal to
// eager launches) against each sequence's CPU logits.
void expect_described_model_matches_cpu(const DescribedModel& m, ThreadPool& pool) {
  const ModelConfig& c = m.cpu->config;
  constexpr int64_t kPrompt = 17, kSteps = 4;
  const auto tokens = random_tokens(kPrompt + kSteps, c.vocab, 5);
  const std::vector<float> want = run_logits(*m.cpu, tokens, kPrompt, pool);
  {
    CudaModel gpu(c, m.gpu_desc, m.lookup(), {.max_batch = 1, .prefill_rows = 7, .capacity = 32});
    std::vector<float> got(want.size(), std::nanf(""));
    gpu.prefill(std::span(tokens).first(kPrompt), 0, 0, CudaModel::Logits::all, got.data());
    for (int64_t i = kPrompt; i < kPrompt + kSteps; ++i) {
      const std::vector<float> row = step_logits(gpu, std::span(&tokens[i], 1), std::vector{static_cast<int32_t>(i)},
                                                 std::vector<int32_t>{0});
      std::copy(row.begin(), row.end(), got.begin() + i * c.vocab);
    }
    EXPECT_LT(relative_error(got, want), 1e-4) << "prefill and decode";
  }
  constexpr int kBatch = 3, kDecode = 9;  // past layer 0's window of 5
  std::vector<std::vector<int32_t>> seqs;
  std::vector<std::vector<float>> expected;
  for (int b = 0; b < kBatch; ++b) {
    seqs.push_back(random_tokens(kDecode, c.vocab, 200 + b));
    expected.push_back(run_logits(*m.cpu, seqs.back(), 1, pool));
  }
  CudaModel graph(c, m.gpu_desc, m.lookup(), {.max_batch = kBatch, .capacity = 16, .use_graphs = true});
  CudaModel eager(c, m.gpu_desc, m.lookup(), {.max_batch = kBatch, .capacity = 16, .use_graphs = false});
  const std::vector<int32_t> slots{0, 1, 2};
  for (int s = 0; s < kDecode; ++s) {
    const std::vector<int32_t> step_tokens{seqs[0][s], seqs[1][s], seqs[2][s]}, pos(kBatch, s);
    const std::vector<float> g = step_logits(graph, step_tokens, pos, slots);
    EXPECT_EQ(g, step_logits(eager, step_tokens, pos, slots)) << "step " << s;
    for (int b = 0; b < kBatch; ++b) {
      const std::vector<float> row(g.begin() + b * c.vocab, g.begin() + (b + 1) * c.vocab);
      const std::vector<float> w(expected[b].begin() + s * c.vocab, expected[b].begin() + (s + 1) * c.vocab);
      EXPECT_LT(relative_error(row, w), 1e-4) << "step " << s << " row " << b;
    }
  }
}

TEST_F(CudaModelTest, GemmaShapedOpsMatchCpuInterpreter) {
  ModelConfig c = wider_config();
  c.arch = "qwen3";  // q/k norms, which the (1 + w) kind then covers too
  const auto m = gemma_like(c, 23);
  // The capped logits stay inside the cap: the soft-cap ran (the CPU's too).
  std::vector<float> logits(static_cast<size_t>(c.vocab));
  KvCache cache(c, 1);
  forward(*m->cpu, cache, std::vector<int32_t>{3}, 0, logits.data(), false, pool);
  for (const float v : logits) ASSERT_LE(std::abs(v), 4.0f);
  expect_described_model_matches_cpu(*m, pool);
}

TEST_F(CudaModelTest, LayerNormGeluBiasesMatchCpuInterpreter) {
  expect_described_model_matches_cpu(*layernorm_gelu(wider_config(), 29), pool);
}

// The load refuses, naming the layer, an op list that reads the branch before writing it.
TEST_F(CudaModelTest, DescriptionReadingAnUnwrittenRegisterIsRefused) {
  const ModelConfig c = wider_config();
  const auto cpu = testing::tiny_model(c, 3);
  ModelDesc d = cpu->desc;
  d.layers[0].ops.erase(d.layers[0].ops.begin());  // the attention of h, which no op wrote yet
  try {
    CudaModel gpu(c, d, lookup_of(*cpu), {});
    FAIL() << "expected Errc::unsupported";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::unsupported);
    EXPECT_NE(std::string(e.what()).find("layer 0"), std::string::npos) << e.what();
  }
}

TEST_F(CudaModelTest, UnsupportedCodecNamesTheTensor) {
  const ModelConfig c = wider_config();
  const codec::Params trellis1 = {{"L", 8}, {"k", 1}, {"code", "1mad"}, {"rotate", "none"}};
  auto m = encoded_model(c, "trellis", trellis1, 2);
  try {
    kernels::cuda::prepare_cuda(m->find("model.layers.0.self_attn.q_proj.weight")->ref);
    GTEST_SKIP() << "trellis k 1 has a CUDA kernel now; nothing left to refuse";
  } catch (const Error& e) {
    ASSERT_EQ(e.code(), Errc::unsupported);
  }
  try {
    use_device(*m, "cuda");
    FAIL() << "expected Errc::unsupported";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::unsupported);
    EXPECT_NE(std::string(e.what()).find("tensor '"), std::string::npos) << e.what();
  }
}

fs::path stories_dir() {
  const char* env = std::getenv("LOWBIT_SHARED_DIR");
  return fs::path(env ? env : LOWBIT_SHARED_DIR) / "models" / "stories260K";
}

TEST_F(CudaModelTest, Stories260KGreedyTokensMatchCpu) {
  const fs::path bin = stories_dir() / "stories260K.bin";
  if (!fs::exists(bin)) GTEST_SKIP() << bin << " is absent (set LOWBIT_SHARED_DIR)";
  const auto cpu = load_model(bin);
  auto gpu = load_model(bin);
  use_device(*gpu, "cuda");
  const auto greedy = [&](const Model& m) {
    constexpr int64_t kSteps = 100;
    KvCache cache(m.config, kSteps + 4);
    std::vector<float> logits(static_cast<size_t>(m.config.vocab));
    std::vector<int32_t> tokens{1, 403, 407};  // BOS and two story tokens: a 3-token prefill, then decode
    forward(m, cache, tokens, 0, logits.data(), false, pool);
    for (int64_t i = 0; i < kSteps; ++i) {
      tokens.push_back(argmax(logits));
      forward(m, cache, std::span(&tokens.back(), 1), static_cast<int64_t>(tokens.size()) - 1, logits.data(), false,
              pool);
    }
    return tokens;
  };
  EXPECT_EQ(greedy(*gpu), greedy(*cpu));
}

// `lowbit quantize`'s presets give every tensor a codec with a CUDA kernel: stories260K quantized with trellis2
// (trellis linears with rotated inputs), trellis3 (5-bit affine embedding, tied, so also the head) and q4
// (offset-scale linears, 6-bit affine embedding) loads on the GPU and gives the CPU's logits. Plain rounding: the
// device layouts do not depend on how the codes were chosen.
TEST_F(CudaModelTest, Stories260KPresetArtifactsMatchCpu) {
  const fs::path dir = stories_dir();
  if (!fs::exists(dir / "stories260K.bin")) GTEST_SKIP() << dir << " is absent (set LOWBIT_SHARED_DIR)";
  for (const char* preset : {"trellis2", "trellis3", "q4"}) {
    SCOPED_TRACE(preset);
    quant::testing::TempDir tmp;
    quant::QuantizeOptions o;
    o.source = dir / "stories260K.bin";
    o.tokenizer = dir / "tok512.bin";
    o.destination = tmp.path / "artifact";
    o.recipe = quant::preset(preset);
    quant::quantize(o);
    const auto cpu = load_model(o.destination);
    auto gpu = load_model(o.destination);
    use_device(*gpu, "cuda");
    const auto tokens = random_tokens(24, cpu->config.vocab, 13);
    EXPECT_LT(relative_error(run_logits(*gpu, tokens, 20, pool), run_logits(*cpu, tokens, 20, pool)), 1e-3);
  }
}

// llama.cpp-made GGUF fixtures (tests/model/fixtures/gguf_quant/wide/) load their K-quant matrices packed: Q2_K's
// recipe mixes affine 2 and 3 bits in groups of 16 (Q2_K, Q3_K), 4 bits (Q4_K) and 6 bits in groups of 16 (Q6_K),
// Q4_K_M's 4 and 6 bits. On the GPU they give the CPU's logits, prefill (20 tokens: the groups of 16 run the matvec
// over chunks of rows) and decode steps.
TEST_F(CudaModelTest, GgufKQuantFixturesMatchCpu) {
  const fs::path wide = fs::path(LOWBIT_SOURCE_DIR) / "tests/model/fixtures/gguf_quant/wide";
  for (const char* type : {"Q2_K", "Q4_K_M"}) {
    SCOPED_TRACE(type);
    const fs::path path = wide / (std::string("model.") + type + ".gguf");
    const auto cpu = load_model(path);
    auto gpu = load_model(path);
    use_device(*gpu, "cuda");
    const auto tokens = random_tokens(24, cpu->config.vocab, 22);
    EXPECT_LT(relative_error(run_logits(*gpu, tokens, 20, pool), run_logits(*cpu, tokens, 20, pool)), 1e-3);
  }
}

}  // namespace
}  // namespace lowbit::model
