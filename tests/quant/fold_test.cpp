#include <gtest/gtest.h>

#include "lowbit/quant/fold.h"
#include "model/tiny_model.h"

namespace lowbit::quant {
namespace {

std::vector<std::vector<int32_t>> windows(int64_t vocab) {
  std::vector<int32_t> w;
  for (int64_t i = 0; i < 48; ++i) w.push_back(static_cast<int32_t>((i * 13 + 5) % vocab));
  return {w, std::vector<int32_t>(w.begin(), w.begin() + 20)};
}

model::ModelConfig config(bool tied, bool bias, bool qk_norm) {
  model::ModelConfig c = model::testing::tiny_config();
  c.dim = 32;
  c.head_dim = 8;
  c.tied_embeddings = tied;
  c.qkv_bias = bias;
  if (qk_norm) c.arch = "qwen3";
  return c;
}

TEST(Fold, KeepsTheFunctionAndRotatesTheWeights) {
  for (const auto& c : {config(false, false, false), config(true, false, false), config(false, true, true)}) {
    const auto source = model::testing::tiny_model(c, 9);
    const FoldResult f = fold_and_rotate(*source, 1234);
    const double kld = mean_kld(*source, *f.model, windows(c.vocab));
    EXPECT_LT(kld, 1e-6) << "tied " << c.tied_embeddings << " bias " << c.qkv_bias;
    EXPECT_EQ(f.model->config.tied_embeddings, false);
    EXPECT_EQ(!f.deviations.empty(), c.tied_embeddings);
    // Gains are folded away and the stream really is rotated: the embedding rows changed.
    const auto norm = codec::decode_all(f.model->find("model.norm.weight")->ref);
    for (float g : norm) EXPECT_EQ(g, 1.0f);
    const auto e0 = codec::decode_all(source->find("model.embed_tokens.weight")->ref);
    const auto e1 = codec::decode_all(f.model->find("model.embed_tokens.weight")->ref);
    EXPECT_NE(e0, e1);
  }
}

TEST(Fold, TheCheckSeesADifferentModel) {
  const auto c = config(false, false, false);
  const auto a = model::testing::tiny_model(c, 9);
  const auto b = model::testing::tiny_model(c, 10);
  EXPECT_GT(mean_kld(*a, *b, windows(c.vocab)), 1e-4);
}

}  // namespace
}  // namespace lowbit::quant
