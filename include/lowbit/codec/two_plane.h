// two_plane (seed 000): w = base + residual, each a 2-bit affine plane over groups of 128 inputs,
// w_p = scale_p * q_p + bias_p with q_p in 0..3. Five states per weight are what the encoder produces and what
// the compact storages can hold.
//
// params: {"storage": "planes" | "quint5" | "trit3"   (default "planes"),
//          "metadata": "full" | "slim"                (default "full"),
//          "scale_dtype": "bf16" | "f16" | "f32"      (default "bf16"),
//          "group_size": 128 (optional), "padded_cols": cols rounded up to 128 (optional on input, always
//          written by encode)}
// arrays, codes first:
//   planes: "base_codes" U32 [rows, padded_cols / 16], "residual_codes" U32 [rows, padded_cols / 16]
//           (MLX 2-bit packing: code c of a row in word c / 16, bits 2 * (c % 16))
//   quint5: "codes" U8 [rows, ceil(padded_cols / 10) * 3]: ten base-5 state digits per 24-bit little-endian
//           chunk, the first weight in the least significant digit (2.4 bits per weight)
//   trit3:  "codes" U8 [rows, padded_cols * 3 / 8]: one 3-bit state digit per weight, LSB-first bit stream
//   full:   "base_scales", "base_biases", "residual_scales", "residual_biases" scale_dtype [rows, groups]
//   slim:   "base_alpha" scale_dtype [rows], "residual_scale" scale_dtype [1]; expanded at load to per-group
//           arrays with base scale = alpha of the row, residual scale = the single value, biases = -scale
// State s in {-2, -1, 0, 1, 2} has digit s + 2 and plane codes (base, residual) =
//   (0, 0), (0, 1), (1, 1), (2, 1), (2, 2); with biases = -scale its value is base_scale * (base - 1) +
//   residual_scale * (residual - 1). Padding columns hold state 0. docs/CODECS.md specifies the bits.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "lowbit/codec/codec.h"

namespace lowbit::codec::two_plane {

inline constexpr int64_t kGroupSize = 128;

enum class Storage { planes, quint5, trit3 };
enum class Metadata { full, slim };

// Everything the parameters and logical shape fix; the single place params are parsed.
struct Layout {
  Storage storage = Storage::planes;
  Metadata metadata = Metadata::full;
  DType scale_dtype = DType::BF16;
  int64_t rows = 0;
  int64_t cols = 0;         // logical width
  int64_t padded_cols = 0;  // cols rounded up to 128
  int64_t groups_per_row() const { return padded_cols / kGroupSize; }
  int64_t words_per_row() const { return padded_cols / 16; }                // planes, per plane
  int64_t quint5_row_bytes() const { return (padded_cols + 9) / 10 * 3; }  // quint5
  int64_t trit3_row_bytes() const { return padded_cols * 3 / 8; }          // trit3
};

// Validates params and shape (rank 2, both dimensions >= 1) and returns the layout.
Layout layout(const Params& params, const Shape& shape);

// The five states by digit (state + 2): plane codes.
inline constexpr std::array<uint8_t, 5> kStateBase{0, 0, 1, 2, 2};
inline constexpr std::array<uint8_t, 5> kStateResidual{0, 1, 1, 1, 2};
inline constexpr uint8_t kZeroDigit = 2;

// quint5 chunks: ten digits d_0..d_9 (d_0 the first weight) as sum d_j * 5^j in three little-endian bytes.
// A row's final chunk may hold fewer digits; the absent ones are 0. Returns false for a chunk value >= 5^n.
bool quint5_unpack(const uint8_t* chunk, int n, uint8_t* digits);
void quint5_pack(const uint8_t* digits, int n, uint8_t* chunk);

// Plane codes of one stored row, padded_cols each (0..3). Content must have passed check_content.
void row_plane_codes(const Layout& l, const ArrayViews& arrays, int64_t row, uint8_t* base, uint8_t* residual);

// The four per-group affine arrays of one row (groups_per_row() values each), slim metadata expanded.
struct RowMetadata {
  float* base_scales;
  float* base_biases;
  float* residual_scales;
  float* residual_biases;
};
void row_metadata(const Layout& l, const ArrayViews& arrays, int64_t row, const RowMetadata& out);

// The whole tensor's per-group metadata, contiguous [rows, groups] each (slim expanded).
struct ExpandedMetadata {
  std::vector<float> base_scales, base_biases, residual_scales, residual_biases;
};
ExpandedMetadata expand_metadata(const Layout& l, const ArrayViews& arrays);

void validate(const Params& params, const Shape& shape);
std::vector<ArraySpec> arrays(const Params& params, const Shape& shape);
// Errc::non_finite for non-finite metadata; Errc::reserved_code for a quint5 chunk >= 5^n, a trit3 digit above
// 4, or a padding column not holding state 0.
void check_content(const Params& params, const Shape& shape, const ArrayViews& arrays);
void decode_rows(const Params& params, const Shape& shape, const ArrayViews& arrays, int64_t row_begin,
                 int64_t row_end, float* out);
// Per weight the nearest of the five levels of its group. full: per group of 128, levels
// m + {0, +-sb, +-(sb + sr)} (center m in the biases): m the group's midrange, the outer levels at its min and
// max, sb the best of a ladder; options.search adds least-squares refits of m, sb and sr with the states
// reassigned, kept while the error falls. slim: levels
// {0, +-a, +-(a + r)}, a = alpha of the row minimizing its squared error, r = the tensor's mean alpha;
// options.search adds alternating least-squares refits of the row alphas and the single residual scale.
EncodedTensor encode(const Params& params, const Shape& shape, const float* weights, const EncodeOptions& options);
EncodedTensor slice(const Params& params, const Shape& shape, const ArrayViews& arrays, Axis axis,
                    std::span<const Range> ranges);

// GPTQ's column step (codec.h): re-rounds column `col` to the nearest of the five states on the grid the stored
// metadata fixes (full: the group's four affine values; slim: the row's alpha and the single residual scale,
// so both metadata variants take Hessian-aware rounding), rewriting its digit in any storage, and writes the
// dequantized values to `out`.
void quantize_column(const Params& params, const Shape& shape, EncodedTensor& tensor, int64_t col,
                     const float* values, float* out);

// The opt-in lossy fold (seed 000, never a default): re-encodes a validated two_plane tensor as one `bits`-bit
// affine plane (codec "affine", groups of 128, the same scale dtype) through the affine encoder (options.search
// selects its clipping search), 64 rows at a time so no more than 64 decoded rows exist at once. Returns the
// affine params and arrays for the same logical shape.
EncodedTensor fold_to_affine(const TensorRef& tensor, int bits, const EncodeOptions& options);

}  // namespace lowbit::codec::two_plane
