// Affine kernels: batch-1 matvec that streams each plane once and decodes in registers, a batched path that
// decodes a tile of rows once and reuses it across the activations, and a row gather. SIMD code is compiled per
// Highway target (see simd.cpp for the pattern) and dispatched at run time.
//
// Matvec per row r, with codes read as m = 1 + q / 2^b (BlockDecoder::Mantissa):
//   y[r] = sum_g (2^b scale[r,g]) * (sum_{i in g} m[r,i] x[i]) + sum_g (bias[r,g] - 2^b scale[r,g]) * xsum[g]
// where xsum[g] (the activations summed over group g) is computed once per call.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/affine_kernels.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "kernels/cpu/affine_kernels.h"
#include "kernels/cpu/simd.h"

HWY_BEFORE_NAMESPACE();
namespace lowbit::kernels::affine_simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using DU = hn::RebindToUnsigned<DF>;
using DI = hn::RebindToSigned<DF>;

using IndicesU = decltype(hn::SetTableIndices(DU(), static_cast<const int32_t*>(nullptr)));
using IndicesF = decltype(hn::SetTableIndices(DF(), static_cast<const int32_t*>(nullptr)));

size_t Lanes() { return hn::Lanes(DF()); }

// N words from p where only `avail` are readable (the last block of a row); the rest read as zero.
HWY_INLINE hn::Vec<DU> LoadWords(DU du, const uint32_t* p, int64_t avail) {
  if (HWY_LIKELY(avail >= static_cast<int64_t>(hn::Lanes(du)))) return hn::LoadU(du, p);
  uint32_t tmp[64] = {};
  std::copy_n(p, std::max<int64_t>(avail, 0), tmp);
  return hn::LoadU(du, tmp);
}

// Decodes one block: N low-plane words (lane j owns word e0 + j, i.e. codes (e0 + j) * kCodesPerLane + k) and,
// for C != 0, the high-plane bits of the same codes, broadcast to their lanes.
template <int A, int C>
struct BlockDecoder {
  static constexpr int kCodesPerLane = 32 / A;
  static constexpr int kRatio = C ? A / C : 1;  // low words per high word

  DU du;
  DF df;
  hn::Vec<DU> lo_mask = hn::Set(du, A == 8 ? 0xFFu : (1u << A) - 1u);
  hn::Vec<DU> hi_mask = hn::Set(du, C ? (1u << C) - 1u : 0u);
  hn::Vec<DU> one_bits = hn::Set(du, 0x3F800000u);
  hn::Vec<DU> lo_field = hn::Set(du, (A == 8 ? 0xFFu : (1u << A) - 1u) << (23 - A - C));
  hn::Vec<DU> hi_field = hn::Set(du, (C ? (1u << C) - 1u : 0u) << (23 - C));
  hn::Vec<DU> hi_shift;
  IndicesU hi_index;
  hn::Vec<DU> lo, hi;

  BlockDecoder() {
    int32_t index[64];
    uint32_t shift[64];
    for (size_t j = 0; j < hn::Lanes(du); ++j) {
      index[j] = static_cast<int32_t>(j / kRatio);
      shift[j] = static_cast<uint32_t>((j % kRatio) * (32 / kRatio));
    }
    hi_index = hn::SetTableIndices(du, index);
    hi_shift = hn::LoadU(du, shift);
  }

  HWY_INLINE void Load(const AffinePlanes& p, const uint32_t* lo_row, const uint32_t* hi_row, int64_t e0) {
    lo = LoadWords(du, lo_row + e0, p.lo_words - e0);
    if constexpr (C != 0) {
      const int64_t h0 = e0 / kRatio;
      const auto words = LoadWords(du, hi_row + h0, p.hi_words - h0);
      if (hn::Lanes(du) >= static_cast<size_t>(kRatio))  // blocks start on a high word: per-lane tables
        hi = hn::TableLookupLanes(words, hi_index) >> hi_shift;
      else  // one lane (HWY_SCALAR): the block's word sits at this offset of its high word
        hi = hn::ShiftRightSame(words, static_cast<int>((e0 % kRatio) * (32 / kRatio)));
    }
  }

