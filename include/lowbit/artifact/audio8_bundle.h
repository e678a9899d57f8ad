// audio8 mixed bundles (seed 001; docs/FORMAT.md, "Foreign formats"): a directory holding `manifest.json` and one
// payload file of contiguous tensor records, dense (BF16/F16/F32) or packed (q3, q3_full8, q4: LSB-first code rows
// then F16 scales, group 64, implied bias). Opening one applies every rule of the seed's loader; packed records
// map onto lowbit's offset_scale codec (the same bits: zero copy) and dense records onto the dense codec. The
// writer turns a lowbit artifact back into a bundle so round trips can be tested.
#pragma once

#include <filesystem>
#include <string_view>

#include "lowbit/artifact/foreign.h"

namespace lowbit::artifact {
class Artifact;
}

namespace lowbit::artifact::audio8 {

inline constexpr std::string_view kFormatV1 = "audio8-mixed-bundle-v1";
inline constexpr std::string_view kFormatV2 = "audio8-mixed-bundle-v2";
// A v2 bundle whose q4 records were calibrated (GPTQ) over an uncalibrated parent bundle, with a provenance block
// that is verified (docs/FORMAT.md lists exactly what).
inline constexpr std::string_view kFormatCalibratedQ4 = "audio8-calibrated-q4-gptq-v1";

inline constexpr std::string_view kManifestName = "manifest.json";
inline constexpr std::string_view kConfigName = "config.json";  // optional, beside the manifest
// The language model's tensors carry this prefix in a bundle; lowbit names them without it (HF names).
inline constexpr std::string_view kLanguageModelPrefix = "language_model.";

// True when `dir`/manifest.json is a JSON object whose "format" is one of the three above (reads a bounded amount;
// never throws).
bool recognizes(const std::filesystem::path& dir);

// Opens and verifies a bundle; throws lowbit::Error naming the file, the record and the field of the first
// violated rule.
ForeignModel open(const std::filesystem::path& dir, const ForeignOpenOptions& options);


struct ExportOptions {
  std::string_view format = kFormatV2;  // kFormatV1 or kFormatV2
  bool force = false;                   // replace an existing directory at the destination
};

// Writes `art` as a bundle at `out` (staged beside it, then renamed into place): dense tensors as "original"
// records, offset_scale tensors as packed records with their codes and scales unchanged, affine 3/4-bit group-64
// tensors whose biases are exactly -offset x scale as the packed precision of that offset. Refuses, naming the
// tensor, anything else. The artifact's config (and tokenizer files) go beside the manifest, the config declared
// by hash under external_assets_not_included.
void export_bundle(const Artifact& art, const std::filesystem::path& out, const ExportOptions& options = {});

}  // namespace lowbit::artifact::audio8
