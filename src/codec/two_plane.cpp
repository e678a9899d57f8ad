#include "lowbit/codec/two_plane.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "lowbit/codec/affine.h"
#include "lowbit/codec/offset_scale.h"  // the LSB-first byte-stream code helpers trit3 shares
#include "lowbit/codec/params.h"
#include "lowbit/core/checked.h"
#include "lowbit/core/error.h"
#include "lowbit/core/thread_pool.h"
#include "slice_util.h"

namespace lowbit::codec::two_plane {

namespace {

constexpr std::array<uint32_t, 11> kPow5{1, 5, 25, 125, 625, 3125, 15625, 78125, 390625, 1953125, 9765625};
constexpr int kTrit3Bits = 3;
constexpr int kDigitsPerChunk = 10;

// A state's value on planes with scales (sb, sr) and biases -scale.
float state_value(int state, float sb, float sr) {
  const int b = std::clamp(state, -1, 1);
  return sb * static_cast<float>(b) + sr * static_cast<float>(state - b);
}

int nearest_state(float w, float sb, float sr) {
  int best = 0;
  float best_d = std::fabs(w);
  for (int s = -2; s <= 2; ++s) {
    const float d = std::fabs(w - state_value(s, sb, sr));
    if (d < best_d) best = s, best_d = d;
  }
  return best;
}

float round_to(DType dtype, float x) {
  unsigned char bytes[8] = {};
  store_float(dtype, bytes, 0, x);
  return load_float(dtype, bytes, 0);
}

void for_rows(ThreadPool* pool, int64_t rows, const std::function<void(size_t, size_t)>& fn) {
  if (pool)
    pool->parallel_for(static_cast<size_t>(rows), 8, fn);
  else
    fn(0, static_cast<size_t>(rows));
}

// The four affine values of one group, as stored (rounded to the scale dtype); slim metadata expanded.
struct GroupMetadata {
  float base_scale, base_bias, residual_scale, residual_bias;
};

// The value digit d (state + 2) decodes to, computed exactly as decode_rows does.
float digit_value(const GroupMetadata& m, uint8_t d) {
  return (m.base_scale * static_cast<float>(kStateBase[d]) + m.base_bias) +
         (m.residual_scale * static_cast<float>(kStateResidual[d]) + m.residual_bias);
}

// The five decoded values of a group, by digit.
struct Levels {
  float v[5];
  explicit Levels(const GroupMetadata& m) {
    for (uint8_t d = 0; d < 5; ++d) v[d] = digit_value(m, d);
  }
  // The digit whose value is nearest to w, state 0 on ties; sets `value`.
  uint8_t nearest(float w, float& value) const {
    uint8_t best = kZeroDigit;
    value = v[kZeroDigit];
    for (uint8_t d = 0; d < 5; ++d)
      if (std::fabs(w - v[d]) < std::fabs(w - value)) best = d, value = v[d];
    return best;
  }
};

uint8_t nearest_digit(float w, const GroupMetadata& m, float& value) { return Levels(m).nearest(w, value); }

// Levels center + {-(sb + sr), -sb, 0, sb, sb + sr} as stored metadata: residual bias -sr, base bias center - sb
// (center 0 gives the biases = -scale of slim metadata and of a symmetric group).
GroupMetadata centered(DType dtype, double center, double sb, double sr) {
  const float base = round_to(dtype, static_cast<float>(sb)), residual = round_to(dtype, static_cast<float>(sr));
  return {base, round_to(dtype, static_cast<float>(center - base)), residual, -residual};
}

// The weights being encoded with their importance; error sums are importance-weighted.
struct Source {
  const float* weights;
  const float* importance;  // nullptr: uniform
  int64_t cols;
  double weight(int64_t c) const { return importance ? importance[c] : 1.0; }
};

// States and per-group metadata of the tensor being encoded.
struct Encoding {
  const Layout& l;
  std::vector<int8_t> states;        // [rows, cols]
  std::vector<GroupMetadata> grids;  // [rows, groups]

  GroupMetadata& grid(int64_t r, int64_t c) { return grids[r * l.groups_per_row() + c / kGroupSize]; }
  const GroupMetadata& grid(int64_t r, int64_t c) const { return grids[r * l.groups_per_row() + c / kGroupSize]; }

