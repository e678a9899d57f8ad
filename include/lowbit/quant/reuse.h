// --reuse ART...: earlier artifacts of the same source, whose stored tensors are copied into a new artifact instead
// of being encoded again wherever the recipe's choice for a tensor is what an artifact already stores (seed 003's
// variant bank: e.g. a --target-bpw mix of trellis2 and trellis3 takes its tensors from a trellis2 and a trellis3
// artifact). The copy is recorded in the new artifact's provenance (reuse_source_name).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lowbit/artifact/manifest.h"
#include "lowbit/artifact/reader.h"
#include "lowbit/codec/codec.h"
#include "lowbit/quant/recipe.h"

namespace lowbit::quant {

// The provenance.sources entry that records artifact `dir`'s manifest.json as an input: "reuse/<dir's name>/
// manifest.json". A checkpoint's own files are listed by file name, so a name with a '/' is always such an entry.
std::string reuse_source_name(const std::filesystem::path& dir);

class ReuseBank {
 public:
  // Opens every artifact (hash-checked). Each must come from the same source files with the same seeds and
  // calibration text as `expected` (its reuse entries aside): otherwise its tensors were made from other weights,
  // and Errc::unsupported names the artifact and the provenance field that differs.
  ReuseBank(const std::vector<std::filesystem::path>& artifacts, const artifact::Provenance& expected);

  // A copy of tensor `name` from the first artifact that stores it with this shape and codec and with params
  // that hold every key of choice.params at the same value (the rest are what the encoder derives: padding,
  // seeds, defaults); nullopt when none does.
  std::optional<codec::EncodedTensor> take(std::string_view name, const Shape& shape, const CodecChoice& choice);

  // provenance.sources entries for the manifests of the artifacts something was taken from.
  std::vector<artifact::SourceFile> used_sources() const;
  int64_t taken() const { return taken_; }

 private:
  std::vector<artifact::Artifact> artifacts_;
  std::vector<bool> used_;
  int64_t taken_ = 0;
};

}  // namespace lowbit::quant
