// The artifact's records about the model (docs/FORMAT.md): the quality report (`quality.json`, role "quality") and
// the recipe (`recipe.json`, role "recipe"). They are files of the manifest like any other, so their bytes are
// covered by its SHA-256s, and their content is parsed strictly: every key known, every number finite, every
// tensor named one of the manifest's, and every fact they restate (shape, codec, bytes, bits per weight, totals,
// the artifact's size, seeds) equal to what the manifest and the codecs say. A failure is a lowbit::Error naming the
// file and the field (exit 3).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string_view>

#include "lowbit/artifact/manifest.h"

namespace lowbit::artifact {

inline constexpr std::string_view kQualityFileName = "quality.json";
inline constexpr std::string_view kRecipeFileName = "recipe.json";
inline constexpr uint64_t kMaxRecordBytes = 64ull << 20;

// quality.json: {"quantize": <the quantizer's report>}. `artifact_bytes` is the artifact's whole size (every file
// and the manifest), which the report restates. Returns the parsed document.
nlohmann::json check_quality(std::string_view text, const Manifest& manifest, uint64_t artifact_bytes,
                             std::string_view source);

// recipe.json: {"quantize": <the recipe quantize used>} or {"import": <what a foreign format's loader verified>}.
// Returns the parsed document.
nlohmann::json check_recipe(std::string_view text, const Manifest& manifest, std::string_view source);

}  // namespace lowbit::artifact
