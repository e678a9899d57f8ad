// trellis encoder: per-block Viterbi (tail-biting by two passes) and the tensor encoder around it.
//
// With k bits shifted in per step, the predecessors of state s are (s >> k) + j 2^(L-k) for j < 2^k: all the
// states sharing the group u = s >> k have the same predecessors. One step therefore costs O(2^L): a min over
// the 2^k predecessors of each group u (contiguous loads), then cost[u 2^k + j] = min_u + error(u 2^k + j).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "lowbit/codec/hadamard.h"
#include "lowbit/codec/trellis.h"
#include "lowbit/core/error.h"
#include "lowbit/core/thread_pool.h"

namespace lowbit::codec::trellis {

struct BlockEncoder::Workspace {
  std::vector<float> cost, next;  // [2^L]
  std::vector<uint8_t> back;      // [T, 2^(L-k)]: the chosen predecessor j of each group at each step
  std::vector<float> target, importance;
  std::vector<uint32_t> states;
};

namespace {

// Eight lanes as GCC/Clang vector extensions: one portable source, compiled per instruction set below.
typedef float F8 __attribute__((vector_size(32)));
typedef int32_t I8 __attribute__((vector_size(32)));
typedef uint8_t B8 __attribute__((vector_size(8)));

// Vectors only pass by reference between these helpers (a by-value 32-byte vector would change the ABI on
// builds without AVX).
#define LOWBIT_INLINE inline __attribute__((always_inline))

LOWBIT_INLINE void load8(F8& v, const float* p) { std::memcpy(&v, p, sizeof v); }
LOWBIT_INLINE void store8(float* p, const F8& v) { std::memcpy(p, &v, sizeof v); }

// next[8 V + l] = best[(8 V + l) >> K] + wt (table[8 V + l] - xt)^2 for V < 2^K: eight groups' successors.
template <int K, size_t... V>
LOWBIT_INLINE void add_errors(const F8& best, const float* table, float* next, const F8& xt, const F8& wt,
                              std::index_sequence<V...>) {
  (
      [&] {
        F8 t;
        load8(t, table + 8 * V);
        const F8 d = t - xt;
        const F8 spread = __builtin_shufflevector(best, best, (8 * V + 0) >> K, (8 * V + 1) >> K, (8 * V + 2) >> K,
                                                  (8 * V + 3) >> K, (8 * V + 4) >> K, (8 * V + 5) >> K,
                                                  (8 * V + 6) >> K, (8 * V + 7) >> K);
        store8(next + 8 * V, spread + wt * d * d);
      }(),
      ...);
}

// One step for U groups (U a multiple of 8): per group u the best of its 2^K predecessors cost[u + j U] (the
// first on ties) into back[u], then next[u 2^K + j] = best + wt (table[u 2^K + j] - xt)^2.
template <int K>
LOWBIT_INLINE void step(const float* table, uint32_t U, float xt, float wt, const float* cost, float* next,
                        uint8_t* back) {
  constexpr uint32_t J = 1u << K;
  const F8 x8 = xt - F8{}, w8 = wt - F8{};
  for (uint32_t u = 0; u < U; u += 8) {
    F8 best, c;
    load8(best, cost + u);
    I8 arg = {};
    for (uint32_t j = 1; j < J; ++j) {
      load8(c, cost + u + j * U);
      const I8 lt = c < best;
      best = lt ? c : best;
      arg = lt ? I8{} + static_cast<int32_t>(j) : arg;
    }
    const B8 arg8 = __builtin_convertvector(arg, B8);
    std::memcpy(back + u, &arg8, sizeof arg8);
    add_errors<K>(best, table + u * J, next + u * J, x8, w8, std::make_index_sequence<J>{});
  }
}

// Compiled for AVX-512, AVX2 and the baseline; the loader picks the best the CPU has.
#define LOWBIT_STEP(K)                                                                                        \
  __attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) void step##K(                          \
      const float* table, uint32_t U, float xt, float wt, const float* cost, float* next, uint8_t* back) {   \
    step<K>(table, U, xt, wt, cost, next, back);                                                            \
  }
LOWBIT_STEP(1)
LOWBIT_STEP(2)
LOWBIT_STEP(3)
LOWBIT_STEP(4)
#undef LOWBIT_STEP
#undef LOWBIT_INLINE

