#include <gtest/gtest.h>

#include "lowbit/core/error.h"
#include "lowbit/quant/recipe.h"

namespace lowbit::quant {
namespace {

using nlohmann::json;

TEST(Glob, Matches) {
  EXPECT_TRUE(glob_match("*", ""));
  EXPECT_TRUE(glob_match("*.mlp.*", "model.layers.3.mlp.down_proj.weight"));
  EXPECT_FALSE(glob_match("*.mlp.*", "model.layers.3.self_attn.q_proj.weight"));
  EXPECT_TRUE(glob_match("model.layers.?.mlp*", "model.layers.7.mlp.up_proj.weight"));
  EXPECT_FALSE(glob_match("model.layers.?.mlp*", "model.layers.17.mlp.up_proj.weight"));
  EXPECT_TRUE(glob_match("a*b*c", "aXbYbZc"));
  EXPECT_FALSE(glob_match("a*b*c", "aXbYbZ"));
}

TEST(Recipe, FirstMatchWinsThenDefault) {
  const json j = {
      {"name", "t"},
      {"rules", {{{"match", "*down_proj*"}, {"codec", "affine"}, {"params", {{"bits", 6}, {"group_size", 64}, {"scale_dtype", "f16"}}}},
                 {{"match", "*mlp*"}, {"codec", "affine"}, {"params", {{"bits", 3}, {"group_size", 64}, {"scale_dtype", "f16"}}}}}},
      {"default", {{"codec", "affine"}, {"params", {{"bits", 4}, {"group_size", 128}, {"scale_dtype", "f16"}}}}}};
  const Recipe r = Recipe::from_json(j, "test");
  EXPECT_EQ(r.choose("model.layers.0.mlp.down_proj.weight", {64, 128}).params["bits"], 6);
  EXPECT_EQ(r.choose("model.layers.0.mlp.up_proj.weight", {64, 128}).params["bits"], 3);
  EXPECT_EQ(r.choose("model.layers.0.self_attn.q_proj.weight", {64, 128}).params["bits"], 4);
  EXPECT_EQ(r.choose("model.norm.weight", {64}), dense_f32()) << "vectors stay dense";
  const Recipe again = Recipe::from_json(r.to_json(), "round trip");
  EXPECT_EQ(again.to_json(), r.to_json());
}

// The allocator's candidates follow the padding fallback as choose() does: where the first candidate would pad
// into more bits per weight than the fallback, the fallback takes its place (once, not also further on).
TEST(Recipe, CandidatesPutThePaddingFallbackInPlaceOfThePaddedFirst) {
  const json affine3 = {{"codec", "affine"}, {"params", {{"bits", 3}, {"group_size", 64}, {"scale_dtype", "bf16"}}}};
  const json affine4 = {{"codec", "affine"}, {"params", {{"bits", 4}, {"group_size", 64}, {"scale_dtype", "bf16"}}}};
  const json two_plane = {{"codec", "two_plane"}, {"params", {{"storage", "quint5"}, {"metadata", "full"}}}};
  const Recipe r = Recipe::from_json(
      {{"default", {{"candidates", {two_plane, affine4, affine3}}, {"padding_fallback", affine3}}}}, "test");
  const auto codecs = [&](Shape shape) {
    std::vector<std::string> out;
    for (const CodecChoice& c : r.candidates("model.layers.0.mlp.up_proj.weight", shape))
      out.push_back(c.codec + std::to_string(c.params.value("bits", 0)));
    return out;
  };
  EXPECT_EQ(codecs({576, 1536}), (std::vector<std::string>{"two_plane0", "affine4", "affine3"}));
  EXPECT_EQ(codecs({64, 64}), (std::vector<std::string>{"affine3", "affine4"}));
  EXPECT_EQ(r.choose("model.layers.0.mlp.up_proj.weight", {64, 64}).codec, "affine");
  EXPECT_EQ(r.candidates("model.norm.weight", {64}), std::vector<CodecChoice>{dense_f32()});
}

Errc rejection(const json& j) {
  try {
    Recipe::from_json(j, "bad");
  } catch (const Error& e) {
    return e.code();
  }
  return Errc::internal;
}

TEST(Recipe, RejectsMalformedRecipes) {
  const json good_default = {{"codec", "dense"}, {"params", {{"dtype", "f16"}}}};
  EXPECT_EQ(rejection({{"rules", json::array()}}), Errc::format) << "default missing";
  EXPECT_EQ(rejection({{"default", good_default}, {"extra", 1}}), Errc::format);
  EXPECT_EQ(rejection({{"default", {{"codec", "nope"}}}}), Errc::unknown_codec);
  EXPECT_EQ(rejection({{"default", {{"codec", "affine"}, {"params", {{"bits", 7}, {"group_size", 64}}}}}}),
            Errc::codec_params);
  EXPECT_EQ(rejection({{"default", good_default}, {"rules", {{{"codec", "dense"}}}}}), Errc::format)
      << "rule without match";
  EXPECT_EQ(rejection({{"default", good_default}, {"rules", {{{"match", "*"}}}}}), Errc::format)
      << "rule without codec";
  EXPECT_EQ(rejection({{"default", good_default}, {"target_linear_bits_per_weight", 0}}), Errc::format);
  EXPECT_EQ(rejection({{"default", good_default}, {"target_linear_bits_per_weight", "2.6"}}), Errc::format);
}

TEST(Recipe, CarriesATargetForTheLinears) {
  const json j = {{"default", {{"codec", "dense"}, {"params", {{"dtype", "f16"}}}}},
                  {"target_linear_bits_per_weight", 2.5}};
  const Recipe r = Recipe::from_json(j, "t");
  ASSERT_TRUE(r.target_linear_bpw);
  EXPECT_EQ(*r.target_linear_bpw, 2.5);
  EXPECT_EQ(Recipe::from_json(r.to_json(), "t").target_linear_bpw, r.target_linear_bpw);
  EXPECT_FALSE(Recipe::from_json({{"default", j["default"]}}, "t").target_linear_bpw);
}

TEST(Presets, AllParseAndKnowTheirCodecs) {
  const auto names = preset_names();
  for (const char* required : {"affine4", "affine3", "q4", "q3", "fivestate", "trellis2", "trellis3", "trellis4"})
    EXPECT_NE(std::find(names.begin(), names.end(), required), names.end()) << required;
  for (const auto& name : names) {
    const Recipe r = preset(name);
    // Every preset survives its own serialization, which validates every candidate's params.
    EXPECT_EQ(Recipe::from_json(r.to_json(), name).to_json(), r.to_json()) << name;
  }
  EXPECT_EQ(preset("trellis2").choose("model.layers.1.mlp.gate_proj.weight", {64, 256}).codec, "trellis");
  EXPECT_EQ(preset("trellis2").choose("model.embed_tokens.weight", {512, 64}).codec, "affine");
  EXPECT_EQ(preset("trellis2").target_linear_bpw, 2.6) << "issue 6's budget on the linears";
  EXPECT_FALSE(preset("trellis3").target_linear_bpw);
  try {
    preset("affine9");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::usage);
  }
}

}  // namespace
}  // namespace lowbit::quant
