// Recipes: ordered rules from tensor-name patterns to a codec and its parameters; the first matching rule
// wins, then the default (seed 002's per-tensor recipe). A rule may list several candidates, from which the
// target-bits allocator picks one per tensor. Tensors that are not matrices (norm gains, biases) are always
// stored dense f32: no quantized codec applies to them.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lowbit/codec/codec.h"

namespace lowbit::quant {

struct CodecChoice {
  std::string codec;
  codec::Params params;
  bool operator==(const CodecChoice&) const = default;
};

struct RecipeRule {
  std::string pattern;                  // glob over the tensor name: '*' any run of characters, '?' one
  std::vector<CodecChoice> candidates;  // first is the choice without --target-bpw
  // Used instead of the first candidate on a matrix where that candidate would take more bits per weight than
  // this one: a width its fixed groups do not divide is zero-padded (two_plane's 128-wide groups on a 64-wide
  // row double its storage).
  std::optional<CodecChoice> padding_fallback;
};

struct Recipe {
  std::string name;
  bool rotate = false;  // fold norms and rotate the residual stream before quantizing (quant/fold.h)
  std::vector<RecipeRule> rules;
  RecipeRule fallback;  // the default; its pattern is "*"
  // Bits per weight on the layers' linears that the allocator fits when the command line gives no target
  // (--target-bpw / --target-linear-bpw); none: every tensor takes its first candidate.
  std::optional<double> target_linear_bpw;

  // The rule a tensor falls under (first match wins, else the default). `shape` decides the dense override.
  const RecipeRule& rule_for(std::string_view tensor_name) const;
  // What a tensor may be stored as, the choice without an allocator first: its rule's candidates, with the
  // padding fallback in place of the first where it applies on this shape (and not repeated further on); dense
  // f32 for a tensor that is not a matrix. The target-bits allocator picks among these.
  std::vector<CodecChoice> candidates(std::string_view tensor_name, const Shape& shape) const;
  // The codec used for a tensor when no allocator is involved: the first of candidates().
  CodecChoice choose(std::string_view tensor_name, const Shape& shape) const;

  nlohmann::json to_json() const;
  // Strict parse: unknown keys, unknown codecs and invalid params are rejected (Errc::format, unknown_codec,
  // codec_params), naming `source` and the rule index.
  static Recipe from_json(const nlohmann::json& j, std::string_view source);
  static Recipe load(const std::filesystem::path& path);
};

bool glob_match(std::string_view pattern, std::string_view text);

// The dense choice every non-matrix tensor gets.
CodecChoice dense_f32();

// Built-in presets by name (docs/RECIPES.md); Errc::usage for an unknown name, listing the known ones.
Recipe preset(std::string_view name);
std::vector<std::string> preset_names();

}  // namespace lowbit::quant