using StepFn = void (*)(const float*, uint32_t, float, float, const float*, float*, uint8_t*);
constexpr StepFn kStep[] = {nullptr, step1, step2, step3, step4};

}  // namespace

BlockEncoder::BlockEncoder(Code code, int L, int k, int T) : L_(L), k_(k), T_(T) {
  if (k < 1 || k > 4 || L - k < 3 || L > 16 || T < 2 || T * k < L || (T * k) % 16 != 0)
    fail(Errc::internal, "[trellis] no block encoder for L = {}, k = {}, T = {}", L, k, T);
  table_ = code_table(code, L);
  ws_ = std::make_unique<Workspace>();
  ws_->cost.resize(size_t{1} << L);
  ws_->next.resize(size_t{1} << L);
  ws_->back.resize(static_cast<size_t>(T) << (L - k));
  ws_->target.resize(static_cast<size_t>(T));
  ws_->importance.resize(static_cast<size_t>(T));
  ws_->states.resize(static_cast<size_t>(T));
}

BlockEncoder::~BlockEncoder() = default;
BlockEncoder::BlockEncoder(BlockEncoder&&) noexcept = default;
BlockEncoder& BlockEncoder::operator=(BlockEncoder&&) noexcept = default;

double BlockEncoder::viterbi(const float* target, const float* importance, int64_t overlap, uint32_t* states) {
  const uint32_t S = 1u << L_, U = S >> k_, J = 1u << k_;
  float* cost = ws_->cost.data();
  const float w0 = importance ? importance[0] : 1.0f;
  const auto first_cost = [&](uint32_t s) {
    const float d = table_[s] - target[0];
    return w0 * d * d;
  };
  if (overlap < 0) {
    for (uint32_t s = 0; s < S; ++s) cost[s] = first_cost(s);
  } else {
    std::fill(cost, cost + S, std::numeric_limits<float>::infinity());
    for (uint32_t j = 0; j < J; ++j) cost[overlap * J + j] = first_cost(static_cast<uint32_t>(overlap) * J + j);
  }
  float* next = ws_->next.data();
  for (int t = 1; t < T_; ++t) {
    kStep[k_](table_, U, target[t], importance ? importance[t] : 1.0f, cost, next, ws_->back.data() + size_t{U} * t);
    std::swap(cost, next);
  }
  uint32_t s = overlap < 0 ? 0 : static_cast<uint32_t>(overlap);
  const uint32_t stride = overlap < 0 ? 1 : U;
  for (uint32_t c = s; c < S; c += stride)
    if (cost[c] < cost[s]) s = c;
  states[T_ - 1] = s;
  for (int t = T_ - 1; t > 0; --t) {
    const uint32_t u = s >> k_;
    s = u + ws_->back[static_cast<size_t>(t) * U + u] * U;
    states[t - 1] = s;
  }
  double total = 0.0;
  for (int t = 0; t < T_; ++t) {
    const double d = double{table_[states[t]]} - target[t];
    total += (importance ? importance[t] : 1.0) * d * d;
  }
  return total;
}

double BlockEncoder::encode(const float* target, const float* importance, uint16_t* words, float* recon) {
  const int half = T_ / 2, start = T_ - half;  // rotated index of the original step 0
  for (int i = 0; i < T_; ++i) {
    ws_->target[i] = target[(i + half) % T_];
    ws_->importance[i] = importance ? importance[(i + half) % T_] : 1.0f;
  }
  uint32_t* states = ws_->states.data();
  viterbi(ws_->target.data(), ws_->importance.data(), -1, states);
  const int64_t overlap = states[start] >> k_;
  const double cost = viterbi(target, importance, overlap, states);
  pack_states(states, T_, k_, words);
  if (recon)
    for (int t = 0; t < T_; ++t) recon[t] = table_[states[t]];
  return cost;
}

// ---------------------------------------------------------------------------------------------------------
// Tensor encoder.

