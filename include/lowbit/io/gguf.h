// GGUF (versions 2 and 3), read by the format's rules with the artifact reader's strictness: a "GGUF" magic,
// version, tensor and key-value counts, the key-value metadata (scalars, strings and arrays of them), the tensor
// infos (name, dims with ne[0] the contiguous one, ggml type, offset), padding to general.alignment (default
// 32), then the tensor data. Every count, length and dimension is bounded, all size arithmetic is checked,
// every tensor lies inside the file, aligned, without overlapping another.
//
// Tensors of types F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and the IQ types
// (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS) dequantize to f32 exactly as ggml's
// dequantize_row_* define them (the IQ grids are ggml's tables, src/io/ggml_iq_tables.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "lowbit/core/mapped_file.h"
#include "lowbit/core/tensor.h"

namespace lowbit::io {

inline constexpr uint64_t kGgufMaxTensors = 1 << 20;
inline constexpr uint64_t kGgufMaxKeys = 1 << 20;
inline constexpr uint64_t kGgufMaxKeyLength = 65535;
inline constexpr uint64_t kGgufMaxStringLength = 1ull << 30;
inline constexpr uint64_t kGgufMaxArrayLength = 1ull << 28;
inline constexpr uint32_t kGgufMaxDims = 4;
inline constexpr uint32_t kGgufDefaultAlignment = 32;

enum class GgufValueType : uint32_t {
  u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7, string = 8, array = 9,
  u64 = 10, i64 = 11, f64 = 12,
};

using GgufScalar = std::variant<uint64_t, int64_t, double, bool, std::string>;

struct GgufValue {
  GgufValueType type = GgufValueType::u8;
  GgufValueType element_type = GgufValueType::u8;  // for arrays
  GgufScalar scalar;                              // for non-arrays
  std::vector<GgufScalar> array;                  // for arrays (nested arrays are rejected)
};

// ggml tensor types lowbit reads (the numbering of ggml.h).
enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  IQ1_M = 29,
  BF16 = 30,
};

struct GgmlTypeInfo {
  GgmlType type;
  std::string_view name;
  uint32_t block_elems;  // elements per block
  uint32_t block_bytes;  // bytes per block
};

// nullptr for types lowbit does not read.
const GgmlTypeInfo* ggml_type_info(uint32_t type);

struct GgufTensorInfo {
  std::string name;
  std::vector<uint64_t> ne;  // ggml order: ne[0] is contiguous
  GgmlType type = GgmlType::F32;
  uint64_t offset = 0;       // relative to the data section
  uint64_t bytes = 0;
  uint64_t numel = 0;
  Shape shape() const;       // row-major order: ne reversed ([rows, cols] for a matrix)
};

struct GgufHeader {
  uint32_t version = 0;
  uint32_t alignment = kGgufDefaultAlignment;
  std::map<std::string, GgufValue, std::less<>> metadata;
  std::vector<GgufTensorInfo> tensors;  // in file order
  uint64_t data_start = 0;              // absolute offset of the data section
};

// Parses and validates a whole GGUF image; never reads outside `file`. Throws lowbit::Error (Errc::format,
// version, truncated, limit, overflow, duplicate, layout, unsupported) naming `source` and the field.
GgufHeader parse_gguf(std::span<const std::byte> file, std::string_view source);

// Dequantizes n elements (a whole number of blocks) of type `type` from `src` into `dst`.
void dequantize_ggml(GgmlType type, std::span<const std::byte> src, std::span<float> dst);

class GgufFile {
 public:
  static GgufFile open(const std::filesystem::path& path);
  // Parses an in-memory image (tests); the bytes must outlive the GgufFile.
  static GgufFile from_bytes(std::span<const std::byte> bytes, std::string source);

  const GgufHeader& header() const { return header_; }
  const std::string& source() const { return source_; }

  const GgufValue* find(std::string_view key) const;
  // Typed lookups: nullopt when absent; Errc::format when present with another type.
  std::optional<std::string> get_string(std::string_view key) const;
  std::optional<uint64_t> get_uint(std::string_view key) const;  // any non-negative integer type
  std::optional<double> get_float(std::string_view key) const;   // any numeric type
  std::optional<bool> get_bool(std::string_view key) const;
  std::optional<std::vector<std::string>> get_strings(std::string_view key) const;
  std::optional<std::vector<double>> get_floats(std::string_view key) const;  // numeric arrays

  const GgufTensorInfo* tensor(std::string_view name) const;
  std::span<const std::byte> tensor_bytes(const GgufTensorInfo& info) const;
  std::vector<float> dequantize(const GgufTensorInfo& info) const;
  // The caller has copied the tensor out: its pages leave the resident set (MappedFile::release_pages; nothing
  // for an in-memory image). Its bytes stay readable.
  void release_pages(const GgufTensorInfo& info) const;

 private:
  MappedFile file_;
  std::span<const std::byte> bytes_;
  std::string source_;
  GgufHeader header_;
  std::map<std::string, size_t, std::less<>> index_;
};

}  // namespace lowbit::io
