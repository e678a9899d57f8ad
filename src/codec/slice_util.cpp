#include "slice_util.h"

#include <cstring>

#include "lowbit/core/error.h"

namespace lowbit::codec {

TensorBuffer slice_axis(const TensorView& a, size_t axis, std::span<const Range> ranges) {
  int64_t outer = 1, inner = 1;
  for (size_t i = 0; i < axis; ++i) outer *= a.shape[i];
  for (size_t i = axis + 1; i < a.shape.size(); ++i) inner *= a.shape[i];
  const int64_t n = a.shape[axis];
  Shape shape = a.shape;
  shape[axis] = total(ranges);
  TensorBuffer out = make_buffer(a.dtype, shape);
  const size_t unit = static_cast<size_t>(inner) * dtype_size(a.dtype);
  std::byte* dst = out.bytes.data();
  for (int64_t o = 0; o < outer; ++o)
    for (const Range& r : ranges) {
      const size_t bytes = static_cast<size_t>(r.end - r.begin) * unit;
      std::memcpy(dst, a.bytes.data() + static_cast<size_t>(o * n + r.begin) * unit, bytes);
      dst += bytes;
    }
  return out;
}

std::vector<Range> unit_ranges(std::span<const Range> ranges, int64_t width, int64_t padded, int64_t unit,
                               std::string_view codec_id, std::string_view what) {
  std::vector<Range> units;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const Range& r = ranges[i];
    const bool last_to_end = i + 1 == ranges.size() && r.end == width;
    if (r.begin % unit != 0 || (r.end % unit != 0 && !last_to_end))
      fail(Errc::shape, "[{}] slice {}..{} cuts a {} of {}{}", codec_id, r.begin, r.end, what, unit,
           r.end == width ? " (only the last range may end at the padded width)" : "");
    units.push_back({r.begin / unit, (last_to_end ? padded : r.end) / unit});
  }
  return units;
}

std::vector<Range> scaled(std::span<const Range> ranges, int64_t factor) {
  std::vector<Range> out;
  for (const Range& r : ranges) out.push_back({r.begin * factor, r.end * factor});
  return out;
}

int64_t total(std::span<const Range> ranges) {
  int64_t n = 0;
  for (const Range& r : ranges) n += r.end - r.begin;
  return n;
}

EncodedTensor slice_grouped(const Params& params, const Shape& shape, const ArrayViews& arrays, Axis axis,
                            std::span<const Range> ranges, int64_t padded, int64_t group, std::string_view codec_id,
                            ArrayCut (*cut)(const Params& params, const Shape& shape, std::string_view role)) {
  const int64_t cols = shape[1];
  const std::vector<Range> groups =
      axis == Axis::cols ? unit_ranges(ranges, cols, padded, group, codec_id, "group") : std::vector<Range>{};
  EncodedTensor out;
  out.params = axis == Axis::cols ? with_param(params, "padded_cols", total(groups) * group) : params;
  for (const auto& [role, view] : arrays.items) {
    const ArrayCut c = cut(params, shape, role);
    const Range whole{0, view.shape[0]};
    if (!c.per_row || (axis == Axis::cols && c.per_group == 0))
      out.arrays.emplace_back(role, slice_axis(view, 0, std::span(&whole, 1)));
    else if (axis == Axis::rows)
      out.arrays.emplace_back(role, slice_axis(view, 0, ranges));
    else
      out.arrays.emplace_back(role, slice_axis(view, 1, scaled(groups, c.per_group)));
  }
  return out;
}

Params with_param(const Params& params, std::string_view key, int64_t value) {
  Params out = params;
  if (out.contains(std::string(key))) out[std::string(key)] = value;
  return out;
}

}  // namespace lowbit::codec
