// dense: unquantized tensors, stored as bf16, f16 or f32. params: {"dtype": "bf16" | "f16" | "f32"}.
#pragma once

#include "lowbit/codec/codec.h"

namespace lowbit::codec::dense {

DType storage_dtype(const Params& params);

void validate(const Params& params, const Shape& shape);
std::vector<ArraySpec> arrays(const Params& params, const Shape& shape);
void check_content(const Params& params, const Shape& shape, const ArrayViews& arrays);
void decode_rows(const Params& params, const Shape& shape, const ArrayViews& arrays, int64_t row_begin,
                 int64_t row_end, float* out);
EncodedTensor encode(const Params& params, const Shape& shape, const float* weights, const EncodeOptions& options);
EncodedTensor slice(const Params& params, const Shape& shape, const ArrayViews& arrays, Axis axis,
                    std::span<const Range> ranges);

}  // namespace lowbit::codec::dense
