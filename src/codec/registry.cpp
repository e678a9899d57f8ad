// The codec table. Adding a codec: one file (src/codec/<id>.cpp with its header) and one row here; a row with
// a missing function fails to compile. The kernels keep a matching table (kernels/cpu/registry.cpp) whose
// coverage is checked by a registry self-test.
#include <algorithm>
#include <array>
#include <cstring>

#include "lowbit/codec/affine.h"
#include "lowbit/codec/codec.h"
#include "lowbit/codec/dense.h"
#include "lowbit/codec/offset_scale.h"
#include "lowbit/codec/trellis.h"
#include "lowbit/codec/two_plane.h"
#include "lowbit/core/checked.h"
#include "lowbit/core/error.h"
#include "slice_util.h"

namespace lowbit::codec {

namespace {

constexpr std::array kCodecs{
    Codec{"dense", "unquantized bf16 / f16 / f32", dense::validate, dense::arrays, dense::check_content,
          dense::decode_rows, dense::encode, dense::slice},
    Codec{"affine", "MLX-compatible affine: w = scale * q + bias per group, 2-8 bits", affine::validate, affine::arrays,
          affine::check_content, affine::decode_rows, affine::encode, affine::slice, affine::quantize_column},
    Codec{"trellis", "QTIP-style tail-biting bitshift trellis (1MAD / 3INST codes), Hadamard-rotated, 1-4 bits",
          trellis::validate, trellis::arrays, trellis::check_content, trellis::decode_rows, trellis::encode,
          trellis::slice},
    Codec{"offset_scale", "seed 001 q3 / q3_full8 / q4: w = scale * (q - offset) per group of 64, f16 scales",
          offset_scale::validate, offset_scale::arrays, offset_scale::check_content, offset_scale::decode_rows,
          offset_scale::encode, offset_scale::slice, offset_scale::quantize_column},
    Codec{"two_plane", "seed 000 five-state: sum of two 2-bit affine planes per group of 128", two_plane::validate,
          two_plane::arrays, two_plane::check_content, two_plane::decode_rows, two_plane::encode, two_plane::slice,
          two_plane::quantize_column},
};

// Every function is a constructor argument, so completeness is checked by the compiler; ids must be unique.
consteval bool ids_unique_and_named() {
  for (size_t i = 0; i < kCodecs.size(); ++i) {
    if (kCodecs[i].id.empty() || kCodecs[i].summary.empty()) return false;
    for (size_t j = i + 1; j < kCodecs.size(); ++j)
      if (kCodecs[i].id == kCodecs[j].id) return false;
  }
  return true;
}
static_assert(ids_unique_and_named(), "every codec row needs a unique id and a summary");

}  // namespace

const TensorView& ArrayViews::at(std::string_view role) const {
  for (const auto& [name, view] : items)
    if (name == role) return view;
  fail(Errc::internal, "[codec] array '{}' missing from views", role);
}

ArrayViews EncodedTensor::views() const {
  ArrayViews v;
  for (const auto& [role, buffer] : arrays) v.items.emplace_back(role, buffer.view());
  return v;
}

std::span<const Codec> all_codecs() { return kCodecs; }

const Codec* find_codec(std::string_view id) {
  for (const Codec& c : kCodecs)
    if (c.id == id) return &c;
  return nullptr;
}

const Codec& codec_or_throw(std::string_view id, std::string_view context) {
  const Codec* c = find_codec(id);
  if (!c) fail(Errc::unknown_codec, "{}: unknown codec '{}'", context, id);
  return *c;
}

std::pair<int64_t, int64_t> matrix_dims(const Shape& shape) {
  if (shape.empty()) return {1, 1};
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
  return {rows, shape.back()};
}

double bits_per_weight(const Codec& codec, const Params& params, const Shape& shape) {
  uint64_t bits = 0;
  for (const ArraySpec& a : codec.arrays(params, shape))
    bits += checked_numel(a.shape, "[bits_per_weight]") * dtype_size(a.dtype) * 8;
  const uint64_t n = checked_numel(shape, "[bits_per_weight]");
  return n == 0 ? 0.0 : static_cast<double>(bits) / static_cast<double>(n);
}

void validate_tensor(const TensorRef& tensor, std::string_view context) {
  const Codec& codec = *tensor.codec;
  try {
    codec.validate(tensor.params, tensor.shape);
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("{}: {}", context, e.what()));
  }
  const auto specs = codec.arrays(tensor.params, tensor.shape);
  if (specs.size() != tensor.arrays.items.size())
    fail(Errc::shape, "{}: codec '{}' stores {} arrays, found {}", context, codec.id, specs.size(),
         tensor.arrays.items.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto& [role, view] = tensor.arrays.items[i];
    const ArraySpec& spec = specs[i];
    if (role != spec.role)
      fail(Errc::shape, "{}: array {} is '{}', codec '{}' expects '{}'", context, i, role, codec.id, spec.role);
    if (view.dtype != spec.dtype)
      fail(Errc::dtype, "{}: array '{}' has dtype {}, codec '{}' expects {}", context, role, dtype_name(view.dtype),
           codec.id, dtype_name(spec.dtype));
    if (view.shape != spec.shape)
      fail(Errc::shape, "{}: array '{}' has shape {}, codec '{}' expects {}", context, role, shape_str(view.shape),
           codec.id, shape_str(spec.shape));
    const uint64_t bytes = checked_mul(checked_numel(spec.shape, context), dtype_size(spec.dtype), context);
    if (view.bytes.size() != bytes)
      fail(Errc::truncated, "{}: array '{}' holds {} bytes, expected {}", context, role, view.bytes.size(), bytes);
  }
  try {
    codec.check_content(tensor.params, tensor.shape, tensor.arrays);
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("{}: {}", context, e.what()));
  }
}

SlicedTensor slice_tensor(const TensorRef& tensor, Axis axis, std::span<const Range> ranges, std::string_view context) {
  if (tensor.shape.size() != 2)
    fail(Errc::shape, "{}: only a rank-2 tensor can be sliced, shape is {}", context, shape_str(tensor.shape));
  const int64_t n = tensor.shape[axis == Axis::rows ? 0 : 1];
  int64_t last = 0;
  for (const Range& r : ranges)
    if (r.begin < last || r.end <= r.begin || r.end > n)
      fail(Errc::shape, "{}: slice {}..{} is empty, out of order or outside 0..{}", context, r.begin, r.end, n);
    else
      last = r.end;
  if (ranges.empty()) fail(Errc::shape, "{}: a slice needs at least one range", context);
  SlicedTensor out;
  out.shape = tensor.shape;
  out.shape[axis == Axis::rows ? 0 : 1] = total(ranges);
  try {
    out.tensor = tensor.codec->slice(tensor.params, tensor.shape, tensor.arrays, axis, ranges);
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("{}: {}", context, e.what()));
  }
  validate_tensor({tensor.codec, out.tensor.params, out.shape, out.tensor.views()}, context);
  return out;
}

std::vector<float> decode_all(const TensorRef& tensor) {
  const auto [rows, cols] = matrix_dims(tensor.shape);
  std::vector<float> out(checked_mul(static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), "[decode_all]"));
  tensor.codec->decode_rows(tensor.params, tensor.shape, tensor.arrays, 0, rows, out.data());
  return out;
}

}  // namespace lowbit::codec