  // Reassigns the states of columns [c0, c1) of row r (all in one group) and returns their squared error.
  double assign(const Source& src, int64_t r, int64_t c0, int64_t c1) {
    const Levels levels(grid(r, c0));
    double e = 0.0;
    for (int64_t c = c0; c < c1; ++c) {
      const float w = src.weights[r * src.cols + c];
      float v;
      states[r * l.cols + c] = static_cast<int8_t>(levels.nearest(w, v) - kZeroDigit);
      const double d = w - v;
      e += src.weight(c) * d * d;
    }
    return e;
  }
  double assign_row(const Source& src, int64_t r) {
    double e = 0.0;
    for (int64_t c0 = 0; c0 < l.cols; c0 += kGroupSize) e += assign(src, r, c0, std::min(l.cols, c0 + kGroupSize));
    return e;
  }
};

// Squared error of a row with levels {0, +-a, +-2a}, and the a of a least-squares refit of its states.
std::pair<double, double> row_error_and_refit(const float* w, const Source& src, double a) {
  double e = 0.0, ws = 0.0, ss = 0.0;
  for (int64_t c = 0; c < src.cols; ++c) {
    const int s = a > 0.0 ? nearest_state(w[c], static_cast<float>(a), static_cast<float>(a)) : 0;
    const double d = w[c] - a * s;
    e += src.weight(c) * d * d;
    ws += src.weight(c) * w[c] * s;
    ss += src.weight(c) * s * s;
  }
  return {e, ss > 0.0 ? ws / ss : 0.0};
}

// The alpha of one row minimizing its squared error: the best of a ladder of fractions of max |w|, then Lloyd
// iterations (assign states, refit alpha) from it.
float best_alpha(const float* w, const Source& src) {
  float amax = 0.0f;
  for (int64_t c = 0; c < src.cols; ++c) amax = std::max(amax, std::fabs(w[c]));
  if (!(amax > 0.0f)) return 0.0f;
  double best_a = amax / 2.0, best_e = row_error_and_refit(w, src, best_a).first;
  constexpr int kLadder = 16;
  for (int k = 1; k < kLadder; ++k) {
    const double a = amax * k / (2.0 * kLadder);
    const double e = row_error_and_refit(w, src, a).first;
    if (e < best_e) best_a = a, best_e = e;
  }
  for (int it = 0; it < 4; ++it) {
    const double a = row_error_and_refit(w, src, best_a).second;
    const double e = row_error_and_refit(w, src, a).first;
    if (!(e < best_e)) break;
    best_a = a, best_e = e;
  }
  return static_cast<float>(best_a);
}

// Least-squares center and steps for the group's current states (w ~ center + sb * b + sr * q, b = clamp(s, -1,
// 1), q = s - b); a step no state uses keeps its value. False when nothing is left to fit.
bool refit_group(const Encoding& enc, const Source& src, int64_t r, int64_t c0, int64_t c1, const GroupMetadata& m,
                 double& center, double& sb, double& sr) {
  double n = 0, nb = 0, nq = 0, bb = 0, bq = 0, qq = 0, w1 = 0, wb = 0, wq = 0;
  for (int64_t c = c0; c < c1; ++c) {
    const int s = enc.states[r * enc.l.cols + c], b = std::clamp(s, -1, 1), q = s - b;
    const double w = src.weights[r * src.cols + c], k = src.weight(c);
    n += k, nb += k * b, nq += k * q, bb += k * b * b, bq += k * b * q, qq += k * q * q;
    w1 += k * w, wb += k * w * b, wq += k * w * q;
  }
  if (!(n > 0)) return false;
  sb = m.base_scale, sr = m.residual_scale;
  // Solve the normal equations of the used parameters by Cramer's rule (3 x 3, 2 x 2 or the mean).
  if (qq > 0 && bb > 0) {
    const double det = n * (bb * qq - bq * bq) - nb * (nb * qq - bq * nq) + nq * (nb * bq - bb * nq);
    if (!(std::fabs(det) > 1e-12 * n * bb * qq)) return false;
    center = (w1 * (bb * qq - bq * bq) - nb * (wb * qq - bq * wq) + nq * (wb * bq - bb * wq)) / det;
    sb = (n * (wb * qq - bq * wq) - w1 * (nb * qq - bq * nq) + nq * (nb * wq - wb * nq)) / det;
    sr = (n * (bb * wq - wb * bq) - nb * (nb * wq - wb * nq) + w1 * (nb * bq - bb * nq)) / det;
  } else if (bb > 0) {
    const double det = n * bb - nb * nb;
    if (!(std::fabs(det) > 1e-12 * n * bb)) return false;
    center = (w1 * bb - nb * wb) / det;
    sb = (n * wb - nb * w1) / det;
  } else {
    center = w1 / n;
  }
  return true;
}

// Full metadata, one group of row r: center the weights' midrange, outer levels at their min and max (so no weight
// is clipped: a few large weights, which matter to the model beyond their share of the squared error, stay
// exact), inner step the best of a ladder from half the range down. `search` (importance-weighted, so it may
// clip where the importance says the large weights matter little) also tries equal steps over narrower ranges,
// then least-squares refits of the center and both steps with the states reassigned, kept while the error falls.
void encode_group(Encoding& enc, const Source& src, int64_t r, int64_t c0, int64_t c1, bool search) {
  const float* w = src.weights + r * src.cols;
  float lo = w[c0], hi = w[c0];
  for (int64_t c = c0; c < c1; ++c) lo = std::min(lo, w[c]), hi = std::max(hi, w[c]);
  const double mid = 0.5 * (static_cast<double>(lo) + hi), half = 0.5 * (static_cast<double>(hi) - lo);
  const DType dtype = enc.l.scale_dtype;
  GroupMetadata& m = enc.grid(r, c0);
  m = centered(dtype, mid, half / 2, half / 2);
  double e = enc.assign(src, r, c0, c1);
  GroupMetadata best = m;
  const auto consider = [&](double sb, double sr) {
    m = centered(dtype, mid, sb, sr);
    const double ek = enc.assign(src, r, c0, c1);
    if (ek < e) e = ek, best = m;
  };
  constexpr int kLadder = 16;
  for (int k = 1; k < kLadder; ++k) {
    const double inner = half * (0.5 - 0.45 * k / (kLadder - 1));
    consider(inner, half - inner);
  }
  // The search may also clip: equal steps over ranges from the full one down to about half of it.
  for (int k = 1; search && k < kLadder; ++k) {
    const double step = half * (1.0 - k / (2.0 * kLadder)) / 2;
    consider(step, step);
  }
  m = best;
  enc.assign(src, r, c0, c1);
  if (!search) return;
  for (int it = 0; it < 4; ++it) {
    double center, sb, sr;
    if (!refit_group(enc, src, r, c0, c1, m, center, sb, sr)) break;
    m = centered(dtype, center, sb, sr);
    const double e_new = enc.assign(src, r, c0, c1);
    if (!(e_new < e)) {
      m = best;
      enc.assign(src, r, c0, c1);
      return;
    }
    e = e_new, best = m;
  }
}

double assign_all(Encoding& enc, const Source& src, ThreadPool* pool) {
  std::vector<double> row_errors(static_cast<size_t>(enc.l.rows));
  for_rows(pool, enc.l.rows, [&](size_t r0, size_t r1) {
    for (size_t r = r0; r < r1; ++r) row_errors[r] = enc.assign_row(src, static_cast<int64_t>(r));
  });
  double e = 0.0;
  for (double x : row_errors) e += x;
  return e;
}

void set_slim(Encoding& enc, const std::vector<float>& alphas, float residual) {
  for (int64_t r = 0; r < enc.l.rows; ++r)
    for (int64_t g = 0; g < enc.l.groups_per_row(); ++g)
      enc.grids[r * enc.l.groups_per_row() + g] = {alphas[r], -alphas[r], residual, -residual};
}

// Slim metadata refinement: alternately least-squares alphas per row and the single residual scale, states
// reassigned after each, kept while the error falls.
void refine_slim(Encoding& enc, const Source& src, std::vector<float>& alphas, float& residual, ThreadPool* pool) {
  double e = assign_all(enc, src, pool);
  for (int it = 0; it < 4; ++it) {
    std::vector<float> new_alphas(alphas.size());
    double rw = 0.0, rr = 0.0;
    for (int64_t r = 0; r < enc.l.rows; ++r) {
      double bw = 0.0, bb = 0.0;
      for (int64_t c = 0; c < enc.l.cols; ++c) {
        const int s = enc.states[r * enc.l.cols + c], b = std::clamp(s, -1, 1), q = s - b;
        const double w = src.weights[r * src.cols + c], k = src.weight(c);
        bw += k * b * (w - residual * q), bb += k * b * b;
        rw += k * q * (w - alphas[r] * b), rr += k * q * q;
      }
      new_alphas[r] = round_to(enc.l.scale_dtype, bb > 0.0 ? static_cast<float>(bw / bb) : alphas[r]);
    }
    const float new_residual = round_to(enc.l.scale_dtype, rr > 0.0 ? static_cast<float>(rw / rr) : residual);
    set_slim(enc, new_alphas, new_residual);
    const double e_new = assign_all(enc, src, pool);
    if (!(e_new < e)) {
      set_slim(enc, alphas, residual);
      assign_all(enc, src, pool);
      return;
    }
    e = e_new, alphas = std::move(new_alphas), residual = new_residual;
  }
}

// Digits (state + 2) of one row, padded_cols of them, padding state 0.
std::vector<uint8_t> row_digits(const Encoding& enc, int64_t r) {
  std::vector<uint8_t> d(static_cast<size_t>(enc.l.padded_cols), kZeroDigit);
  for (int64_t c = 0; c < enc.l.cols; ++c) d[c] = static_cast<uint8_t>(enc.states[r * enc.l.cols + c] + 2);
  return d;
}

void store_codes(const Encoding& enc, EncodedTensor& out) {
  const Layout& l = enc.l;
  switch (l.storage) {
    case Storage::planes: {
      TensorBuffer base = make_buffer(DType::U32, {l.rows, l.words_per_row()});
      TensorBuffer residual = make_buffer(DType::U32, {l.rows, l.words_per_row()});
      for (int64_t r = 0; r < l.rows; ++r) {
        const auto d = row_digits(enc, r);
        for (int64_t c = 0; c < l.padded_cols; ++c) {
          const int64_t word = r * l.words_per_row() + c / 16;
          const unsigned shift = 2 * (c % 16);
          base.as<uint32_t>()[word] |= static_cast<uint32_t>(kStateBase[d[c]]) << shift;
          residual.as<uint32_t>()[word] |= static_cast<uint32_t>(kStateResidual[d[c]]) << shift;
        }
      }
      out.arrays.emplace_back("base_codes", std::move(base));
      out.arrays.emplace_back("residual_codes", std::move(residual));
      return;
    }
    case Storage::quint5: {
      TensorBuffer codes = make_buffer(DType::U8, {l.rows, l.quint5_row_bytes()});
      for (int64_t r = 0; r < l.rows; ++r) {
        const auto d = row_digits(enc, r);
        uint8_t* row = codes.as<uint8_t>() + r * l.quint5_row_bytes();
        for (int64_t c = 0, k = 0; c < l.padded_cols; c += kDigitsPerChunk, ++k)
          quint5_pack(d.data() + c, static_cast<int>(std::min<int64_t>(kDigitsPerChunk, l.padded_cols - c)),
                      row + 3 * k);
      }
      out.arrays.emplace_back("codes", std::move(codes));
      return;
    }
    case Storage::trit3: {
      TensorBuffer codes = make_buffer(DType::U8, {l.rows, l.trit3_row_bytes()});
      for (int64_t r = 0; r < l.rows; ++r) {
        const auto d = row_digits(enc, r);
        uint8_t* row = codes.as<uint8_t>() + r * l.trit3_row_bytes();
        for (int64_t c = 0; c < l.padded_cols; ++c) offset_scale::write_code(row, c, kTrit3Bits, d[c]);
      }
      out.arrays.emplace_back("codes", std::move(codes));
      return;
    }
  }
}

void store_metadata(const Encoding& enc, EncodedTensor& out) {
  const Layout& l = enc.l;
  if (l.metadata == Metadata::slim) {
    TensorBuffer alpha = make_buffer(l.scale_dtype, {l.rows});
    TensorBuffer residual = make_buffer(l.scale_dtype, {1});
    for (int64_t r = 0; r < l.rows; ++r) store_float(l.scale_dtype, alpha.bytes.data(), r, enc.grid(r, 0).base_scale);
    store_float(l.scale_dtype, residual.bytes.data(), 0, enc.grid(0, 0).residual_scale);
    out.arrays.emplace_back("base_alpha", std::move(alpha));
    out.arrays.emplace_back("residual_scale", std::move(residual));
    return;
  }
  const Shape shape{l.rows, l.groups_per_row()};
  TensorBuffer bs = make_buffer(l.scale_dtype, shape), bb = make_buffer(l.scale_dtype, shape);
  TensorBuffer rs = make_buffer(l.scale_dtype, shape), rb = make_buffer(l.scale_dtype, shape);
  for (size_t i = 0; i < enc.grids.size(); ++i) {
    store_float(l.scale_dtype, bs.bytes.data(), i, enc.grids[i].base_scale);
    store_float(l.scale_dtype, bb.bytes.data(), i, enc.grids[i].base_bias);
    store_float(l.scale_dtype, rs.bytes.data(), i, enc.grids[i].residual_scale);
    store_float(l.scale_dtype, rb.bytes.data(), i, enc.grids[i].residual_bias);
  }
  out.arrays.emplace_back("base_scales", std::move(bs));
  out.arrays.emplace_back("base_biases", std::move(bb));
  out.arrays.emplace_back("residual_scales", std::move(rs));
  out.arrays.emplace_back("residual_biases", std::move(rb));
}

// The four affine values of group g of row r, read from stored (not expanded) metadata.
GroupMetadata group_metadata(const Layout& l, const ArrayViews& arrays, int64_t r, int64_t g) {
  if (l.metadata == Metadata::slim) {
    const float alpha = load_float(l.scale_dtype, arrays.at("base_alpha").bytes.data(), r);
    const float residual = load_float(l.scale_dtype, arrays.at("residual_scale").bytes.data(), 0);
    return {alpha, -alpha, residual, -residual};
  }
  const auto i = static_cast<size_t>(r * l.groups_per_row() + g);
  const auto load = [&](std::string_view role) { return load_float(l.scale_dtype, arrays.at(role).bytes.data(), i); };
  return {load("base_scales"), load("base_biases"), load("residual_scales"), load("residual_biases")};
}

// The writable code arrays of an encoded tensor (planes: base and residual words; quint5 / trit3: bytes).
struct CodeArrays {
  uint32_t* base = nullptr;
  uint32_t* residual = nullptr;
  uint8_t* codes = nullptr;
};

CodeArrays code_arrays(EncodedTensor& tensor) {
  CodeArrays a;
  for (auto& [role, buffer] : tensor.arrays) {
    if (role == "base_codes") a.base = buffer.as<uint32_t>();
    if (role == "residual_codes") a.residual = buffer.as<uint32_t>();
    if (role == "codes") a.codes = buffer.as<uint8_t>();
  }
  return a;
}

// Stores digit d at column c of row r in whichever code storage the layout uses, keeping the other codes.
void write_digit(const Layout& l, const CodeArrays& a, int64_t r, int64_t c, uint8_t d) {
  switch (l.storage) {
    case Storage::planes: {
      const int64_t word = r * l.words_per_row() + c / 16;
      const unsigned shift = 2 * (c % 16);
      a.base[word] = (a.base[word] & ~(3u << shift)) | static_cast<uint32_t>(kStateBase[d]) << shift;
      a.residual[word] = (a.residual[word] & ~(3u << shift)) | static_cast<uint32_t>(kStateResidual[d]) << shift;
      return;
    }
    case Storage::quint5: {
      const int64_t k = c / kDigitsPerChunk;
      uint8_t* chunk = a.codes + r * l.quint5_row_bytes() + 3 * k;
      const int n = static_cast<int>(std::min<int64_t>(kDigitsPerChunk, l.padded_cols - k * kDigitsPerChunk));
      uint8_t digits[kDigitsPerChunk];
      if (!quint5_unpack(chunk, n, digits))
        fail(Errc::reserved_code, "[two_plane] codes[{}]: quint5 chunk {} is not below 5^{}", r, k, n);
      digits[c % kDigitsPerChunk] = d;
      quint5_pack(digits, n, chunk);
      return;
    }
    case Storage::trit3: offset_scale::write_code(a.codes + r * l.trit3_row_bytes(), c, kTrit3Bits, d); return;
  }
}

std::string_view scale_dtype_param(DType t) { return t == DType::BF16 ? "bf16" : t == DType::F16 ? "f16" : "f32"; }

std::string_view storage_name(Storage s) {
  return s == Storage::planes ? "planes" : s == Storage::quint5 ? "quint5" : "trit3";
}

}  // namespace

Layout layout(const Params& params, const Shape& shape) {
  ParamReader r(params, "two_plane");
  Layout l;
  const auto storage = r.choice_or("storage", "planes", {"planes", "quint5", "trit3"});
  l.storage = storage == "planes" ? Storage::planes : storage == "quint5" ? Storage::quint5 : Storage::trit3;
  l.metadata = r.choice_or("metadata", "full", {"full", "slim"}) == "full" ? Metadata::full : Metadata::slim;
  l.scale_dtype = scale_dtype_from_name(r.choice_or("scale_dtype", "bf16", {"bf16", "f16", "f32"}));
  r.integer_or("group_size", kGroupSize, {kGroupSize});
  if (shape.size() != 2 || shape[0] < 1 || shape[1] < 1)
    fail(Errc::shape, "[two_plane] shape {} is not [rows >= 1, cols >= 1]", shape_str(shape));
  l.rows = shape[0];
  l.cols = shape[1];
  l.padded_cols = r.padded_cols(l.cols, kGroupSize);
  r.finish();
  checked_mul(static_cast<uint64_t>(l.rows), static_cast<uint64_t>(l.padded_cols), "[two_plane] shape");
  return l;
}

bool quint5_unpack(const uint8_t* chunk, int n, uint8_t* digits) {
  uint32_t v = chunk[0] | static_cast<uint32_t>(chunk[1]) << 8 | static_cast<uint32_t>(chunk[2]) << 16;
  if (v >= kPow5[n]) return false;
  for (int j = 0; j < n; ++j, v /= 5) digits[j] = static_cast<uint8_t>(v % 5);
  return true;
}

void quint5_pack(const uint8_t* digits, int n, uint8_t* chunk) {
  uint32_t v = 0;
  for (int j = n - 1; j >= 0; --j) v = v * 5 + digits[j];
  chunk[0] = static_cast<uint8_t>(v), chunk[1] = static_cast<uint8_t>(v >> 8), chunk[2] = static_cast<uint8_t>(v >> 16);
}

void row_plane_codes(const Layout& l, const ArrayViews& arrays, int64_t row, uint8_t* base, uint8_t* residual) {
  const auto from_digit = [&](int64_t c, uint32_t d) {
    if (d > 4) fail(Errc::reserved_code, "[two_plane] codes[{}, {}]: digit {} is reserved (0..4)", row, c, d);
    base[c] = kStateBase[d], residual[c] = kStateResidual[d];
  };
  switch (l.storage) {
    case Storage::planes: {
      const uint32_t* b = arrays.at("base_codes").as<uint32_t>() + row * l.words_per_row();
      const uint32_t* q = arrays.at("residual_codes").as<uint32_t>() + row * l.words_per_row();
      for (int64_t c = 0; c < l.padded_cols; ++c) {
        base[c] = (b[c / 16] >> (2 * (c % 16))) & 3u;
        residual[c] = (q[c / 16] >> (2 * (c % 16))) & 3u;
      }
      return;
    }
    case Storage::quint5: {
      const uint8_t* row_bytes = arrays.at("codes").as<uint8_t>() + row * l.quint5_row_bytes();
      uint8_t digits[kDigitsPerChunk];
      for (int64_t c = 0, k = 0; c < l.padded_cols; c += kDigitsPerChunk, ++k) {
        const int n = static_cast<int>(std::min<int64_t>(kDigitsPerChunk, l.padded_cols - c));
        if (!quint5_unpack(row_bytes + 3 * k, n, digits))
          fail(Errc::reserved_code, "[two_plane] codes[{}]: quint5 chunk {} is not below 5^{}", row, k, n);
        for (int j = 0; j < n; ++j) from_digit(c + j, digits[j]);
      }
      return;
    }
    case Storage::trit3: {
      const uint8_t* row_bytes = arrays.at("codes").as<uint8_t>() + row * l.trit3_row_bytes();
      for (int64_t c = 0; c < l.padded_cols; ++c) from_digit(c, offset_scale::read_code(row_bytes, c, kTrit3Bits));
      return;
    }
  }
}

void row_metadata(const Layout& l, const ArrayViews& arrays, int64_t row, const RowMetadata& out) {
  const int64_t groups = l.groups_per_row();
  if (l.metadata == Metadata::slim) {
    const float alpha = load_float(l.scale_dtype, arrays.at("base_alpha").bytes.data(), row);
    const float residual = load_float(l.scale_dtype, arrays.at("residual_scale").bytes.data(), 0);
    std::fill_n(out.base_scales, groups, alpha);
    std::fill_n(out.base_biases, groups, -alpha);
    std::fill_n(out.residual_scales, groups, residual);
    std::fill_n(out.residual_biases, groups, -residual);
    return;
  }
  const auto load_row = [&](std::string_view role, float* dst) {
    const std::byte* src = arrays.at(role).bytes.data();
    for (int64_t g = 0; g < groups; ++g) dst[g] = load_float(l.scale_dtype, src, row * groups + g);
  };
  load_row("base_scales", out.base_scales);
  load_row("base_biases", out.base_biases);
  load_row("residual_scales", out.residual_scales);
  load_row("residual_biases", out.residual_biases);
}

ExpandedMetadata expand_metadata(const Layout& l, const ArrayViews& arrays) {
  const size_t n = checked_mul(static_cast<uint64_t>(l.rows), static_cast<uint64_t>(l.groups_per_row()),
                               "[two_plane] metadata");
  ExpandedMetadata m{std::vector<float>(n), std::vector<float>(n), std::vector<float>(n), std::vector<float>(n)};
  for (int64_t r = 0; r < l.rows; ++r) {
    const int64_t at = r * l.groups_per_row();
    row_metadata(l, arrays, r,
                 {m.base_scales.data() + at, m.base_biases.data() + at, m.residual_scales.data() + at,
                  m.residual_biases.data() + at});
  }
  return m;
}

void validate(const Params& params, const Shape& shape) { layout(params, shape); }

std::vector<ArraySpec> arrays(const Params& params, const Shape& shape) {
  const Layout l = layout(params, shape);
  std::vector<ArraySpec> specs;
  switch (l.storage) {
    case Storage::planes:
      specs.push_back({"base_codes", DType::U32, {l.rows, l.words_per_row()}});
      specs.push_back({"residual_codes", DType::U32, {l.rows, l.words_per_row()}});
      break;
    case Storage::quint5: specs.push_back({"codes", DType::U8, {l.rows, l.quint5_row_bytes()}}); break;
    case Storage::trit3: specs.push_back({"codes", DType::U8, {l.rows, l.trit3_row_bytes()}}); break;
  }
  if (l.metadata == Metadata::slim) {
    specs.push_back({"base_alpha", l.scale_dtype, {l.rows}});
    specs.push_back({"residual_scale", l.scale_dtype, {1}});
  } else {
    for (const char* role : {"base_scales", "base_biases", "residual_scales", "residual_biases"})
      specs.push_back({role, l.scale_dtype, {l.rows, l.groups_per_row()}});
  }
  return specs;
}

void check_content(const Params& params, const Shape& shape, const ArrayViews& arrays) {
  const Layout l = layout(params, shape);
  for (const ArraySpec& spec : two_plane::arrays(params, shape)) {
    if (spec.dtype != l.scale_dtype) continue;
    const TensorView& v = arrays.at(spec.role);
    const size_t n = v.bytes.size() / dtype_size(v.dtype);
    for (size_t i = 0; i < n; ++i)
      if (!std::isfinite(load_float(v.dtype, v.bytes.data(), i)))
        fail(Errc::non_finite, "[two_plane] {} element {} is not finite", spec.role, i);
  }
  std::vector<uint8_t> base(static_cast<size_t>(l.padded_cols)), residual(base.size());
  for (int64_t r = 0; r < l.rows; ++r) {
    row_plane_codes(l, arrays, r, base.data(), residual.data());
    for (int64_t c = l.cols; c < l.padded_cols; ++c)
      if (base[c] != kStateBase[kZeroDigit] || residual[c] != kStateResidual[kZeroDigit])
        fail(Errc::reserved_code, "[two_plane] padding column {} of row {} does not hold state 0", c, r);
  }
}

void decode_rows(const Params& params, const Shape& shape, const ArrayViews& arrays, int64_t row_begin,
                 int64_t row_end, float* out) {
  const Layout l = layout(params, shape);
  const auto groups = static_cast<size_t>(l.groups_per_row());
  std::vector<uint8_t> base(static_cast<size_t>(l.padded_cols)), residual(base.size());
  std::vector<float> meta(4 * groups);
  float *bs = meta.data(), *bb = bs + groups, *rs = bb + groups, *rb = rs + groups;
  for (int64_t r = row_begin; r < row_end; ++r) {
    row_plane_codes(l, arrays, r, base.data(), residual.data());
    row_metadata(l, arrays, r, {bs, bb, rs, rb});
    for (int64_t c = 0; c < l.cols; ++c) {
      const int64_t g = c / kGroupSize;
      *out++ = (bs[g] * static_cast<float>(base[c]) + bb[g]) + (rs[g] * static_cast<float>(residual[c]) + rb[g]);
    }
  }
}

EncodedTensor encode(const Params& params, const Shape& shape, const float* weights, const EncodeOptions& options) {
  const Layout l = layout(params, shape);
  if (!options.column_importance.empty() && static_cast<int64_t>(options.column_importance.size()) != l.cols)
    fail(Errc::shape, "[two_plane] column importance has {} entries for {} columns", options.column_importance.size(),
         l.cols);
  const Source src{weights, options.column_importance.empty() ? nullptr : options.column_importance.data(), l.cols};
  const size_t groups = checked_mul(static_cast<uint64_t>(l.rows), static_cast<uint64_t>(l.groups_per_row()),
                                    "[two_plane] shape");
  Encoding enc{l, std::vector<int8_t>(checked_mul(static_cast<uint64_t>(l.rows), static_cast<uint64_t>(l.cols),
                                                  "[two_plane] shape")),
               std::vector<GroupMetadata>(groups)};
  if (l.metadata == Metadata::slim) {
    std::vector<float> alphas(static_cast<size_t>(l.rows));
    for_rows(options.pool, l.rows, [&](size_t r0, size_t r1) {
      for (size_t r = r0; r < r1; ++r)
        alphas[r] = round_to(l.scale_dtype, best_alpha(weights + static_cast<int64_t>(r) * l.cols, src));
    });
    double sum = 0.0;
    for (float a : alphas) sum += a;
    float residual = round_to(l.scale_dtype, static_cast<float>(sum / static_cast<double>(l.rows)));
    set_slim(enc, alphas, residual);
    if (options.search)
      refine_slim(enc, src, alphas, residual, options.pool);
    else
      assign_all(enc, src, options.pool);
  } else {
    for_rows(options.pool, l.rows, [&](size_t r0, size_t r1) {
      for (auto r = static_cast<int64_t>(r0); r < static_cast<int64_t>(r1); ++r)
        for (int64_t c0 = 0; c0 < l.cols; c0 += kGroupSize)
          encode_group(enc, src, r, c0, std::min(l.cols, c0 + kGroupSize), options.search);
    });
  }
  EncodedTensor out;
  out.params = {{"storage", storage_name(l.storage)},
                {"metadata", l.metadata == Metadata::full ? "full" : "slim"},
                {"scale_dtype", scale_dtype_param(l.scale_dtype)},
                {"group_size", kGroupSize},
                {"padded_cols", l.padded_cols}};
  store_codes(enc, out);
  store_metadata(enc, out);
  return out;
}

EncodedTensor fold_to_affine(const TensorRef& tensor, int bits, const EncodeOptions& options) {
  const Layout l = layout(tensor.params, tensor.shape);
  const Params affine_params{{"bits", bits}, {"group_size", kGroupSize}, {"scale_dtype", scale_dtype_param(l.scale_dtype)}};
  const Shape shape{l.rows, l.cols};
  EncodedTensor out;
  for (const ArraySpec& spec : affine::arrays(affine_params, shape))
    out.arrays.emplace_back(spec.role, make_buffer(spec.dtype, spec.shape));
  constexpr int64_t kRowBlock = 64;
  std::vector<float> rows(static_cast<size_t>(std::min(l.rows, kRowBlock) * l.cols));
  for (int64_t r0 = 0; r0 < l.rows; r0 += kRowBlock) {
    const int64_t n = std::min(kRowBlock, l.rows - r0);
    decode_rows(tensor.params, tensor.shape, tensor.arrays, r0, r0 + n, rows.data());
    EncodedTensor block = affine::encode(affine_params, {n, l.cols}, rows.data(), options);
    out.params = block.params;
    for (size_t i = 0; i < out.arrays.size(); ++i) {
      const auto& src = block.arrays[i].second.bytes;
      std::copy(src.begin(), src.end(), out.arrays[i].second.bytes.begin() + static_cast<ptrdiff_t>(src.size() / n * r0));
    }
  }
  return out;
}

void quantize_column(const Params& params, const Shape& shape, EncodedTensor& tensor, int64_t col,
                     const float* values, float* out) {
  const Layout l = layout(params, shape);
  if (col < 0 || col >= l.cols) fail(Errc::shape, "[two_plane] quantize_column: column {} outside [0, {})", col, l.cols);
  const ArrayViews views = tensor.views();
  const CodeArrays codes = code_arrays(tensor);
  if (l.storage == Storage::planes ? !codes.base || !codes.residual : !codes.codes)
    fail(Errc::shape, "[two_plane] quantize_column: the encoded tensor lacks its code arrays");
  for (int64_t r = 0; r < l.rows; ++r) {
    if (!std::isfinite(values[r]))
      fail(Errc::non_finite, "[two_plane] quantize_column: value at row {} is not finite", r);
    const uint8_t d = nearest_digit(values[r], group_metadata(l, views, r, col / kGroupSize), out[r]);
    write_digit(l, codes, r, col, d);
  }
}

EncodedTensor slice(const Params& params, const Shape& shape, const ArrayViews& arrays, Axis axis,
                    std::span<const Range> ranges) {
  const Layout l = layout(params, shape);
  if (axis == Axis::cols && l.storage == Storage::quint5)
    fail(Errc::shape,
         "[two_plane] quint5 codes (10 per 3 bytes) do not start a byte at every group: its columns "
         "cannot be sliced");
  return slice_grouped(params, shape, arrays, axis, ranges, l.padded_cols, kGroupSize, "two_plane",
                       [](const Params& p, const Shape& s, std::string_view role) {
                         const Layout g = layout(p, s);
                         if (role == "residual_scale") return ArrayCut{.per_row = false};
                         if (role == "base_alpha") return ArrayCut{.per_row = true, .per_group = 0};
                         if (role == "codes" || role == "base_codes" || role == "residual_codes")
                           return ArrayCut{
                               .per_row = true,
                               .per_group = g.storage == Storage::planes ? kGroupSize / 16 : kGroupSize * 3 / 8};
                         return ArrayCut{.per_row = true, .per_group = 1};
                       });
}

}  // namespace lowbit::codec::two_plane
