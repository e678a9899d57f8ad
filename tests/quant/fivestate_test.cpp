// The fivestate preset: GPTQ through the two-plane codec's column quantizer (seed 000 with seed 003's
// Hessian-aware rounding), and its fallback for widths two-plane's 128-wide groups would pad.
#include <gtest/gtest.h>

#include <random>

#include "lowbit/codec/codec.h"
#include "lowbit/quant/gptq.h"
#include "lowbit/quant/recipe.h"

namespace lowbit::quant {
namespace {

// H of inputs mixed from a few latent factors (far from diagonal, where error feedback pays), and weights.
struct CorrelatedProblem {
  Shape shape;
  std::vector<float> w;
  Hessian h;
};

CorrelatedProblem correlated_problem(int64_t rows, int64_t cols, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n01;
  CorrelatedProblem p{{rows, cols}, std::vector<float>(static_cast<size_t>(rows * cols)), Hessian{cols, {}, 0}};
  for (auto& v : p.w) v = 0.02f * n01(rng);
  constexpr int64_t kTokens = 384, kFactors = 6;
  std::vector<float> mix(kFactors * cols), x(static_cast<size_t>(kTokens * cols));
  for (auto& v : mix) v = n01(rng);
  for (int64_t t = 0; t < kTokens; ++t) {
    float f[kFactors];
    for (auto& v : f) v = n01(rng);
    for (int64_t c = 0; c < cols; ++c) {
      float s = 0.1f * n01(rng);
      for (int64_t k = 0; k < kFactors; ++k) s += f[k] * mix[k * cols + c];
      x[t * cols + c] = s;
    }
  }
  p.h.add(x.data(), kTokens, cols);
  return p;
}

TEST(TwoPlaneGptq, BeatsPlainRoundingInBothMetadataVariants) {
  const codec::Codec& two_plane = codec::codec_or_throw("two_plane", "test");
  ASSERT_NE(two_plane.quantize_column, nullptr);
  const CorrelatedProblem p = correlated_problem(16, 256, 5);
  for (const char* metadata : {"full", "slim"})
    for (const char* storage : {"planes", "quint5"}) {
      const codec::Params params{{"storage", storage}, {"metadata", metadata}};
      const RoundingResult r = gptq_quantize(two_plane, params, p.shape, p.w.data(), p.h, GptqOptions{});
      EXPECT_FALSE(r.guard_tripped) << metadata << " " << storage;
      EXPECT_LT(r.loss, 0.9 * r.rtn_loss) << metadata << " " << storage << ": GPTQ " << r.loss << " RTN " << r.rtn_loss;
      // What was stored is valid and is what the reported loss measures.
      const codec::TensorRef stored{&two_plane, r.tensor.params, p.shape, r.tensor.views()};
      ASSERT_NO_THROW(codec::validate_tensor(stored, "gptq"));
      EXPECT_NEAR(hessian_loss(p.w, codec::decode_all(stored), 16, p.h), r.loss, 1e-6 * r.loss);
    }
}

TEST(Fivestate, NarrowOrBadlyDividedWidthsFallBackToAffine) {
  const Recipe r = preset("fivestate");
  const auto codec_of = [&](const char* name, Shape shape) { return r.choose(name, shape).codec; };
  EXPECT_EQ(codec_of("model.layers.0.mlp.down_proj.weight", {576, 1536}), "two_plane");
  EXPECT_EQ(codec_of("model.layers.0.self_attn.q_proj.weight", {576, 576}), "two_plane");  // pads 576 to 640
  EXPECT_EQ(codec_of("model.layers.0.self_attn.q_proj.weight", {64, 64}), "affine");       // stories260K
  EXPECT_EQ(codec_of("model.layers.0.mlp.down_proj.weight", {64, 172}), "affine");
  EXPECT_EQ(codec_of("lm_head.weight", {512, 64}), "affine");
  // The fallback survives the recipe's round trip through the artifact's provenance.
  const Recipe back = Recipe::from_json(r.to_json(), "test");
  ASSERT_TRUE(back.fallback.padding_fallback.has_value());
  EXPECT_EQ(*back.fallback.padding_fallback, *r.fallback.padding_fallback);
  EXPECT_EQ(back.choose("model.layers.0.mlp.up_proj.weight", {172, 64}).codec, "affine");
}

}  // namespace
}  // namespace lowbit::quant
