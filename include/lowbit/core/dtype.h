// Element types, named as safetensors names them, and exact f16 / bf16 conversions.
#pragma once

#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace lowbit {

enum class DType : uint8_t { BOOL, U8, I8, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64, F8_E4M3, F8_E5M2 };

struct DTypeTraits {
  DType dtype;
  std::string_view name;  // as in a safetensors header
  uint8_t size;           // bytes per element
  bool is_float;
};

inline constexpr std::array<DTypeTraits, 15> kDTypes{{
    {DType::BOOL, "BOOL", 1, false},
    {DType::U8, "U8", 1, false},
    {DType::I8, "I8", 1, false},
    {DType::I16, "I16", 2, false},
    {DType::U16, "U16", 2, false},
    {DType::F16, "F16", 2, true},
    {DType::BF16, "BF16", 2, true},
    {DType::I32, "I32", 4, false},
    {DType::U32, "U32", 4, false},
    {DType::F32, "F32", 4, true},
    {DType::F64, "F64", 8, true},
    {DType::I64, "I64", 8, false},
    {DType::U64, "U64", 8, false},
    {DType::F8_E4M3, "F8_E4M3", 1, true},
    {DType::F8_E5M2, "F8_E5M2", 1, true},
}};

// The table is indexed by the enum: a row out of place fails to compile.
consteval bool dtype_table_in_enum_order() {
  for (size_t i = 0; i < kDTypes.size(); ++i)
    if (static_cast<size_t>(kDTypes[i].dtype) != i) return false;
  return true;
}
static_assert(dtype_table_in_enum_order());

constexpr const DTypeTraits& traits(DType t) { return kDTypes[static_cast<size_t>(t)]; }
constexpr size_t dtype_size(DType t) { return traits(t).size; }
constexpr std::string_view dtype_name(DType t) { return traits(t).name; }

inline std::optional<DType> parse_dtype(std::string_view name) {
  for (const auto& row : kDTypes)
    if (row.name == name) return row.dtype;
  return std::nullopt;
}

// IEEE binary16 <-> binary32, round to nearest even, NaN and Inf preserved.
inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: normalize
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    bits = sign | ((112u - e) << 23) | ((mant & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

inline uint16_t f32_to_f16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) return sign | (abs > 0x7f800000u ? 0x7e00u : 0x7c00u);
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: overflow to Inf
  if (abs < 0x38800000u) {                          // result is subnormal or zero
    if (abs < 0x33000000u) return sign;             // below half the smallest subnormal
    const uint32_t e = abs >> 23;
    const uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - e;  // 14..24
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return sign | static_cast<uint16_t>(r);
  }
  uint32_t r = ((abs >> 13) - (112u << 10));
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return sign | static_cast<uint16_t>(r);
}

inline float bf16_to_f32(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

inline uint16_t f32_to_bf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  const uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

// Reads element i of a little-endian float array of type t (F16, BF16, F32 or F64) as f32.
inline float load_float(DType t, const void* base, size_t i) {
  const auto* p = static_cast<const unsigned char*>(base);
  switch (t) {
    case DType::F16: { uint16_t v; std::memcpy(&v, p + 2 * i, 2); return f16_to_f32(v); }
    case DType::BF16: { uint16_t v; std::memcpy(&v, p + 2 * i, 2); return bf16_to_f32(v); }
    case DType::F32: { float v; std::memcpy(&v, p + 4 * i, 4); return v; }
    case DType::F64: { double v; std::memcpy(&v, p + 8 * i, 8); return static_cast<float>(v); }
    default: return 0.0f;
  }
}

// Writes f as element i of a float array of type t (F16, BF16 or F32).
inline void store_float(DType t, void* base, size_t i, float f) {
  auto* p = static_cast<unsigned char*>(base);
  switch (t) {
    case DType::F16: { const uint16_t v = f32_to_f16(f); std::memcpy(p + 2 * i, &v, 2); break; }
    case DType::BF16: { const uint16_t v = f32_to_bf16(f); std::memcpy(p + 2 * i, &v, 2); break; }
    case DType::F32: std::memcpy(p + 4 * i, &f, 4); break;
    default: break;
  }
}

}  // namespace lowbit
