#include "lowbit/codec/dense.h"

#include <cmath>

#include "lowbit/codec/params.h"
#include "lowbit/core/checked.h"
#include "lowbit/core/error.h"
#include "slice_util.h"

namespace lowbit::codec::dense {

DType storage_dtype(const Params& params) {
  ParamReader r(params, "dense");
  const auto name = r.choice("dtype", {"bf16", "f16", "f32"});
  r.finish();
  return scale_dtype_from_name(name);
}

void validate(const Params& params, const Shape& shape) {
  storage_dtype(params);
  checked_numel(shape, "[dense] shape");
}

std::vector<ArraySpec> arrays(const Params& params, const Shape& shape) {
  return {{"data", storage_dtype(params), shape}};
}

void check_content(const Params& params, const Shape& shape, const ArrayViews& arrays) {
  const TensorView& data = arrays.at("data");
  const size_t n = checked_numel(shape, "[dense] shape");
  for (size_t i = 0; i < n; ++i)
    if (!std::isfinite(load_float(data.dtype, data.bytes.data(), i)))
      fail(Errc::non_finite, "[dense] element {} is not finite", i);
}

void decode_rows(const Params& params, const Shape& shape, const ArrayViews& arrays, int64_t row_begin,
                 int64_t row_end, float* out) {
  const TensorView& data = arrays.at("data");
  const auto [rows, cols] = matrix_dims(shape);
  for (int64_t i = row_begin * cols; i < row_end * cols; ++i)
    *out++ = load_float(data.dtype, data.bytes.data(), static_cast<size_t>(i));
}

EncodedTensor encode(const Params& params, const Shape& shape, const float* weights, const EncodeOptions&) {
  const DType dt = storage_dtype(params);
  TensorBuffer data = make_buffer(dt, shape);
  const size_t n = checked_numel(shape, "[dense] shape");
  for (size_t i = 0; i < n; ++i) store_float(dt, data.bytes.data(), i, weights[i]);
  EncodedTensor out;
  out.params = params;
  out.arrays.emplace_back("data", std::move(data));
  return out;
}

EncodedTensor slice(const Params& params, const Shape& shape, const ArrayViews& arrays, Axis axis,
                    std::span<const Range> ranges) {
  return slice_grouped(
      params, shape, arrays, axis, ranges, shape[1], 1, "dense",
      [](const Params&, const Shape&, std::string_view) { return ArrayCut{.per_row = true, .per_group = 1}; });
}

}  // namespace lowbit::codec::dense
