#include "lowbit/codec/offset_scale.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>

#include "lowbit/codec/params.h"
#include "lowbit/core/checked.h"
#include "lowbit/core/error.h"
#include "lowbit/core/thread_pool.h"
#include "slice_util.h"

namespace lowbit::codec::offset_scale {

namespace {

constexpr std::array<Grid, 3> kGrids{{
    {"q3", "uniform_lsb", 3, 3, 6},
    {"q3_full8", "uniform_lsb_full8", 3, 4, 7},
    {"q4", "uniform_lsb", 4, 7, 14},
}};

// The grid object seed 001 requires, verbatim, on q3_full8 records.
Params full8_grid() {
  return {{"bits", 3},         {"zero_point", 4},  {"max_code", 7},
          {"padding_code", 4}, {"signed_min", -4}, {"signed_max", 3},
          {"inference_permutation_required", false}};
}

const Grid& grid_named(std::string_view precision) {
  for (const Grid& g : kGrids)
    if (g.precision == precision) return g;
  fail(Errc::internal, "[offset_scale] unknown precision '{}'", precision);
}

// Params without the object-valued "grid" key, which ParamReader does not read; it is checked here.
Params checked_without_grid(const Params& params, const Grid& grid) {
  Params rest = params;
  const auto it = params.find("grid");
  if (it == params.end()) return rest;
  if (grid.precision != "q3_full8")
    fail(Errc::codec_params, "[offset_scale] param 'grid' is only allowed with precision q3_full8");
  if (*it != full8_grid()) fail(Errc::codec_params, "[offset_scale] param 'grid' = {} differs from {}", it->dump(),
                                full8_grid().dump());
  rest.erase("grid");
  return rest;
}

float scale_of(const uint16_t* scales, int64_t groups, int64_t row, int64_t col) {
  return f16_to_f32(scales[row * groups + col / kGroupSize]);
}

// f16 bits of a positive finite scale nearest to `s` (never 0, never infinite).
uint16_t storable_scale(float s) {
  if (!(s > 0.0f)) return f32_to_f16(1.0f);
  const uint16_t h = f32_to_f16(s);
  if (h == 0) return 1;                 // underflow: smallest positive subnormal
  if (h >= 0x7c00u) return 0x7bffu;     // overflow: largest finite
  return h;
}

uint32_t nearest_code(const Grid& g, float w, float s) {
  const float lo = -static_cast<float>(g.offset), hi = static_cast<float>(g.max_code - g.offset);
  const float q = std::clamp(std::nearbyint(w / s), lo, hi);
  return static_cast<uint32_t>(q + static_cast<float>(g.offset));
}

float value_of(const Grid& g, uint32_t code, float s) {
  return s * static_cast<float>(static_cast<int32_t>(code) - static_cast<int32_t>(g.offset));
}

// Squared error of one group's weights w[0, n) on the grid with scale s (importance-weighted when given).
double group_error(const Grid& g, const float* w, const float* importance, int64_t n, float s) {
  double e = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    const double d = w[j] - value_of(g, nearest_code(g, w[j], s), s);
    e += (importance ? importance[j] : 1.0) * d * d;
  }
  return e;
}

// The scale of one group: its largest magnitude on the outermost level; with search, the best of a ladder of
// shrunken scales (clipping the extremes) by squared error.
uint16_t choose_scale(const Grid& g, const float* w, const float* importance, int64_t n, bool search) {
  float w_min = 0.0f, w_max = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    w_min = std::min(w_min, w[j]);
    w_max = std::max(w_max, w[j]);
  }
  const float rtn = std::max(w_max / static_cast<float>(g.max_code - g.offset), -w_min / static_cast<float>(g.offset));
  uint16_t best = storable_scale(rtn);
  if (!search || !(rtn > 0.0f)) return best;
  double best_error = group_error(g, w, importance, n, f16_to_f32(best));
  constexpr int kSteps = 20;
  for (int k = 1; k < kSteps; ++k) {
    const uint16_t h = storable_scale(rtn * (1.0f - 0.4f * static_cast<float>(k) / kSteps));
    const double e = group_error(g, w, importance, n, f16_to_f32(h));
    if (e < best_error) best = h, best_error = e;
  }
  return best;
}

void for_rows(ThreadPool* pool, int64_t rows, const std::function<void(size_t, size_t)>& fn) {
  if (pool)
    pool->parallel_for(static_cast<size_t>(rows), 8, fn);
  else
    fn(0, static_cast<size_t>(rows));
}

}  // namespace

Layout layout(const Params& params, const Shape& shape) {
  if (!params.is_object()) fail(Errc::codec_params, "[offset_scale] params must be a JSON object");
  ParamReader precision_reader(params, "offset_scale");
  const Grid& grid = grid_named(precision_reader.choice("precision", {"q3", "q3_full8", "q4"}));
  const Params rest = checked_without_grid(params, grid);
  if (shape.size() != 2) fail(Errc::shape, "[offset_scale] shape {} is not rank 2", shape_str(shape));
  if (shape[0] < 1 || shape[0] > kMaxRows || shape[1] < 1 || shape[1] > kMaxCols)
    fail(Errc::limit, "[offset_scale] shape {} outside [1, {}] x [1, {}]", shape_str(shape), kMaxRows, kMaxCols);
  ParamReader r(rest, "offset_scale");
  r.choice("precision", {grid.precision});
  r.integer_or("group_size", kGroupSize, {kGroupSize});
  r.choice_or("encoding", grid.encoding, {grid.encoding});
  Layout l{grid, shape[0], shape[1], r.padded_cols(shape[1], kGroupSize)};
  r.finish();
  return l;
}

void validate(const Params& params, const Shape& shape) { layout(params, shape); }

