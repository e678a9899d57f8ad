// What the codecs' slice functions share: cutting one axis of a stored array, and mapping column ranges of a
// logical matrix onto whole groups or tiles.
#pragma once

#include <span>
#include <string_view>
#include <vector>

#include "lowbit/codec/codec.h"

namespace lowbit::codec {

// The array viewed as [outer, shape[axis], inner]: keeps `ranges` of the middle axis (in its units), concatenated.
TensorBuffer slice_axis(const TensorView& a, size_t axis, std::span<const Range> ranges);

// The ranges of a logical axis of `width` (stored padded to `padded`) in units of `unit` (a group, a tile): each
// range must begin on a unit boundary and end on one or, for the last range only, at `width` (taking the padding
// with it). Errc::shape naming `codec_id`, `what` and the range otherwise.
std::vector<Range> unit_ranges(std::span<const Range> ranges, int64_t width, int64_t padded, int64_t unit,
                               std::string_view codec_id, std::string_view what);

// Every range multiplied by `factor` (units to array elements).
std::vector<Range> scaled(std::span<const Range> ranges, int64_t factor);

// The summed width of the ranges.
int64_t total(std::span<const Range> ranges);

// How one stored array of a row-major grouped codec follows the logical matrix: per_row arrays have the rows as
// their leading axis, the rest are copied whole (a global scale); along the columns a per_row array holds
// `per_group` units of its second axis per group (0: nothing per column, e.g. a per-row scale, copied whole).
struct ArrayCut {
  bool per_row = true;
  int64_t per_group = 0;
};
// Codec::slice for codecs whose arrays are rows of whole groups of `group` columns (dense: groups of 1), the
// logical width `cols` stored padded to `padded`; `cut` says how each array (by role) follows. The params keep
// their keys, "padded_cols" updated.
EncodedTensor slice_grouped(const Params& params, const Shape& shape, const ArrayViews& arrays, Axis axis,
                            std::span<const Range> ranges, int64_t padded, int64_t group, std::string_view codec_id,
                            ArrayCut (*cut)(const Params& params, const Shape& shape, std::string_view role));

// params with `key` set to `value` when params holds it (optional padding keys: absent stays absent).
Params with_param(const Params& params, std::string_view key, int64_t value);

}  // namespace lowbit::codec
