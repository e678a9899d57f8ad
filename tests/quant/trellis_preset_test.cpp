#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "lowbit/codec/codec.h"
#include "lowbit/model/hf.h"
#include "lowbit/quant/fold.h"
#include "lowbit/quant/pipeline.h"
#include "model/tiny_model.h"

namespace lowbit::quant {
namespace {

namespace fs = std::filesystem;

// A model whose residual stream carries one massive channel that every RMSNorm gain removes (gain 0), as in
// SmolLM2: the normalized stream is dominated by that channel, which no linear ever sees.
std::unique_ptr<model::Model> massive_channel_model() {
  model::ModelConfig c = model::testing::tiny_config();
  c.dim = 64;
  c.head_dim = 16;
  c.hidden_dim = 128;
  c.vocab = 48;
  const auto base = model::testing::tiny_model(c, 5);
  model::ModelBuilder b;
  for (const auto& t : base->tensors) {
    std::vector<float> v = codec::decode_all(t.ref);
    if (t.name == "model.embed_tokens.weight")
      for (int64_t token = 0; token < c.vocab; ++token) v[token * c.dim] = 40.0f;
    if (t.name.ends_with("norm.weight")) v[0] = 0.0f;
    b.add_f32(t.name, t.ref.shape, std::move(v));
  }
  return b.finish(c, "massive");
}

double quantized_kld(const model::Model& source, const fs::path& src_dir, const fs::path& out, const Recipe& recipe) {
  QuantizeOptions o;
  o.source = src_dir;
  o.destination = out;
  o.recipe = recipe;
  quantize(o);
  std::vector<int32_t> tokens;
  for (int32_t i = 0; i < 64; ++i) tokens.push_back((i * 11 + 3) % static_cast<int32_t>(source.config.vocab));
  return mean_kld(source, *model::load_model(out), {tokens});
}

// Folding the gains into the linears would hand them the massive channel (scaled by ~0 in the weights, but
// spread over every column by the residual rotation and the trellis input rotation), and the quantization noise
// would grow with it. The trellis presets code the linears as they are and rely on the codec's own rotation.
TEST(TrellisPresets, KeepNormGainsOutOfTheLinears) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("lowbit-trellis-preset-{}", ::getpid());
  fs::create_directories(dir);
  const auto source = massive_channel_model();
  model::write_hf(*source, dir / "src");
  for (const char* name : {"trellis2", "trellis3", "trellis4"}) {
    const Recipe plain = preset(name);
    EXPECT_FALSE(plain.rotate) << name;
    Recipe folded = plain;
    folded.rotate = true;
    const double kld = quantized_kld(*source, dir / "src", dir / fmt::format("{}-plain", name), plain);
    const double kld_folded = quantized_kld(*source, dir / "src", dir / fmt::format("{}-folded", name), folded);
    EXPECT_LT(kld, 0.5 * kld_folded) << name << ": preset " << kld << ", with the fold " << kld_folded;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace lowbit::quant