  // Code k of each lane as the float 1 + q / 2^B, built by placing q in the top mantissa bits of 1.0f: a shift
  // and a masked OR (one ternary-logic op on AVX-512) per plane instead of mask + int-to-float conversion.
  // Callers fold the offset and the 2^B into the scale and bias (see MatvecT).
  template <int K>
  HWY_INLINE hn::Vec<DF> Mantissa() const {
    constexpr int B = A + C;
    auto bits = hn::OrAnd(one_bits, ShiftTo<K * A, 23 - B>(lo), lo_field);
    if constexpr (C != 0) bits = hn::OrAnd(bits, ShiftTo<K * C, 23 - B + A>(hi), hi_field);
    return hn::BitCast(df, bits);
  }

  template <int From, int To>
  HWY_INLINE static hn::Vec<DU> ShiftTo(hn::Vec<DU> v) {
    if constexpr (From > To)
      return hn::ShiftRight<From - To>(v);
    else
      return hn::ShiftLeft<To - From>(v);
  }

  // Code k of each lane as a float (exact).
  template <int K>
  HWY_INLINE hn::Vec<DF> Code() const {
    auto q = hn::ShiftRight<K * A>(lo);
    if constexpr ((K + 1) * A < 32) q = hn::And(q, lo_mask);  // the top code of a word needs no mask
    if constexpr (C != 0) q = hn::Or(q, hn::ShiftLeft<A>(hn::And(hn::ShiftRight<K * C>(hi), hi_mask)));
    return hn::ConvertTo(df, hn::BitCast(DI(), q));
  }
};

template <class Fn, int... K>
HWY_INLINE void ForEachCode(Fn&& fn, std::integer_sequence<int, K...>) {
  (fn(std::integral_constant<int, K>()), ...);
}

// Per-row f32 copies of the scales and biases, with N zero floats of slack so a block may load past the last
// group; and the table mapping a block's lanes to their group.
struct RowParams {
  std::vector<float> scales, biases;
  IndicesF lane_group;
  int64_t units_per_group;
  bool lanes_span_groups;

  explicit RowParams(const AffinePlanes& p) {
    const DF df;
    const size_t N = hn::Lanes(df);
    scales.assign(static_cast<size_t>(p.groups) + N, 0.0f);
    biases.assign(static_cast<size_t>(p.groups) + N, 0.0f);
    units_per_group = p.group_size * p.lo_bits / 32;
    lanes_span_groups = static_cast<int64_t>(N) > units_per_group;
    int32_t index[64];
    for (size_t j = 0; j < N; ++j)
      index[j] = lanes_span_groups ? static_cast<int32_t>(static_cast<int64_t>(j) / units_per_group) : 0;
    lane_group = hn::SetTableIndices(df, index);
  }

  void load(const AffinePlanes& p, int64_t r) {
    const size_t bytes = dtype_size(p.scale_dtype);
    const size_t n = static_cast<size_t>(p.groups);
    simd::to_f32(p.scale_dtype, p.scales + static_cast<size_t>(r) * n * bytes, n, scales.data());
    simd::to_f32(p.scale_dtype, p.biases + static_cast<size_t>(r) * n * bytes, n, biases.data());
  }

  // For codes read as m = 1 + q / 2^bits: scale * q + bias = (2^bits scale) * m + (bias - 2^bits scale).
  void load_for_mantissas(const AffinePlanes& p, int64_t r) {
    load(p, r);
    const float unit = static_cast<float>(1 << (p.lo_bits + p.hi_bits));
    for (size_t g = 0; g < static_cast<size_t>(p.groups); ++g) {
      scales[g] *= unit;
      biases[g] -= scales[g];
    }
  }

  // The scales (or biases) of the block starting at low-plane unit e0, one per lane.
  HWY_INLINE hn::Vec<DF> lanes(const std::vector<float>& v, int64_t e0) const {
    const DF df;
    const float* g = v.data() + e0 / units_per_group;
    return lanes_span_groups ? hn::TableLookupLanes(hn::LoadU(df, g), lane_group) : hn::Set(df, *g);
  }
};

// Four accumulators (code k feeds acc[k % 4]) keep the FMA dependency chains short enough for the
// out-of-order window to overlap groups.
struct Accumulators {
  hn::Vec<DF> v[4];
  Accumulators() {
    for (auto& a : v) a = hn::Zero(DF());
  }
  hn::Vec<DF> sum() const { return hn::Add(hn::Add(v[0], v[1]), hn::Add(v[2], v[3])); }
};

