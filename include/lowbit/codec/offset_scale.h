// offset_scale (seed 001): w = scale * (q - offset) per group of 64 inputs, one F16 scale per group (finite,
// > 0), no stored bias: the bias is implied as -offset * scale.
//
// precisions: "q3"       7 levels, codes 0..6, offset 3, code 7 reserved (legacy)
//             "q3_full8" 8 levels, codes 0..7, zero point 4
//             "q4"       15 levels, codes 0..14, offset 7, code 15 reserved
// params: {"precision": ..., "group_size": 64 (optional), "padded_cols": cols rounded up to 64 (optional on
//          input, always written by encode), "encoding": "uniform_lsb" (q3, q4) | "uniform_lsb_full8"
//          (q3_full8) (optional), "grid": the seed's full8 grid object (q3_full8 only, optional)}
// arrays: "codes"  U8  [rows, padded_cols * bits / 8]  each row an LSB-first bit stream of `bits`-bit codes
//         "scales" F16 [rows, padded_cols / 64]
// Padding columns hold the zero-point code (value 0). docs/CODECS.md specifies the bits.
#pragma once

#include <cstdint>
#include <string_view>

#include "lowbit/codec/codec.h"

namespace lowbit::codec::offset_scale {

inline constexpr int64_t kGroupSize = 64;
inline constexpr int64_t kMaxRows = 262144;  // seed 001's dimension bounds
inline constexpr int64_t kMaxCols = 32768;

struct Grid {
  std::string_view precision;
  std::string_view encoding;
  int bits;
  uint32_t offset;    // zero point: the code whose value is 0, also the padding code
  uint32_t max_code;  // codes above are reserved
};

// Everything the parameters and logical shape fix; the single place params are parsed.
struct Layout {
  Grid grid;
  int64_t rows = 0;
  int64_t cols = 0;         // logical width
  int64_t padded_cols = 0;  // cols rounded up to 64
  int64_t row_bytes() const { return padded_cols * grid.bits / 8; }
  int64_t groups_per_row() const { return padded_cols / kGroupSize; }
};

// Validates params and shape (rank 2, 1 <= rows <= 262144, 1 <= cols <= 32768) and returns the layout.
Layout layout(const Params& params, const Shape& shape);

// Code `index` of a row's LSB-first bit stream (codes may straddle two bytes).
inline uint32_t read_code(const uint8_t* row, int64_t index, int bits) {
  const uint64_t bit = static_cast<uint64_t>(index) * static_cast<uint64_t>(bits);
  const uint64_t byte = bit >> 3;
  const unsigned shift = bit & 7u;
  uint32_t v = static_cast<uint32_t>(row[byte]) >> shift;
  if (shift + static_cast<unsigned>(bits) > 8u) v |= static_cast<uint32_t>(row[byte + 1]) << (8u - shift);
  return v & ((1u << bits) - 1u);
}

// Writes code `index` of a row, keeping the bits of the other codes.
inline void write_code(uint8_t* row, int64_t index, int bits, uint32_t code) {
  const uint64_t bit = static_cast<uint64_t>(index) * static_cast<uint64_t>(bits);
  const uint64_t byte = bit >> 3;
  const unsigned shift = bit & 7u;
  const uint32_t mask = ((1u << bits) - 1u) << shift;
  const uint32_t value = (code << shift) & mask;
  row[byte] = static_cast<uint8_t>((row[byte] & ~mask) | value);
  if (shift + static_cast<unsigned>(bits) > 8u)
    row[byte + 1] = static_cast<uint8_t>((row[byte + 1] & ~(mask >> 8)) | (value >> 8));
}

void validate(const Params& params, const Shape& shape);
std::vector<ArraySpec> arrays(const Params& params, const Shape& shape);
// Errc::non_finite for a NaN, infinite, zero or negative scale; Errc::reserved_code for a code above the
// grid's maximum or a padding column not holding the zero-point code.
void check_content(const Params& params, const Shape& shape, const ArrayViews& arrays);
void decode_rows(const Params& params, const Shape& shape, const ArrayViews& arrays, int64_t row_begin,
                 int64_t row_end, float* out);
// RTN with the largest magnitude of each group on the grid's outermost level; with options.search, a per-group
// search over shrunken scales minimizing (importance-weighted) squared error.
EncodedTensor encode(const Params& params, const Shape& shape, const float* weights, const EncodeOptions& options);
EncodedTensor slice(const Params& params, const Shape& shape, const ArrayViews& arrays, Axis axis,
                    std::span<const Range> ranges);
void quantize_column(const Params& params, const Shape& shape, EncodedTensor& tensor, int64_t col,
                     const float* values, float* out);

}  // namespace lowbit::codec::offset_scale
