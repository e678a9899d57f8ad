// Mixture-of-Experts families (issue 20). Their transformers fixtures (HF and GGUF) run in family_fixture_test.cpp
// with every family's; here: their 4-bit mlx-lm checkpoints (tests/model/fixtures/mlx, stacked switch_mlp experts)
// against mlx-lm's logits, one token at a time too; the
// description's expert tensors and dense layers; batching tokens per expert (a prefill's, or a decode step's rows of
// several sequences) equal to one token at a time; the
// refusals of MoE numbers that do not fit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>

#include "lowbit/core/error.h"
#include "lowbit/core/thread_pool.h"
#include "lowbit/io/safetensors.h"
#include "lowbit/model/family.h"
#include "lowbit/model/model.h"
#include "model/family_fixtures.h"
#include "model/tiny_model.h"

namespace lowbit::model {
namespace {

namespace fs = std::filesystem;

const fs::path kFixtures = fs::path(LOWBIT_SOURCE_DIR) / "tests/model/fixtures/families";

using testing::prefill_logits;
using testing::stepwise_logits;

// Greedy continuation of `tokens` for n steps, decoding one token at a time after the prefill.
std::vector<int32_t> greedy(const Model& m, const std::vector<int32_t>& tokens, size_t n, ThreadPool& pool) {
  KvCache cache(m.config, static_cast<int64_t>(tokens.size() + n));
  const auto vocab = static_cast<size_t>(m.config.vocab);
  std::vector<float> logits(vocab);
  forward(m, cache, tokens, 0, logits.data(), false, pool);
  std::vector<int32_t> out;
  for (size_t i = 0; i < n; ++i) {
    out.push_back(static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    forward(m, cache, std::span(&out.back(), 1), static_cast<int64_t>(tokens.size() + i), logits.data(), false, pool);
  }
  return out;
}

class MoeFixture : public ::testing::TestWithParam<const char*> {};

TEST_P(MoeFixture, MlxCheckpointMatchesMlxLm) {
  ThreadPool pool(2);
  const fs::path dir = fs::path(LOWBIT_SOURCE_DIR) / "tests/model/fixtures/mlx" / GetParam();
  const testing::FamilyExpected e = testing::read_family_expected(dir / "expected.safetensors");
  const std::vector<int32_t>& tokens = e.tokens;
  const std::vector<float>& expected = e.logits;
  const auto m = load_model(dir);
  EXPECT_EQ(m->config.arch, GetParam());
  // The stacked experts arrive as affine tensors of their own (gate, up) or dense ones (down: 16 columns are no
  // multiple of the group of 32).
  EXPECT_EQ(m->find("model.layers.1." + std::string(GetParam() == std::string("mixtral")
                                                        ? "block_sparse_moe.experts.2.w1.weight"
                                                        : "mlp.experts.2.gate_proj.weight"))->ref.codec->id,
            "affine");
  const double prefill = testing::max_relative_diff(prefill_logits(*m, tokens, pool), expected);
  const double stepwise = testing::max_relative_diff(stepwise_logits(*m, tokens, pool), expected);
  std::cout << "[ moe      ] mlx/" << GetParam() << ": max |logit diff| / max |logit| prefill " << prefill
            << ", one token at a time " << stepwise << "\n";
  EXPECT_LE(prefill, testing::kFamilyTolerance);
  // One token at a time runs the affine matvec, which rounds the activations to 16-bit integers per group
  // (block_kernels.h, kLargestX): measured 1.3e-4 on mixtral's logits here, against 1.3e-6 for the prefill's f32
  // matmul. Greedy must still agree exactly.
  EXPECT_LE(stepwise, 1e-3);
  EXPECT_EQ(greedy(*m, tokens, e.greedy.size(), pool), e.greedy);
}

INSTANTIATE_TEST_SUITE_P(Families, MoeFixture, ::testing::Values("qwen3_moe", "mixtral"));

nlohmann::json qwen3_moe_json() {
  return {{"model_type", "qwen3_moe"},   {"hidden_size", 32},        {"num_hidden_layers", 4},
          {"num_attention_heads", 4},    {"num_key_value_heads", 2}, {"head_dim", 8},
          {"intermediate_size", 48},     {"vocab_size", 64},         {"num_experts", 8},
          {"num_experts_per_tok", 3},    {"moe_intermediate_size", 16}, {"norm_topk_prob", false},
          {"decoder_sparse_step", 2},    {"mlp_only_layers", {3}}};
}

TEST(MoeDescription, ExpertsAreTensorsOfTheirOwnAndDenseLayersWhereTheConfigSays) {
  const ModelConfig c = parse_hf_config(qwen3_moe_json(), "cfg.json");
  // decoder_sparse_step 2: layers 1 and 3 are sparse, but 3 is in mlp_only_layers
  EXPECT_EQ(c.dense_layers, (std::vector<int64_t>{0, 2, 3}));
  const ModelDesc d = describe_model(c, "cfg.json");
  const LayerDesc& moe = d.layers[1];
  EXPECT_FALSE(moe.has(Role::gate));
  EXPECT_TRUE(moe.has(Role::router));
  EXPECT_EQ(moe.moe.n_experts, 8);
  EXPECT_EQ(moe.moe.top_k, 3);
  EXPECT_FALSE(moe.moe.renormalise);
  EXPECT_EQ(std::count_if(moe.tensors.begin(), moe.tensors.end(), [](const TensorSpec& t) { return t.expert >= 0; }),
            3 * 8);
  EXPECT_EQ(std::count_if(moe.ops.begin(), moe.ops.end(), [](const Op& op) { return op.kind == Op::Kind::moe; }), 1);
  EXPECT_TRUE(d.layers[3].has(Role::gate));
  EXPECT_FALSE(d.layers[3].has(Role::router));
  // An expert's HF name leads back to its spec, expert index included.
  const auto t = find_layer_tensor(d, "model.layers.1.mlp.experts.5.down_proj.weight");
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->spec->role, Role::expert_down);
  EXPECT_EQ(t->spec->expert, 5);
  EXPECT_EQ(dim_size(t->spec->cols, c), 16);
  EXPECT_FALSE(find_layer_tensor(d, "model.layers.1.mlp.experts.8.down_proj.weight").has_value());
  EXPECT_FALSE(find_layer_tensor(d, "model.layers.0.mlp.experts.0.down_proj.weight").has_value());
  // config.json written back describes the same model
  const ModelConfig back = parse_hf_config(config_to_hf_json(c), "back");
  EXPECT_EQ(back.dense_layers, c.dense_layers);
  EXPECT_EQ(back.n_experts_used, 3);
  EXPECT_EQ(back.expert_hidden_dim, 16);
  EXPECT_FALSE(back.norm_topk_prob);
}

TEST(MoeForward, ExpertsBatchedOverAPrefillEqualOneTokenAtATime) {
  ThreadPool pool(2);
  ModelConfig c = parse_hf_config(qwen3_moe_json(), "cfg.json");
  c.max_seq = 32;
  const auto m = testing::tiny_model(c, 7);
  std::vector<int32_t> tokens;
  for (int32_t i = 0; i < 12; ++i) tokens.push_back((i * 37 + 5) % 64);
  const auto prefill = prefill_logits(*m, tokens, pool);
  EXPECT_LE(testing::max_relative_diff(stepwise_logits(*m, tokens, pool), prefill), 1e-5);
  // The routing rule matters: renormalising the same experts' weights changes the logits.
  c.norm_topk_prob = true;
  ModelBuilder b;
  for (const NamedTensor& t : m->tensors) b.add(t.name, t.ref);
  b.keep_alive(std::shared_ptr<const void>(m.get(), [](const void*) {}));
  EXPECT_GT(testing::max_relative_diff(prefill_logits(*b.finish(c, "renormalised"), tokens, pool), prefill), 1e-3);
}

TEST(MoeForward, DecodeRowsTogetherEqualEachAlone) {
  ThreadPool pool(2);
  ModelConfig c = parse_hf_config(qwen3_moe_json(), "cfg.json");
  c.max_seq = 32;
  const auto m = testing::tiny_model(c, 11);
  // six sequences, so that an expert gets several rows of a step and some none
  std::vector<std::vector<int32_t>> prompts;
  for (int32_t i = 0; i < 6; ++i)
    prompts.push_back(std::vector<int32_t>(static_cast<size_t>(1 + 2 * i), (i * 13 + 3) % 64));
  const testing::RowsAndAlone r = testing::decode_rows_and_alone(*m, prompts, 4, pool);
  EXPECT_LE(testing::max_relative_diff(r.rows, r.alone), 1e-5);
}

TEST(MoeConfig, NumbersThatDoNotFitAreRefusedNamingTheField) {
  const auto refused = [](nlohmann::json hf, const char* field) {
    Errc code{};
    std::string what = "no error";
    try {
      parse_hf_config(hf, "cfg.json");
    } catch (const Error& e) {
      code = e.code();
      what = e.what();
    }
    EXPECT_EQ(exit_code(code), 3) << what;
    EXPECT_NE(what.find(field), std::string::npos) << what;
    EXPECT_NE(what.find("cfg.json"), std::string::npos) << what;
  };
  nlohmann::json hf = qwen3_moe_json();
  hf["num_experts_per_tok"] = 9;
  refused(hf, "num_experts_per_tok");
  hf = qwen3_moe_json();
  hf["mlp_only_layers"] = {4};
  refused(hf, "mlp_only_layers");
  hf = qwen3_moe_json();
  hf.erase("num_experts");
  refused(hf, "num_experts");
  hf = qwen3_moe_json();
  hf["decoder_sparse_step"] = 0;
  refused(hf, "decoder_sparse_step");
}

}  // namespace
}  // namespace lowbit::model