// acc += codes of block b (as mantissas) times their activations.
template <class Dec>
HWY_INLINE void AccumulateBlock(Dec& dec, const AffinePlanes& p, const uint32_t* lo_row, const uint32_t* hi_row,
                                int64_t b, const float* xp, Accumulators& acc) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  dec.Load(p, lo_row, hi_row, b * N);
  const float* xb = xp + b * N * Dec::kCodesPerLane;
  ForEachCode(
      [&](auto k) {
        constexpr int K = decltype(k)::value;
        acc.v[K % 4] = hn::MulAdd(dec.template Mantissa<K>(), hn::LoadU(df, xb + K * N), acc.v[K % 4]);
      },
      std::make_integer_sequence<int, Dec::kCodesPerLane>());
}

template <int A, int C>
void MatvecT(const AffinePlanes& p, const float* xp, const float* xsum, size_t r0, size_t r1, float* y) {
  using Dec = BlockDecoder<A, C>;
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const int64_t blocks = (p.lo_words + N - 1) / N;
  Dec dec;
  RowParams params(p);
  for (size_t r = r0; r < r1; ++r) {
    params.load_for_mantissas(p, static_cast<int64_t>(r));
    const uint32_t* lo_row = p.lo + static_cast<int64_t>(r) * p.lo_words;
    const uint32_t* hi_row = p.hi ? p.hi + static_cast<int64_t>(r) * p.hi_words : nullptr;
    auto total = hn::Zero(df);
    if (params.lanes_span_groups) {  // one block holds several groups: a scale per lane
      for (int64_t b = 0; b < blocks; ++b) {
        Accumulators acc;
        AccumulateBlock(dec, p, lo_row, hi_row, b, xp, acc);
        total = hn::MulAdd(params.lanes(params.scales, b * N), acc.sum(), total);
      }
    } else {  // whole blocks per group: one scale per group, applied once
      const int64_t blocks_per_group = params.units_per_group / N;
      for (int64_t g = 0; g < p.groups; ++g) {
        Accumulators acc;
        for (int64_t b = g * blocks_per_group; b < (g + 1) * blocks_per_group; ++b)
          AccumulateBlock(dec, p, lo_row, hi_row, b, xp, acc);
        total = hn::MulAdd(hn::Set(df, params.scales[static_cast<size_t>(g)]), acc.sum(), total);
      }
    }
    y[r - r0] = hn::GetLane(hn::SumOfLanes(df, total)) +
                simd::dot(params.biases.data(), xsum, static_cast<size_t>(p.groups));
  }
}

// Rows [r0, r1) x blocks [b0, b1) dequantized (scale * q + bias) in the permuted order the activations use.
template <int A, int C>
void DecodeTileT(const AffinePlanes& p, size_t r0, size_t r1, size_t b0, size_t b1, float* out,
                 size_t out_stride) {
  using Dec = BlockDecoder<A, C>;
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  Dec dec;
  RowParams params(p);
  for (size_t r = r0; r < r1; ++r) {
    params.load(p, static_cast<int64_t>(r));
    const uint32_t* lo_row = p.lo + static_cast<int64_t>(r) * p.lo_words;
    const uint32_t* hi_row = p.hi ? p.hi + static_cast<int64_t>(r) * p.hi_words : nullptr;
    for (size_t b = b0; b < b1; ++b) {
      const int64_t e0 = static_cast<int64_t>(b) * N;
      dec.Load(p, lo_row, hi_row, e0);
      const auto scale = params.lanes(params.scales, e0), bias = params.lanes(params.biases, e0);
      float* ob = out + (r - r0) * out_stride + (b - b0) * N * Dec::kCodesPerLane;
      ForEachCode(
          [&](auto k) {
            constexpr int K = decltype(k)::value;
            hn::StoreU(hn::MulAdd(dec.template Code<K>(), scale, bias), df, ob + K * N);
          },
          std::make_integer_sequence<int, Dec::kCodesPerLane>());
    }
  }
}

// The compile-time widths of one plane layout.
template <int A, int C>
struct Planes {
  static constexpr int kLo = A, kHi = C;
};

