// affine: w = scale * q + bias per group of G inputs, q in [0, 2^bits - 1], packed exactly as MLX's
// `mx.quantize` packs it, so an MLX checkpoint's `<name>.weight`, `.scales` and `.biases` load unchanged.
//
// params: {"bits": 2|3|4|5|6|8, "group_size": 32|64|128 (16 at bits 2, 3 and 6: GGUF's Q2_K, Q3_K and Q6_K),
//          "scale_dtype": "bf16"|"f16"|"f32",
//          "padded_cols": cols rounded up to group_size, to two groups at 3 bits in groups of 16 (optional on input,
//          always written by encode)}
// arrays: "codes"  U32 [rows, padded_cols * bits / 32]  each row an LSB-first bit stream in little-endian words
//         "scales" scale_dtype [rows, padded_cols / group_size]
//         "biases" scale_dtype [rows, padded_cols / group_size]
// docs/CODECS.md specifies the bits, with a worked 3-bit example.
#pragma once

#include <cstdint>

#include "lowbit/codec/codec.h"

namespace lowbit::codec::affine {

// Everything the parameters and logical shape fix; the single place params are parsed.
struct Layout {
  int bits = 0;
  int64_t group_size = 0;
  DType scale_dtype = DType::BF16;
  int64_t rows = 0;
  int64_t cols = 0;         // logical width
  int64_t padded_cols = 0;  // cols rounded up to unit_cols()
  // The fewest columns of whole groups that fill whole words: one group, or two at 3 bits in groups of 16 (48
  // bits). padded_cols and the column ranges of a slice are multiples of it.
  int64_t unit_cols() const { return group_size * bits % 32 == 0 ? group_size : 2 * group_size; }
  int64_t words_per_row() const { return padded_cols * bits / 32; }
  int64_t groups_per_row() const { return padded_cols / group_size; }
  uint32_t max_code() const { return (1u << bits) - 1u; }
};

// Validates params and shape (rank 2, both dimensions >= 1) and returns the layout.
Layout layout(const Params& params, const Shape& shape);

// Code `index` of a row's bit stream (LSB-first, little-endian words; codes may straddle two words).
inline uint32_t read_code(const uint32_t* row_words, int64_t index, int bits) {
  const uint64_t bit = static_cast<uint64_t>(index) * static_cast<uint64_t>(bits);
  const uint64_t word = bit >> 5;
  const unsigned offset = bit & 31u;
  uint64_t v = row_words[word] >> offset;
  if (offset + static_cast<unsigned>(bits) > 32u) v |= static_cast<uint64_t>(row_words[word + 1]) << (32u - offset);
  return static_cast<uint32_t>(v) & ((1u << bits) - 1u);
}

// Writes code `index` into a zero-initialized or previously written row (bits outside the code are kept).
inline void write_code(uint32_t* row_words, int64_t index, int bits, uint32_t code) {
  const uint64_t bit = static_cast<uint64_t>(index) * static_cast<uint64_t>(bits);
  const uint64_t word = bit >> 5;
  const unsigned offset = bit & 31u;
  const uint64_t mask = ((uint64_t{1} << bits) - 1u) << offset;
  const uint64_t value = static_cast<uint64_t>(code) << offset;
  row_words[word] = static_cast<uint32_t>((row_words[word] & ~mask) | (value & mask));
  if (offset + static_cast<unsigned>(bits) > 32u) {
    const uint32_t hi_mask = static_cast<uint32_t>(mask >> 32);
    row_words[word + 1] = (row_words[word + 1] & ~hi_mask) | static_cast<uint32_t>(value >> 32);
  }
}

// MLX's round-to-nearest parameters for one group (mlx/backend/cpu/quantized.cpp `quantize`): the endpoint with
// the larger magnitude is represented exactly; scale is negative when that endpoint is the maximum.
struct GroupParams {
  float scale;
  float bias;
};
GroupParams mlx_group_params(float w_min, float w_max, int bits);

void validate(const Params& params, const Shape& shape);
std::vector<ArraySpec> arrays(const Params& params, const Shape& shape);
void check_content(const Params& params, const Shape& shape, const ArrayViews& arrays);
void decode_rows(const Params& params, const Shape& shape, const ArrayViews& arrays, int64_t row_begin,
                 int64_t row_end, float* out);
// Plain RTN (MLX-identical) by default; with options.search, a per-group search over clipping ranges and a
// least-squares refit, minimizing (importance-weighted) squared error.
EncodedTensor encode(const Params& params, const Shape& shape, const float* weights, const EncodeOptions& options);
EncodedTensor slice(const Params& params, const Shape& shape, const ArrayViews& arrays, Axis axis,
                    std::span<const Range> ranges);
void quantize_column(const Params& params, const Shape& shape, EncodedTensor& tensor, int64_t col,
                     const float* values, float* out);

}  // namespace lowbit::codec::affine
