// Built-in recipes (docs/RECIPES.md). Patterns use Hugging Face tensor names; the embedding and the head are
// matched first so that the linears' default never reaches them.
#include <fmt/ranges.h>

#include <functional>
#include <map>

#include "lowbit/core/error.h"
#include "lowbit/quant/recipe.h"

namespace lowbit::quant {

namespace {

using nlohmann::json;

CodecChoice affine(int bits, int group = 64) {
  return {"affine", json{{"bits", bits}, {"group_size", group}, {"scale_dtype", "bf16"}}};
}
CodecChoice offset_scale(const char* precision) { return {"offset_scale", json{{"precision", precision}}}; }
CodecChoice two_plane() { return {"two_plane", json{{"storage", "quint5"}, {"metadata", "full"}}}; }
// L = 12: the CPU encoder runs about 16x faster than at L = 16 (docs/CODECS.md) for a small loss in MSE.
CodecChoice trellis(int k) { return {"trellis", json{{"L", 12}, {"k", k}, {"code", "3inst"}}}; }

// Embedding and head get their own codec; every other matrix the linears' codec. Alternatives of neighbouring
// widths are listed so that --target-bpw can trade bits between tensors. A speech model's audio encoder
// (qwen3_asr: model.audio_tower.*, model.multi_modal_projector.*) keeps 8-bit affine whatever the decoder takes.
Recipe linears_with_head(std::string name, CodecChoice head, std::vector<CodecChoice> linears, bool rotate = false) {
  Recipe r;
  r.name = std::move(name);
  r.rotate = rotate;
  r.rules.push_back({"model.audio_tower.*", {affine(8)}, std::nullopt});
  r.rules.push_back({"model.multi_modal_projector.*", {affine(8)}, std::nullopt});
  r.rules.push_back({"*embed_tokens.weight", {head}, std::nullopt});
  r.rules.push_back({"lm_head.weight", {head}, std::nullopt});
  r.fallback = {"*", std::move(linears), std::nullopt};
  return r;
}

// Two-plane's groups are 128 wide (seed 000); on a narrower or badly divided width its zero padding would cost
// more than 3-bit affine in groups of 64, which such matrices get instead.
Recipe fivestate() {
  Recipe r = linears_with_head("fivestate", affine(6), {two_plane(), affine(3)});
  r.fallback.padding_fallback = affine(3);
  return r;
}

// Trellis k 2 where it costs least, k 3 where the allocator measures the most error saved per byte, within 2.6
// bits per weight on the linears (issue 6's budget). SmolLM2 ties its head to the embedding, which gets 6-bit
// affine outside the linears' budget (docs/RECIPES.md, trellis2).
Recipe trellis2() {
  Recipe r = linears_with_head("trellis2", affine(6), {trellis(2), trellis(3)});
  r.target_linear_bpw = 2.6;
  return r;
}

const std::map<std::string, std::function<Recipe()>, std::less<>>& presets() {
  static const std::map<std::string, std::function<Recipe()>, std::less<>> table{
      {"affine4", [] { return linears_with_head("affine4", affine(4), {affine(4), affine(3), affine(5)}); }},
      {"affine3", [] { return linears_with_head("affine3", affine(4), {affine(3), affine(2), affine(4)}); }},
      {"q4", [] { return linears_with_head("q4", affine(6), {offset_scale("q4"), offset_scale("q3_full8")}); }},
      {"q3", [] { return linears_with_head("q3", affine(6), {offset_scale("q3_full8"), offset_scale("q4")}); }},
      {"fivestate", [] { return fivestate(); }},
      {"trellis2", [] { return trellis2(); }},
      {"trellis3", [] { return linears_with_head("trellis3", affine(5), {trellis(3), trellis(2), trellis(4)}); }},
      {"trellis4", [] { return linears_with_head("trellis4", affine(6), {trellis(4), trellis(3)}); }},
  };
  return table;
}

}  // namespace

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const auto& [name, make] : presets()) names.push_back(name);
  return names;
}

Recipe preset(std::string_view name) {
  const auto& table = presets();
  const auto it = table.find(name);
  if (it == table.end())
    fail(Errc::usage, "[quantize] unknown preset '{}' (known: {})", name, fmt::join(preset_names(), ", "));
  return it->second();
}

}  // namespace lowbit::quant
