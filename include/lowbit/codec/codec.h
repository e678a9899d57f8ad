// The codec registry: one row per storage format, like a table of type traits. A codec says which arrays a
// tensor of a given logical shape and parameters stores, checks their content, decodes rows exactly to fp32
// and encodes fp32 rows. The artifact verifier validates through this table; the kernels (kernels/) keep
// their own table keyed by the same ids. The codec layer never includes the kernels.
//
// Conventions for every codec:
//  - A quantized codec stores a rank-2 logical matrix [rows, cols] = [out_features, in_features]; groups and
//    blocks run along cols. Widths that are not a multiple of the group or block are zero-padded in storage;
//    params record "padded_cols" (seed 001), and decode_rows never returns padding.
//  - `dense` stores any rank; it is viewed as [prod(leading dims), last dim] (rank 1: [1, n]).
//  - params is a JSON object exactly as it appears in the manifest; validate() rejects any key or value
//    outside the codec's allowed set (Errc::codec_params).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lowbit/core/tensor.h"

namespace lowbit {
class ThreadPool;
}

namespace lowbit::codec {

using Params = nlohmann::json;

// One array a codec stores for a tensor: its role ("codes", "scales", ...), dtype and shape.
struct ArraySpec {
  std::string role;
  DType dtype;
  Shape shape;
};

// The stored arrays of one tensor, by role, in the order the codec's arrays() declares them.
struct ArrayViews {
  std::vector<std::pair<std::string, TensorView>> items;
  const TensorView& at(std::string_view role) const;
};

struct EncodedTensor {
  Params params;  // the parameters as stored (normalized: defaults filled in, padded_cols set)
  std::vector<std::pair<std::string, TensorBuffer>> arrays;
  ArrayViews views() const;
};

// A half-open range [begin, end) of rows or columns of a logical matrix.
struct Range {
  int64_t begin = 0;
  int64_t end = 0;
};
enum class Axis : uint8_t { rows, cols };

struct EncodeOptions {
  // Optional per-input-column importance (length cols), e.g. diag(H) of a calibration Hessian; encoders that
  // search (clipping ranges, trellis paths) minimize importance-weighted squared error when it is given.
  std::span<const float> column_importance;
  bool search = false;  // error-minimizing search instead of plain round-to-nearest where the codec has one
  uint64_t seed = 0;    // for codecs with randomized transforms
  ThreadPool* pool = nullptr;
};

// One row of the registry. The constructor takes every required function, so a row that misses one does not
// compile; quantize_column is the only optional piece.
struct Codec {
  using ValidateFn = void (*)(const Params& params, const Shape& shape);
  using ArraysFn = std::vector<ArraySpec> (*)(const Params& params, const Shape& shape);
  using CheckContentFn = void (*)(const Params& params, const Shape& shape, const ArrayViews& arrays);
  using DecodeRowsFn = void (*)(const Params& params, const Shape& shape, const ArrayViews& arrays,
                                int64_t row_begin, int64_t row_end, float* out);
  using EncodeFn = EncodedTensor (*)(const Params& params, const Shape& shape, const float* weights,
                                     const EncodeOptions& options);
  using SliceFn = EncodedTensor (*)(const Params& params, const Shape& shape, const ArrayViews& arrays, Axis axis,
                                    std::span<const Range> ranges);
  using QuantizeColumnFn = void (*)(const Params& params, const Shape& shape, EncodedTensor& tensor, int64_t col,
                                    const float* values, float* out);

  constexpr Codec(std::string_view id_, std::string_view summary_, ValidateFn validate_, ArraysFn arrays_,
                  CheckContentFn check_content_, DecodeRowsFn decode_rows_, EncodeFn encode_, SliceFn slice_,
                  QuantizeColumnFn quantize_column_ = nullptr)
      : id(id_),
        summary(summary_),
        validate(validate_),
        arrays(arrays_),
        check_content(check_content_),
        decode_rows(decode_rows_),
        encode(encode_),
        slice(slice_),
        quantize_column(quantize_column_) {}

  std::string_view id;
  std::string_view summary;
  // Throws Errc::codec_params for parameters outside the allowed set, Errc::shape for an unusable shape.
  ValidateFn validate;
  // The arrays stored for a tensor with these (validated) params and logical shape.
  ArraysFn arrays;
  // Throws Errc::reserved_code / Errc::non_finite for content the codec forbids. Arrays match arrays().
  CheckContentFn check_content;
  // Decodes logical rows [row_begin, row_end) to fp32, row-major with the logical width.
  DecodeRowsFn decode_rows;
  // Encodes a row-major fp32 tensor of the given logical shape.
  EncodeFn encode;
  // Keeps the given ranges of one axis of a rank-2 tensor (concatenated in order) and all of the other, in the same
  // codec: the stored arrays are cut, never decoded or re-encoded (tensor parallelism's shards). Ranges are in
  // bounds, non-empty and ascending (slice_tensor checks). A range that would cut a quantization group, a tile or a
  // rotated axis is Errc::shape naming the range; only the last range may end at the logical width, taking the
  // padding with it.
  SliceFn slice;
  // Optional; nullptr where a codec's grid is not fixed column by column (dense, trellis). Re-quantizes column
  // `col` of an encoded tensor onto the grid its stored parameters (scales, biases) already fix, writing the
  // codes in place and the dequantized values (one per row) to `out`. GPTQ/LDLQ's column-wise error feedback
  // runs through it: encode() chooses the grid, then every column is rounded after the earlier columns' error
  // has been fed forward.
  QuantizeColumnFn quantize_column;
};

// A stored tensor: codec, parameters, logical shape and its arrays. What the kernels prepare from.
struct TensorRef {
  const Codec* codec = nullptr;
  Params params;
  Shape shape;
  ArrayViews arrays;
};

std::span<const Codec> all_codecs();
const Codec* find_codec(std::string_view id);  // nullptr when unknown
const Codec& codec_or_throw(std::string_view id, std::string_view context);

// [rows, cols] view of a logical shape (see the conventions above).
std::pair<int64_t, int64_t> matrix_dims(const Shape& shape);

// Bits per logical weight including all metadata arrays.
double bits_per_weight(const Codec& codec, const Params& params, const Shape& shape);

// Validates params and shape, checks every array's dtype and shape against arrays(), then check_content().
// `context` names the tensor in error messages.
void validate_tensor(const TensorRef& tensor, std::string_view context);

// A tensor cut by Codec::slice: its logical shape and its arrays.
struct SlicedTensor {
  Shape shape;
  EncodedTensor tensor;
};
// Checks the ranges (in bounds, non-empty, ascending; the tensor rank 2), slices through the codec and validates
// the result; errors are prefixed by `context`.
SlicedTensor slice_tensor(const TensorRef& tensor, Axis axis, std::span<const Range> ranges, std::string_view context);

// Decodes a whole tensor to fp32 (for tests, conversion and reference paths, never on a kernel's hot path).
std::vector<float> decode_all(const TensorRef& tensor);

}  // namespace lowbit::codec