namespace {

// W' = R_out W R_in^T, zero-padded: [padded_rows, padded_cols].
std::vector<float> rotated_weights(const Layout& lay, const float* weights, ThreadPool& pool) {
  const int64_t pr = lay.padded_rows, pc = lay.padded_cols;
  std::vector<float> wp(static_cast<size_t>(pr * pc), 0.0f);
  const hadamard::RandomizedHadamard r_in(lay.rotate_input ? pc : 1, lay.input_seed);
  pool.parallel_for(static_cast<size_t>(lay.rows), 16, [&](size_t r0, size_t r1) {
    for (size_t r = r0; r < r1; ++r) {
      std::memcpy(wp.data() + r * pc, weights + r * lay.cols, sizeof(float) * static_cast<size_t>(lay.cols));
      if (lay.rotate_input) r_in.forward(wp.data() + r * pc);
    }
  });
  if (lay.rotate_output) {
    const hadamard::RandomizedHadamard r_out(pr, lay.output_seed);
    pool.parallel_for(static_cast<size_t>(pc), 16, [&](size_t c0, size_t c1) {
      std::vector<float> column(static_cast<size_t>(pr));
      for (size_t c = c0; c < c1; ++c) {
        for (int64_t r = 0; r < pr; ++r) column[r] = wp[r * pc + c];
        r_out.forward(column.data());
        for (int64_t r = 0; r < pr; ++r) wp[r * pc + c] = column[r];
      }
    });
  }
  return wp;
}

// Per-column weight of the objective: zero on padding that is not rotated (its activations are zero), the
// caller's importance where columns are not rotated (a rotated column mixes all of them, so it is not used).
std::vector<float> column_weights(const Layout& lay, std::span<const float> importance) {
  if (!importance.empty() && static_cast<int64_t>(importance.size()) != lay.cols)
    fail(Errc::shape, "[trellis] column_importance has {} entries for {} columns", importance.size(), lay.cols);
  for (float v : importance)
    if (!std::isfinite(v) || v < 0.0f) fail(Errc::non_finite, "[trellis] column_importance must be finite and >= 0");
  std::vector<float> w(static_cast<size_t>(lay.padded_cols), lay.rotate_input ? 1.0f : 0.0f);
  if (!lay.rotate_input)
    for (int64_t c = 0; c < lay.cols; ++c) w[c] = importance.empty() ? 1.0f : importance[c];
  return w;
}

struct ScaleGroup {  // the weighted sums that fit one scale: sum w x^2, sum w c x, sum w c^2
  double xx = 0, cx = 0, cc = 0;
};

float round_f16(double v) { return f16_to_f32(f32_to_f16(static_cast<float>(v))); }

// Initial scales: the weighted rms of each row (or of the tensor) over the code's rms.
std::vector<float> initial_scales(const Layout& lay, const std::vector<float>& wp, const std::vector<float>& colw,
                                  const std::vector<float>& roww) {
  const int64_t n = lay.per_row_scale ? lay.padded_rows : 1;
  std::vector<double> num(static_cast<size_t>(n)), den(static_cast<size_t>(n));
  for (int64_t r = 0; r < lay.padded_rows; ++r)
    for (int64_t c = 0; c < lay.padded_cols; ++c) {
      const double w = double{colw[c]} * roww[r], x = wp[r * lay.padded_cols + c];
      num[lay.per_row_scale ? r : 0] += w * x * x;
      den[lay.per_row_scale ? r : 0] += w;
    }
  const double cstd = code_std(lay.code);
  std::vector<float> s(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) s[i] = den[i] > 0 ? round_f16(std::sqrt(num[i] / den[i]) / cstd) : 0.0f;
  return s;
}

// Per-row weight of the objective: zero on padding rows that are not rotated (their outputs are dropped).
std::vector<float> row_weights(const Layout& lay) {
  std::vector<float> roww(static_cast<size_t>(lay.padded_rows), 1.0f);
  if (!lay.rotate_output) std::fill(roww.begin() + lay.rows, roww.end(), 0.0f);
  return roww;
}

TensorBuffer scale_buffer(const std::vector<float>& scales) {
  TensorBuffer out = make_buffer(DType::F16, {static_cast<int64_t>(scales.size())});
  for (size_t i = 0; i < scales.size(); ++i) store_float(DType::F16, out.bytes.data(), i, scales[i]);
  return out;
}

// The least-squares scale for the chosen codes replaces the initial one when it lowers the error.
void refit_scales(std::vector<float>& scales, const std::vector<ScaleGroup>& groups) {
  for (size_t i = 0; i < scales.size(); ++i) {
    const ScaleGroup& g = groups[i];
    if (g.cc <= 0) continue;
    const auto err = [&](double s) { return g.xx - 2 * s * g.cx + s * s * g.cc; };
    const float fit = round_f16(g.cx / g.cc);
    if (std::isfinite(fit) && err(fit) < err(scales[i])) scales[i] = fit;
  }
}

}  // namespace