// One switch from the runtime plane widths to the compile-time kernels.
template <class Fn>
void WithPlanes(const AffinePlanes& p, Fn&& fn) {
  switch (p.lo_bits * 10 + p.hi_bits) {
    case 20: fn(Planes<2, 0>()); break;
    case 40: fn(Planes<4, 0>()); break;
    case 80: fn(Planes<8, 0>()); break;
    case 21: fn(Planes<2, 1>()); break;
    case 41: fn(Planes<4, 1>()); break;
    case 42: fn(Planes<4, 2>()); break;
    default: HWY_ABORT("affine planes %d+%d", p.lo_bits, p.hi_bits);
  }
}

void Matvec(const AffinePlanes& p, const float* xp, const float* xsum, size_t r0, size_t r1, float* y) {
  WithPlanes(p, [&](auto t) {
    using T = decltype(t);
    MatvecT<T::kLo, T::kHi>(p, xp, xsum, r0, r1, y);
  });
}

void DecodeTile(const AffinePlanes& p, size_t r0, size_t r1, size_t b0, size_t b1, float* out, size_t out_stride) {
  WithPlanes(p, [&](auto t) {
    using T = decltype(t);
    DecodeTileT<T::kLo, T::kHi>(p, r0, r1, b0, b1, out, out_stride);
  });
}

}  // namespace HWY_NAMESPACE
}  // namespace lowbit::kernels::affine_simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "lowbit/codec/affine.h"
#include "lowbit/core/thread_pool.h"

namespace lowbit::kernels {

namespace affine_simd {
HWY_EXPORT(Lanes);
HWY_EXPORT(Matvec);
HWY_EXPORT(DecodeTile);
}  // namespace affine_simd

namespace {

using codec::affine::Layout;

// Splits each row's b-bit stream into a low plane of lo_bits and a high plane of the remaining bits, both
// streams of whole codes per word. One pass with a bit buffer; no dense expansion.
void split_planes(const Layout& l, const uint32_t* codes, int lo_bits, uint32_t* lo, uint32_t* hi) {
  const int hi_bits = l.bits - lo_bits;
  const uint32_t mask = l.max_code(), lo_mask = (1u << lo_bits) - 1u;
  for (int64_t r = 0; r < l.rows; ++r) {
    const uint32_t* in = codes + r * l.words_per_row();
    uint64_t buffer = 0;
    int buffered = 0;
    uint32_t lo_word = 0, hi_word = 0;
    int lo_fill = 0, hi_fill = 0;
    for (int64_t c = 0; c < l.padded_cols; ++c) {
      if (buffered < l.bits) buffer |= static_cast<uint64_t>(*in++) << buffered, buffered += 32;
      const uint32_t q = static_cast<uint32_t>(buffer) & mask;
      buffer >>= l.bits, buffered -= l.bits;
      lo_word |= (q & lo_mask) << lo_fill;
      hi_word |= (q >> lo_bits) << hi_fill;
      if ((lo_fill += lo_bits) == 32) *lo++ = lo_word, lo_word = 0, lo_fill = 0;
      if ((hi_fill += hi_bits) == 32) *hi++ = hi_word, hi_word = 0, hi_fill = 0;
    }
  }
}

class AffineLinear final : public CpuLinear {
 public:
  explicit AffineLinear(const codec::TensorRef& t)
      : layout_(codec::affine::layout(t.params, t.shape)),
        codes_(t.arrays.at("codes")),
        scales_(t.arrays.at("scales")),
        biases_(t.arrays.at("biases")) {
    const int bits = layout_.bits;
    planes_.lo_bits = bits == 3 ? 2 : bits == 5 || bits == 6 ? 4 : bits;
    planes_.hi_bits = bits - planes_.lo_bits;
    planes_.rows = layout_.rows;
    planes_.group_size = layout_.group_size;
    planes_.groups = layout_.groups_per_row();
    planes_.lo_words = layout_.padded_cols * planes_.lo_bits / 32;
    planes_.hi_words = layout_.padded_cols * planes_.hi_bits / 32;
    planes_.scale_dtype = layout_.scale_dtype;
    planes_.scales = scales_.bytes.data();
    planes_.biases = biases_.bytes.data();
    if (planes_.hi_bits == 0) {
      planes_.lo = codes_.as<uint32_t>();
    } else {
      lo_plane_.resize(static_cast<size_t>(layout_.rows * planes_.lo_words));
      hi_plane_.resize(static_cast<size_t>(layout_.rows * planes_.hi_words));
      split_planes(layout_, codes_.as<uint32_t>(), planes_.lo_bits, lo_plane_.data(), hi_plane_.data());
      planes_.lo = lo_plane_.data();
      planes_.hi = hi_plane_.data();
    }
    lanes_ = static_cast<int64_t>(HWY_DYNAMIC_DISPATCH(affine_simd::Lanes)());
    block_codes_ = lanes_ * (32 / planes_.lo_bits);
    blocks_ = (planes_.lo_words + lanes_ - 1) / lanes_;
  }

