// Quantizing a Mixture-of-Experts model (issue 20): the norm fold and rotation keep its function (the ffn norm's
// gain folds into the router and every expert), every expert is a tensor of its own for the recipe, and each
// expert calibrates on the tokens routed to it, or is rounded plainly when they are fewer than its width, as the
// report records per tensor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "lowbit/core/thread_pool.h"
#include "lowbit/model/family.h"
#include "lowbit/model/hf.h"
#include "lowbit/model/model.h"
#include "lowbit/quant/fold.h"
#include "lowbit/quant/pipeline.h"
#include "lowbit/quant/recipe.h"
#include "model/tiny_model.h"
#include "quant/quant_fixture.h"

namespace lowbit::quant {
namespace {

namespace fs = std::filesystem;

// Three layers: 0 and 2 MoE (8 experts, top 2, renormalised), 1 dense (mlp_only_layers).
model::ModelConfig moe_config(int64_t vocab) {
  const nlohmann::json hf = {{"model_type", "qwen3_moe"},  {"hidden_size", 64},       {"num_hidden_layers", 3},
                             {"num_attention_heads", 4},   {"num_key_value_heads", 2}, {"head_dim", 16},
                             {"intermediate_size", 64},    {"vocab_size", vocab},     {"num_experts", 8},
                             {"num_experts_per_tok", 2},   {"moe_intermediate_size", 32},
                             {"norm_topk_prob", true},     {"mlp_only_layers", {1}},  {"max_position_embeddings", 256}};
  return model::parse_hf_config(hf, "moe");
}

std::vector<std::vector<int32_t>> windows(int64_t vocab) {
  std::vector<int32_t> w;
  for (int64_t i = 0; i < 48; ++i) w.push_back(static_cast<int32_t>((i * 13 + 5) % vocab));
  return {w, std::vector<int32_t>(w.begin(), w.begin() + 20)};
}

TEST(MoeQuant, FoldAndRotationKeepTheFunction) {
  const model::ModelConfig c = moe_config(96);
  const auto source = model::testing::tiny_model(c, 5);
  const FoldResult f = fold_and_rotate(*source, 77);
  EXPECT_LT(mean_kld(*source, *f.model, windows(c.vocab)), 1e-6);
  // the experts really were rotated
  const std::string expert = "model.layers.0.mlp.experts.3.up_proj.weight";
  EXPECT_NE(codec::decode_all(source->find(expert)->ref), codec::decode_all(f.model->find(expert)->ref));
}

TEST(MoeQuant, EachExpertCalibratesOnItsRoutedTokensOrIsRoundedPlainly) {
  const fs::path shared = fs::path(LOWBIT_SHARED_DIR);
  const fs::path tokenizer = shared / "models/stories260K/tok512.bin";
  const fs::path text = shared / "data/tinystories-valid-excerpt.txt";
  if (!fs::exists(tokenizer) || !fs::exists(text))
    GTEST_SKIP() << "stories260K's tokenizer or the TinyStories excerpt absent (../shared not mounted)";
  const model::ModelConfig c = moe_config(512);
  testing::TempDir tmp;
  model::write_hf(*model::testing::tiny_model(c, 5), tmp.path / "src");
  for (const char* preset_name : {"affine4", "trellis2"}) {
    SCOPED_TRACE(preset_name);
    QuantizeOptions o;
    o.source = tmp.path / "src";
    o.destination = tmp.path / preset_name;
    o.tokenizer = tokenizer;
    o.recipe = preset(preset_name);
    o.calibration = text;
    o.calib_tokens = 256;
    o.calib_ctx = 64;
    const QuantizeReport r = quantize(o);
    size_t experts = 0, calibrated = 0, rounded = 0;
    int64_t routed_to_layer0 = 0;
    for (const TensorReport& t : r.tensors) {
      if (t.name.find(".experts.") != std::string::npos) {
        ++experts;
        EXPECT_NE(t.choice.codec, "dense") << t.name;
        EXPECT_EQ(t.method == "rtn", t.calibration_rows < t.shape[1]) << t.name << ": " << t.calibration_rows;
        (t.method == "rtn" ? rounded : calibrated) += 1;
        if (t.name.starts_with("model.layers.0.") && t.name.ends_with("up_proj.weight"))
          routed_to_layer0 += t.calibration_rows;
      } else if (t.name.ends_with("q_proj.weight") || t.name.ends_with("mlp.gate.weight") ||
                 t.name.ends_with("mlp.down_proj.weight")) {
        EXPECT_NE(t.method, "rtn") << t.name << " (shared Hessians still apply outside the experts)";
      }
    }
    EXPECT_EQ(experts, 2u * 8u * 3u);
    // Every calibration token reached exactly top-k = 2 experts of layer 0.
    EXPECT_EQ(routed_to_layer0, 2 * r.calibration_tokens);
    std::cout << "[ moe      ] " << preset_name << ": " << calibrated << " expert tensors calibrated, " << rounded
              << " rounded plainly (too few routed tokens)\n";
    // The artifact loads as the same family and runs. (How close it stays to the source says little here: a tiny
    // random model loses as much to rounding in its dense form.)
    const auto q = model::load_model(o.destination);
    EXPECT_EQ(q->config.arch, "qwen3_moe");
    EXPECT_EQ(q->config.dense_layers, c.dense_layers);
    EXPECT_TRUE(std::isfinite(mean_kld(*model::load_model(o.source), *q, windows(c.vocab))));
  }
}

}  // namespace
}  // namespace lowbit::quant