EncodedTensor encode(const Params& params, const Shape& shape, const float* weights, const EncodeOptions& options) {
  Params p = params;
  {
    const Layout draft = parse_layout(p, shape);  // checks the given keys before defaults are added
    if (draft.rotate_input && !p.contains("input_seed")) p["input_seed"] = options.seed;
    if (draft.rotate_output && !p.contains("output_seed")) p["output_seed"] = options.seed + 1;
    p["padded_rows"] = draft.padded_rows;
    p["padded_cols"] = draft.padded_cols;
    if (!p.contains("scale")) p["scale"] = "row";
    if (!p.contains("rotate")) p["rotate"] = "input";
  }
  const Layout lay = parse_layout(p, shape);
  ThreadPool& pool = options.pool ? *options.pool : default_pool();
  const int64_t pc = lay.padded_cols, ct = lay.col_tiles();

  const std::vector<float> wp = rotated_weights(lay, weights, pool);
  const std::vector<float> colw = column_weights(lay, options.column_importance);
  const std::vector<float> roww = row_weights(lay);
  std::vector<float> scales = initial_scales(lay, wp, colw, roww);

  TensorBuffer codes = make_buffer(DType::U16, {lay.row_tiles(), ct, lay.words_per_tile()});
  const size_t tiles = static_cast<size_t>(lay.row_tiles() * ct);
  // Per tile and tile row, the sums that refit the scales; reduced per row after the parallel loop.
  std::vector<ScaleGroup> tile_sums(tiles * kTileDim);
  pool.parallel_for(tiles, 1, [&](size_t b, size_t e) {
    BlockEncoder encoder(lay.code, lay.L, lay.k);
    float target[kBlock], importance[kBlock], recon[kBlock];
    uint16_t* words = codes.as<uint16_t>();
    for (size_t tile = b; tile < e; ++tile) {
      const int64_t r0 = static_cast<int64_t>(tile) / ct * kTileDim, c0 = static_cast<int64_t>(tile) % ct * kTileDim;
      for (int i = 0; i < kBlock; ++i) {
        const int64_t r = r0 + i / kTileDim, c = c0 + i % kTileDim;
        const float s = scales[lay.per_row_scale ? r : 0];
        target[i] = s != 0.0f ? wp[r * pc + c] / s : 0.0f;
        importance[i] = colw[c] * roww[r] * s * s;
      }
      encoder.encode(target, importance, words + tile * lay.words_per_tile(), recon);
      for (int i = 0; i < kBlock; ++i) {
        const int64_t r = r0 + i / kTileDim, c = c0 + i % kTileDim;
        const double w = double{colw[c]} * roww[r], x = wp[r * pc + c], q = recon[i];
        ScaleGroup& g = tile_sums[tile * kTileDim + i / kTileDim];
        g.xx += w * x * x;
        g.cx += w * q * x;
        g.cc += w * q * q;
      }
    }
  });
  std::vector<ScaleGroup> groups(scales.size());
  for (size_t tile = 0; tile < tiles; ++tile)
    for (int r = 0; r < kTileDim; ++r) {
      const ScaleGroup& g = tile_sums[tile * kTileDim + r];
      ScaleGroup& to = groups[lay.per_row_scale ? tile / ct * kTileDim + r : 0];
      to.xx += g.xx;
      to.cx += g.cx;
      to.cc += g.cc;
    }
  refit_scales(scales, groups);

  EncodedTensor out;
  out.params = std::move(p);
  out.arrays.emplace_back("codes", std::move(codes));
  out.arrays.emplace_back("scales", scale_buffer(scales));
  return out;
}

TensorBuffer starting_scales(const Layout& layout, const std::vector<float>& wp) {
  return scale_buffer(initial_scales(layout, wp, column_weights(layout, {}), row_weights(layout)));
}

}  // namespace lowbit::codec::trellis