  int64_t rows() const override { return layout_.rows; }
  int64_t cols() const override { return layout_.cols; }
  uint64_t weight_bytes() const override {
    return codes_.bytes.size() + scales_.bytes.size() + biases_.bytes.size();
  }

  // y [m, rows] = x [m, cols] @ W^T
  void matmul(const float* x, int64_t m, float* y, ThreadPool& pool) const override {
    const size_t xp_len = static_cast<size_t>(blocks_ * block_codes_);
    std::vector<float> xp(static_cast<size_t>(m) * xp_len, 0.0f);
    for (int64_t i = 0; i < m; ++i) permute(x + i * layout_.cols, xp.data() + i * xp_len);
    if (m == 1) {
      std::vector<float> xsum(static_cast<size_t>(planes_.groups), 0.0f);
      for (int64_t c = 0; c < layout_.cols; ++c) xsum[static_cast<size_t>(c / layout_.group_size)] += x[c];
      pool.parallel_for(static_cast<size_t>(layout_.rows), 16, [&](size_t r0, size_t r1) {
        HWY_DYNAMIC_DISPATCH(affine_simd::Matvec)(planes_, xp.data(), xsum.data(), r0, r1, y + r0);
      });
      return;
    }
    const size_t block = static_cast<size_t>(block_codes_);
    const size_t k_chunk = block * std::max<size_t>(1, 1024 / block);
    simd::tiled_matmul(
        static_cast<size_t>(layout_.rows), xp_len, k_chunk,
        [&](size_t r0, size_t r1, size_t k0, size_t k1, float* out, size_t stride) {
          HWY_DYNAMIC_DISPATCH(affine_simd::DecodeTile)(planes_, r0, r1, k0 / block, (k1 + block - 1) / block, out,
                                                        stride);
        },
        xp.data(), xp_len, static_cast<size_t>(m), y, static_cast<size_t>(layout_.rows), pool);
  }

  void gather_rows(std::span<const int32_t> ids, float* out) const override {
    check_gather_ids(ids, layout_.rows);
    const auto* codes = codes_.as<uint32_t>();
    for (const int32_t id : ids) {
      const uint32_t* words = codes + static_cast<int64_t>(id) * layout_.words_per_row();
      for (int64_t c = 0; c < layout_.cols; ++c) {
        const size_t g = static_cast<size_t>(id * layout_.groups_per_row() + c / layout_.group_size);
        const float s = load_float(scales_.dtype, scales_.bytes.data(), g);
        const float b = load_float(biases_.dtype, biases_.bytes.data(), g);
        *out++ = s * static_cast<float>(codec::affine::read_code(words, c, layout_.bits)) + b;
      }
    }
  }

 private:
  // xp[b * block + k * N + j] = x[(b * N + j) * codes_per_word + k]: lane j of block b owns low-plane word
  // b * N + j. Padding and the tail past the last word stay zero.
  void permute(const float* x, float* xp) const {
    const int64_t per_unit = 32 / planes_.lo_bits;
    for (int64_t e = 0; e * per_unit < layout_.cols; ++e) {
      float* dst = xp + (e / lanes_) * block_codes_ + (e % lanes_);
      const int64_t n = std::min(per_unit, layout_.cols - e * per_unit);
      for (int64_t k = 0; k < n; ++k) dst[k * lanes_] = x[e * per_unit + k];
    }
  }

  Layout layout_;
  TensorView codes_, scales_, biases_;
  AffinePlanes planes_;
  std::vector<uint32_t> lo_plane_, hi_plane_;  // only for 3, 5 and 6 bits
  int64_t lanes_ = 0, block_codes_ = 0, blocks_ = 0;
};

}  // namespace

std::unique_ptr<CpuLinear> prepare_affine(const codec::TensorRef& tensor) {
  return std::make_unique<AffineLinear>(tensor);
}

}  // namespace lowbit::kernels
#endif  // HWY_ONCE
