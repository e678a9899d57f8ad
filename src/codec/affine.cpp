#include "lowbit/codec/affine.h"

#include <algorithm>
#include <cmath>

#include "lowbit/codec/params.h"
#include "lowbit/core/checked.h"
#include "lowbit/core/error.h"
#include "lowbit/core/thread_pool.h"
#include "slice_util.h"

namespace lowbit::codec::affine {

namespace {

constexpr int64_t kMaxCols = int64_t{1} << 40;  // keeps padded_cols * bits far from overflow

std::string_view scale_dtype_param(DType t) {
  switch (t) {
    case DType::F16: return "f16";
    case DType::F32: return "f32";
    default: return "bf16";
  }
}

Params normalized_params(const Layout& l) {
  return Params{{"bits", l.bits},
                {"group_size", l.group_size},
                {"scale_dtype", scale_dtype_param(l.scale_dtype)},
                {"padded_cols", l.padded_cols}};
}

// Stored value of f after a round trip through the scale dtype.
float stored(DType t, float f) {
  unsigned char buf[8] = {};
  store_float(t, buf, 0, f);
  return load_float(t, buf, 0);
}

float code_for(float w, float scale, float bias, float max_code) {
  if (scale == 0.0f) return 0.0f;
  return std::clamp(std::rint((w - bias) / scale), 0.0f, max_code);
}

// One group's real values (padding excluded) and their importance weights.
struct GroupData {
  const float* w;
  const float* importance;  // nullptr: all 1
  int64_t n;
  float weight(int64_t i) const { return importance ? importance[i] : 1.0f; }
};

double group_error(const GroupData& g, float scale, float bias, float max_code) {
  double err = 0;
  for (int64_t i = 0; i < g.n; ++i) {
    const float d = g.w[i] - (scale * code_for(g.w[i], scale, bias, max_code) + bias);
    err += static_cast<double>(g.weight(i)) * d * d;
  }
  return err;
}

// Weighted least-squares scale and bias for the codes the current (scale, bias) assign.
GroupParams refit(const GroupData& g, GroupParams p, float max_code) {
  double s1 = 0, sq = 0, sqq = 0, sw = 0, swq = 0;
  for (int64_t i = 0; i < g.n; ++i) {
    const double wt = g.weight(i), q = code_for(g.w[i], p.scale, p.bias, max_code);
    s1 += wt, sq += wt * q, sqq += wt * q * q, sw += wt * g.w[i], swq += wt * g.w[i] * q;
  }
  const double det = sqq * s1 - sq * sq;
  if (!(std::abs(det) > 1e-12 * std::max(1.0, sqq * s1))) return p;
  return {static_cast<float>((swq * s1 - sq * sw) / det), static_cast<float>((sqq * sw - sq * swq) / det)};
}

// Search over clipping ranges: shrink [min, max] toward its centre by each factor of a grid, take MLX's
// parameters for the clipped range, refit the best by least squares; scores use the stored (rounded) values.
GroupParams search_group(const GroupData& g, float w_min, float w_max, int bits, DType dt) {
  const float max_code = static_cast<float>((1u << bits) - 1u);
  auto rounded = [&](GroupParams p) { return GroupParams{stored(dt, p.scale), stored(dt, p.bias)}; };
  GroupParams best = rounded(mlx_group_params(w_min, w_max, bits));
  double best_err = group_error(g, best.scale, best.bias, max_code);
  const float mid = 0.5f * (w_min + w_max), half = 0.5f * (w_max - w_min);
  for (int k = 1; k <= 15; ++k) {
    const float t = 1.0f - 0.03f * static_cast<float>(k);
    const GroupParams p = rounded(mlx_group_params(mid - t * half, mid + t * half, bits));
    const double err = group_error(g, p.scale, p.bias, max_code);
    if (err < best_err) best = p, best_err = err;
  }
  const GroupParams fit = rounded(refit(g, best, max_code));
  if (std::isfinite(fit.scale) && std::isfinite(fit.bias) && group_error(g, fit.scale, fit.bias, max_code) < best_err)
    best = fit;
  return best;
}

void check_encode_inputs(const Layout& l, const float* weights, const EncodeOptions& options) {
  const int64_t n = l.rows * l.cols;
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(weights[i]))
      fail(Errc::non_finite, "[affine] encode: weight [{}, {}] is not finite", i / l.cols, i % l.cols);
  if (options.column_importance.empty()) return;
  if (static_cast<int64_t>(options.column_importance.size()) != l.cols)
    fail(Errc::shape, "[affine] encode: column_importance has {} entries for {} columns",
         options.column_importance.size(), l.cols);
  for (size_t c = 0; c < options.column_importance.size(); ++c)
    if (!(options.column_importance[c] >= 0.0f) || !std::isfinite(options.column_importance[c]))
      fail(Errc::non_finite, "[affine] encode: column_importance[{}] must be finite and >= 0", c);
}

struct EncodeTarget {
  uint32_t* codes;
  std::byte* scales;
  std::byte* biases;
};

void encode_row(const Layout& l, const float* row, int64_t r, const EncodeOptions& options, EncodeTarget out) {
  const float max_code = static_cast<float>(l.max_code());
  uint32_t* words = out.codes + r * l.words_per_row();
  // Groups past the last real column (3 bits in groups of 16 pad to pairs of groups) keep code, scale and bias 0.
  for (int64_t g = 0; g * l.group_size < l.cols; ++g) {
    const int64_t c0 = g * l.group_size, c1 = std::min(l.cols, c0 + l.group_size);
    const GroupData data{row + c0, options.column_importance.empty() ? nullptr : options.column_importance.data() + c0,
                         c1 - c0};
    const auto [lo, hi] = std::minmax_element(data.w, data.w + data.n);
    GroupParams p = options.search ? search_group(data, *lo, *hi, l.bits, l.scale_dtype)
                                   : mlx_group_params(*lo, *hi, l.bits);
    // MLX assigns codes with the f32 parameters and rounds them only on store; the search assigns them with the
    // stored values it scored.
    for (int64_t c = c0; c < c1; ++c)
      write_code(words, c, l.bits, static_cast<uint32_t>(code_for(row[c], p.scale, p.bias, max_code)));
    const size_t idx = static_cast<size_t>(r * l.groups_per_row() + g);
    store_float(l.scale_dtype, out.scales, idx, p.scale);
    store_float(l.scale_dtype, out.biases, idx, p.bias);
    if (!std::isfinite(load_float(l.scale_dtype, out.scales, idx)) ||
        !std::isfinite(load_float(l.scale_dtype, out.biases, idx)))
      fail(Errc::non_finite, "[affine] encode: row {} group {}: scale or bias overflows {}", r, g,
           dtype_name(l.scale_dtype));
  }
}

}  // namespace

