// safetensors, read and written by the format's rules: an 8-byte little-endian header length N (at most
// 100,000,000), N bytes of a JSON object mapping tensor names to {"dtype", "shape", "data_offsets"} plus an
// optional "__metadata__" string-to-string map, then the data. Offsets are relative to the data start, the
// tensors tile the data exactly (no hole, overlap or trailing byte), and each span equals numel x dtype size.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "lowbit/core/mapped_file.h"
#include "lowbit/core/tensor.h"

namespace lowbit::io {

inline constexpr uint64_t kSafetensorsMaxHeader = 100'000'000;
inline constexpr size_t kSafetensorsMaxTensors = 1'000'000;
inline constexpr size_t kSafetensorsMaxRank = 8;

struct SafetensorsEntry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin = 0;  // relative to the data section
  uint64_t end = 0;
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> entries;  // in data-offset order
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // 8 + header length
};

// Parses and validates a header against the total file size. `source` names the file in errors. Never reads
// past `file`. Throws lowbit::Error (Errc::format, limit, layout, overflow, duplicate, dtype, shape, truncated).
SafetensorsHeader parse_safetensors_header(std::span<const std::byte> file, std::string_view source);

// A mapped, validated safetensors file; tensors are zero-copy views into the mapping.
class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::filesystem::path& path);
  const SafetensorsHeader& header() const { return header_; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  bool contains(std::string_view name) const;
  TensorView tensor(std::string_view name) const;  // Errc::format when absent
  std::vector<std::string> names() const;          // sorted
  const MappedFile& file() const { return file_; }

 private:
  MappedFile file_;
  SafetensorsHeader header_;
  std::map<std::string, size_t, std::less<>> index_;
};

// A checkpoint of one file or many shards (model.safetensors.index.json with a "weight_map").
class SafetensorsCheckpoint {
 public:
  // `path` is a .safetensors file, an index .json file, or a directory holding either.
  static SafetensorsCheckpoint open(const std::filesystem::path& path);
  bool contains(std::string_view name) const;
  TensorView tensor(std::string_view name) const;
  std::vector<std::string> names() const;  // sorted
  const std::vector<std::unique_ptr<SafetensorsFile>>& shards() const { return shards_; }
  std::vector<const MappedFile*> files() const;  // every shard's mapping

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::map<std::string, size_t, std::less<>> shard_of_;
};

// Streams a safetensors file: declare every tensor (name, dtype, shape) first, then write their bytes in the
// declared order. Memory use is the header plus what the caller passes in. The caller owns atomicity (the
// artifact writer writes into a staging directory); a writer destroyed before finish() removes its file.
// Misuse (declaring after writing, writing out of order or the wrong size, finishing early) is Errc::internal.
class SafetensorsWriter {
 public:
  SafetensorsWriter(std::filesystem::path path, std::map<std::string, std::string> metadata = {});
  ~SafetensorsWriter();
  void declare(std::string name, DType dtype, Shape shape);
  // Writes the next declared tensor's bytes (in declaration order); size must match exactly.
  void write(std::string_view name, std::span<const std::byte> bytes);
  // Checks every tensor was written, fsyncs and closes. Returns the file size.
  uint64_t finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Convenience: writes a whole set of in-memory tensors to one file, byte for byte as the reference implementation
// would (same tensor order: by dtype, larger elements first, then by name, so every tensor is aligned).
void write_safetensors(const std::filesystem::path& path, const std::vector<std::pair<std::string, TensorView>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace lowbit::io