std::vector<ArraySpec> arrays(const Params& params, const Shape& shape) {
  const Layout l = layout(params, shape);
  return {{"codes", DType::U8, {l.rows, l.row_bytes()}}, {"scales", DType::F16, {l.rows, l.groups_per_row()}}};
}

void check_content(const Params& params, const Shape& shape, const ArrayViews& arrays) {
  const Layout l = layout(params, shape);
  const auto* scales = arrays.at("scales").as<uint16_t>();
  const int64_t groups = l.groups_per_row();
  for (int64_t i = 0; i < l.rows * groups; ++i) {
    const float s = f16_to_f32(scales[i]);
    if (!std::isfinite(s) || !(s > 0.0f))
      fail(Errc::non_finite, "[offset_scale] scales[{}, {}] = {} is not finite and > 0", i / groups, i % groups, s);
  }
  const auto* codes = arrays.at("codes").as<uint8_t>();
  for (int64_t r = 0; r < l.rows; ++r) {
    const uint8_t* row = codes + r * l.row_bytes();
    for (int64_t c = 0; c < l.padded_cols; ++c) {
      const uint32_t q = read_code(row, c, l.grid.bits);
      if (q > l.grid.max_code)
        fail(Errc::reserved_code, "[offset_scale] codes[{}, {}] = {} is reserved (precision {} allows 0..{})", r, c,
             q, l.grid.precision, l.grid.max_code);
      if (c >= l.cols && q != l.grid.offset)
        fail(Errc::reserved_code, "[offset_scale] padding codes[{}, {}] = {}, expected the zero point {}", r, c, q,
             l.grid.offset);
    }
  }
}

void decode_rows(const Params& params, const Shape& shape, const ArrayViews& arrays, int64_t row_begin,
                 int64_t row_end, float* out) {
  const Layout l = layout(params, shape);
  const auto* codes = arrays.at("codes").as<uint8_t>();
  const auto* scales = arrays.at("scales").as<uint16_t>();
  for (int64_t r = row_begin; r < row_end; ++r) {
    const uint8_t* row = codes + r * l.row_bytes();
    for (int64_t c = 0; c < l.cols; ++c)
      *out++ = value_of(l.grid, read_code(row, c, l.grid.bits), scale_of(scales, l.groups_per_row(), r, c));
  }
}

EncodedTensor encode(const Params& params, const Shape& shape, const float* weights, const EncodeOptions& options) {
  const Layout l = layout(params, shape);
  if (!options.column_importance.empty() && static_cast<int64_t>(options.column_importance.size()) != l.cols)
    fail(Errc::shape, "[offset_scale] column importance has {} entries for {} columns",
         options.column_importance.size(), l.cols);
  const float* importance = options.column_importance.empty() ? nullptr : options.column_importance.data();
  TensorBuffer codes = make_buffer(DType::U8, {l.rows, l.row_bytes()});
  TensorBuffer scales = make_buffer(DType::F16, {l.rows, l.groups_per_row()});
  for_rows(options.pool, l.rows, [&](size_t r0, size_t r1) {
    for (auto r = static_cast<int64_t>(r0); r < static_cast<int64_t>(r1); ++r) {
      const float* w = weights + r * l.cols;
      uint8_t* row = codes.as<uint8_t>() + r * l.row_bytes();
      for (int64_t g = 0; g < l.groups_per_row(); ++g) {
        const int64_t c0 = g * kGroupSize, n = std::clamp<int64_t>(l.cols - c0, 0, kGroupSize);
        const uint16_t h = choose_scale(l.grid, w + c0, importance ? importance + c0 : nullptr, n, options.search);
        scales.as<uint16_t>()[r * l.groups_per_row() + g] = h;
        for (int64_t j = 0; j < kGroupSize; ++j)
          write_code(row, c0 + j, l.grid.bits, j < n ? nearest_code(l.grid, w[c0 + j], f16_to_f32(h)) : l.grid.offset);
      }
    }
  });
  EncodedTensor out;
  out.params = {{"precision", l.grid.precision},
                {"group_size", kGroupSize},
                {"padded_cols", l.padded_cols},
                {"encoding", l.grid.encoding}};
  if (l.grid.precision == "q3_full8") out.params["grid"] = full8_grid();
  out.arrays.emplace_back("codes", std::move(codes));
  out.arrays.emplace_back("scales", std::move(scales));
  return out;
}

void quantize_column(const Params& params, const Shape& shape, EncodedTensor& tensor, int64_t col,
                     const float* values, float* out) {
  const Layout l = layout(params, shape);
  if (col < 0 || col >= l.cols) fail(Errc::shape, "[offset_scale] column {} outside [0, {})", col, l.cols);
  auto* codes = tensor.arrays.at(0).second.as<uint8_t>();
  const auto* scales = tensor.arrays.at(1).second.as<uint16_t>();
  for (int64_t r = 0; r < l.rows; ++r) {
    const float s = scale_of(scales, l.groups_per_row(), r, col);
    const uint32_t q = nearest_code(l.grid, values[r], s);
    write_code(codes + r * l.row_bytes(), col, l.grid.bits, q);
    out[r] = value_of(l.grid, q, s);
  }
}

EncodedTensor slice(const Params& params, const Shape& shape, const ArrayViews& arrays, Axis axis,
                    std::span<const Range> ranges) {
  const Layout l = layout(params, shape);
  return slice_grouped(params, shape, arrays, axis, ranges, l.padded_cols, kGroupSize, "offset_scale",
                       [](const Params& p, const Shape& s, std::string_view role) {
                         const Layout g = layout(p, s);
                         return ArrayCut{.per_row = true,
                                         .per_group = role == "codes" ? kGroupSize * g.grid.bits / 8 : 1};
                       });
}

}  // namespace lowbit::codec::offset_scale