GroupParams mlx_group_params(float w_min, float w_max, int bits) {
  const float n_bins = static_cast<float>((1 << bits) - 1);
  const bool min_dominates = std::abs(w_min) > std::abs(w_max);
  float scale = std::max((w_max - w_min) / n_bins, 1e-7f);
  if (!min_dominates) scale = -scale;
  const float edge = min_dominates ? w_min : w_max;
  const float q0 = std::rint(edge / scale);
  if (q0 == 0.0f) return {scale, 0.0f};
  return {edge / q0, edge};
}

Layout layout(const Params& params, const Shape& shape) {
  ParamReader r(params, "affine");
  Layout l;
  l.bits = static_cast<int>(r.integer("bits", {2, 3, 4, 5, 6, 8}));
  l.group_size = r.integer("group_size", {16, 32, 64, 128});
  // Groups of 16 exist for GGUF's Q2_K, Q3_K and Q6_K (2-, 3- and 6-bit codes, a scale per 16 weights),
  // re-expressed at load; the kernels have no other bit width in groups of 16.
  if (l.group_size == 16 && l.bits != 2 && l.bits != 3 && l.bits != 6)
    fail(Errc::codec_params, "[affine] group_size 16 needs bits 2, 3 or 6 (got {})", l.bits);
  l.scale_dtype = scale_dtype_from_name(r.choice("scale_dtype", {"bf16", "f16", "f32"}));
  if (shape.size() != 2) fail(Errc::shape, "[affine] shape {} must have rank 2", shape_str(shape));
  if (shape[0] < 1 || shape[1] < 1 || shape[1] > kMaxCols)
    fail(Errc::shape, "[affine] shape {} needs rows >= 1 and 1 <= cols <= 2^40", shape_str(shape));
  l.rows = shape[0];
  l.cols = shape[1];
  l.padded_cols = r.padded_cols(l.cols, l.unit_cols());
  r.finish();
  return l;
}

void validate(const Params& params, const Shape& shape) {
  const Layout l = layout(params, shape);
  checked_mul(static_cast<uint64_t>(l.rows), static_cast<uint64_t>(l.padded_cols), "[affine] shape");
}

std::vector<ArraySpec> arrays(const Params& params, const Shape& shape) {
  const Layout l = layout(params, shape);
  return {{"codes", DType::U32, {l.rows, l.words_per_row()}},
          {"scales", l.scale_dtype, {l.rows, l.groups_per_row()}},
          {"biases", l.scale_dtype, {l.rows, l.groups_per_row()}}};
}

