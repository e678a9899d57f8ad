// The manifest of a lowbit artifact (docs/FORMAT.md): every logical tensor with its codec, parameters and stored
// arrays, every file with its size and SHA-256 (the quality report and the recipe among them), the model config and
// provenance. Parsing is
// strict: unknown keys, formats, versions and codecs are errors, codec parameters and declared arrays are
// checked against the codec registry, names are checked for safety and every count and dimension is bounded.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lowbit/codec/codec.h"
#include "lowbit/core/tensor.h"

namespace lowbit::artifact {

inline constexpr std::string_view kFormat = "lowbit-artifact";
inline constexpr int64_t kVersion = 2;        // what the writer writes
inline constexpr int64_t kLegacyVersion = 1;  // still read: its free-form recipe and quality shown as unverified
inline constexpr std::string_view kManifestName = "manifest.json";

// Bounds every reader enforces (Errc::limit), so that nothing is allocated from an unchecked count.
inline constexpr uint64_t kMaxManifestBytes = 64ull << 20;
inline constexpr size_t kMaxTensors = 65536;
inline constexpr size_t kMaxArraysPerTensor = 16;
inline constexpr size_t kMaxFiles = 4096;
inline constexpr size_t kMaxRank = 8;
inline constexpr int64_t kMaxDim = (int64_t{1} << 31) - 1;
inline constexpr size_t kMaxNameBytes = 1024;     // tensor names, array roles and keys, source names
inline constexpr size_t kMaxFileNameBytes = 255;  // file names (NAME_MAX)
inline constexpr size_t kMaxSeeds = 256;
inline constexpr size_t kMaxSources = 4096;

// quality and recipe: at most one file each, parsed and checked against the manifest (artifact/records.h).
enum class FileRole { payload, config, tokenizer, quality, recipe, other };
std::string_view file_role_name(FileRole role);

struct ArrayEntry {
  std::string role;  // as the codec names it: "data", "codes", "scales", ...
  std::string file;  // a payload file of the artifact
  std::string key;   // the tensor's name inside that safetensors file
  DType dtype = DType::F32;
  Shape shape;
};

struct TensorEntry {
  std::string name;
  Shape shape;  // logical shape
  std::string codec;
  codec::Params params = codec::Params::object();
  std::vector<ArrayEntry> arrays;  // in the order codec.arrays() declares them
};

struct FileEntry {
  std::string name;
  FileRole role = FileRole::other;
  uint64_t size = 0;
  std::string sha256;  // 64 lowercase hex digits
};

struct SourceFile {
  std::string name;  // as the quantizer saw it; informational, never opened by a reader
  uint64_t size = 0;
  std::string sha256;
};

struct Provenance {
  std::string tool;  // "lowbit 0.1.0"
  std::vector<SourceFile> sources;
  std::optional<std::string> calibration_sha256;     // of the calibration text, when there was one
  std::map<std::string, uint64_t> seeds;             // every random seed used, by purpose
};

struct Manifest {
  std::vector<TensorEntry> tensors;
  std::vector<FileEntry> files;
  nlohmann::json config = nlohmann::json::object();   // the model config, may be empty
  Provenance provenance;
  int64_t version = kVersion;
  // Version 1 only: its free-form `provenance.recipe` and `quality`, which nothing checked; never written, shown
  // by inspect as unverified. Empty for version 2.
  nlohmann::json unverified = nlohmann::json::object();

  // Parses manifest text (strict JSON: duplicate keys rejected) and validates it. `source` names the file in
  // errors. Throws lowbit::Error: format, version, unknown_codec, codec_params, dtype, shape, overflow,
  // unsafe_path, limit, duplicate.
  static Manifest parse(std::string_view text, std::string_view source = kManifestName);
  // Validates an already parsed document (same checks as parse()).
  static Manifest from_json(const nlohmann::json& doc, std::string_view source = kManifestName);

  nlohmann::json to_json() const;
  std::string serialize() const;  // to_json(), indented, with a final newline

  const TensorEntry* find_tensor(std::string_view name) const;
  const FileEntry* find_file(std::string_view name) const;
  const FileEntry* find_role(FileRole role) const;  // the first file of that role, or null
};

// Throws Errc::unsafe_path unless `name` is a plain file name: non-empty, at most kMaxFileNameBytes, no '/' or
// '\\', no control characters, not starting with '.' (which also excludes "." and "..").
void check_file_name(std::string_view name, std::string_view context);

// Throws unless `name` is a usable tensor name, array role or key: non-empty, at most kMaxNameBytes (Errc::limit),
// no control characters (Errc::format).
void check_tensor_name(std::string_view name, std::string_view context);

// Numel of a declared shape after checking rank (limit), dimensions (shape when negative, limit when above
// kMaxDim) and the product (overflow).
uint64_t checked_shape_numel(const Shape& shape, std::string_view context);

}  // namespace lowbit::artifact