void check_content(const Params& params, const Shape& shape, const ArrayViews& arrays) {
  const Layout l = layout(params, shape);
  for (const char* role : {"scales", "biases"}) {
    const TensorView& v = arrays.at(role);
    const size_t n = static_cast<size_t>(l.rows * l.groups_per_row());
    for (size_t i = 0; i < n; ++i)
      if (!std::isfinite(load_float(v.dtype, v.bytes.data(), i)))
        fail(Errc::non_finite, "[affine] {}[{}, {}] is not finite", role, i / l.groups_per_row(),
             i % l.groups_per_row());
  }
  // Padding is never data: its codes must be zero so that every stored bit is accounted for.
  const auto* codes = arrays.at("codes").as<uint32_t>();
  for (int64_t r = 0; r < l.rows; ++r)
    for (int64_t c = l.cols; c < l.padded_cols; ++c)
      if (read_code(codes + r * l.words_per_row(), c, l.bits) != 0)
        fail(Errc::reserved_code, "[affine] codes row {}: padding column {} holds a nonzero code", r, c);
}

void decode_rows(const Params& params, const Shape& shape, const ArrayViews& arrays, int64_t row_begin,
                 int64_t row_end, float* out) {
  const Layout l = layout(params, shape);
  const auto* codes = arrays.at("codes").as<uint32_t>();
  const TensorView& scales = arrays.at("scales");
  const TensorView& biases = arrays.at("biases");
  for (int64_t r = row_begin; r < row_end; ++r) {
    const uint32_t* words = codes + r * l.words_per_row();
    for (int64_t c = 0; c < l.cols; ++c) {
      const size_t g = static_cast<size_t>(r * l.groups_per_row() + c / l.group_size);
      const float s = load_float(scales.dtype, scales.bytes.data(), g);
      const float b = load_float(biases.dtype, biases.bytes.data(), g);
      *out++ = s * static_cast<float>(read_code(words, c, l.bits)) + b;
    }
  }
}

EncodedTensor encode(const Params& params, const Shape& shape, const float* weights, const EncodeOptions& options) {
  const Layout l = layout(params, shape);
  validate(params, shape);
  check_encode_inputs(l, weights, options);
  EncodedTensor out;
  out.params = normalized_params(l);
  out.arrays.emplace_back("codes", make_buffer(DType::U32, {l.rows, l.words_per_row()}));
  out.arrays.emplace_back("scales", make_buffer(l.scale_dtype, {l.rows, l.groups_per_row()}));
  out.arrays.emplace_back("biases", make_buffer(l.scale_dtype, {l.rows, l.groups_per_row()}));
  const EncodeTarget target{out.arrays[0].second.as<uint32_t>(), out.arrays[1].second.bytes.data(),
                            out.arrays[2].second.bytes.data()};
  auto rows = [&](size_t r0, size_t r1) {
    for (size_t r = r0; r < r1; ++r)
      encode_row(l, weights + static_cast<int64_t>(r) * l.cols, static_cast<int64_t>(r), options, target);
  };
  if (options.pool)
    options.pool->parallel_for(static_cast<size_t>(l.rows), 8, rows);
  else
    rows(0, static_cast<size_t>(l.rows));
  return out;
}

void quantize_column(const Params& params, const Shape& shape, EncodedTensor& tensor, int64_t col,
                     const float* values, float* out) {
  const Layout l = layout(params, shape);
  if (col < 0 || col >= l.cols) fail(Errc::shape, "[affine] quantize_column: column {} outside [0, {})", col, l.cols);
  auto* codes = tensor.arrays.at(0).second.as<uint32_t>();
  const TensorBuffer& scales = tensor.arrays.at(1).second;
  const TensorBuffer& biases = tensor.arrays.at(2).second;
  const float max_code = static_cast<float>(l.max_code());
  for (int64_t r = 0; r < l.rows; ++r) {
    if (!std::isfinite(values[r])) fail(Errc::non_finite, "[affine] quantize_column: value at row {} is not finite", r);
    const size_t g = static_cast<size_t>(r * l.groups_per_row() + col / l.group_size);
    const float s = load_float(scales.dtype, scales.bytes.data(), g);
    const float b = load_float(biases.dtype, biases.bytes.data(), g);
    const float q = code_for(values[r], s, b, max_code);
    write_code(codes + r * l.words_per_row(), col, l.bits, static_cast<uint32_t>(q));
    out[r] = s * q + b;
  }
}

EncodedTensor slice(const Params& params, const Shape& shape, const ArrayViews& arrays, Axis axis,
                    std::span<const Range> ranges) {
  const Layout l = layout(params, shape);
  // Cut in units of whole words (unit_cols): a "group" of slice_grouped is one unit.
  return slice_grouped(params, shape, arrays, axis, ranges, l.padded_cols, l.unit_cols(), "affine",
                       [](const Params& p, const Shape& s, std::string_view role) {
                         const Layout g = layout(p, s);
                         return ArrayCut{
                             .per_row = true,
                             .per_group = role == "codes" ? g.unit_cols() * g.bits / 32 : g.unit_cols() / g.group_size};
                       });
}

}  // namespace lowbit::codec::affine
