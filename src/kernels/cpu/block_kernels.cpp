// SIMD code for the row-block layout (see block_kernels.h), compiled per Highway target and dispatched at run
// time (the pattern of simd.cpp). AVX3_DL (AVX-512 with VNNI) is enabled here: its vpdpbusd is the matvec's
// inner instruction; other targets emulate it with 16-bit multiply-adds.
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "block_kernels.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "block_kernels.h"

HWY_BEFORE_NAMESPACE();
namespace lowbit::kernels::block_simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Highway's AVX3_DL target string lacks avx512vnni; functions that reach vpdpbusd add it, the lambdas among
// them included. The attribute restates the whole target string: under clang a function's own target attribute
// replaces the one HWY_BEFORE_NAMESPACE applies, so "avx512vnni" alone would drop AVX-512 itself.
#undef LOWBIT_VNNI
#if HWY_TARGET == HWY_AVX3_DL
#define LOWBIT_VNNI __attribute__((target(HWY_TARGET_STR ",avx512vnni")))
#else
#define LOWBIT_VNNI
#endif

using DF = hn::ScalableTag<float>;
using DU = hn::RebindToUnsigned<DF>;
using DI = hn::RebindToSigned<DF>;

constexpr int N = static_cast<int>(hn::MaxLanes(DF()));
constexpr int S = static_cast<int>(kBlockRows) / N;  // vectors per 16 rows
static_assert(S >= 1 && S * N == kBlockRows);

template <class Fn, int... K>
HWY_INLINE void ForEach(Fn&& fn, std::integer_sequence<int, K...>) {
  (fn(std::integral_constant<int, K>()), ...);
}

// acc + per lane, the sum over its four bytes of codes (u8) times digits (s8, the same four in every lane).
LOWBIT_VNNI HWY_INLINE hn::Vec<DI> DotBytes(hn::Vec<DI> acc, hn::Vec<DU> codes, uint32_t digits) {
#if HWY_TARGET == HWY_AVX3_DL
  return hn::Vec<DI>{_mm512_dpbusd_epi32(acc.raw, codes.raw, _mm512_set1_epi32(static_cast<int>(digits)))};
#elif HWY_TARGET == HWY_SCALAR
  const uint32_t c = hn::GetLane(codes);
  int32_t sum = 0;
  for (int b = 0; b < 4; ++b)
    sum += static_cast<int32_t>((c >> (8 * b)) & 255u) * static_cast<int8_t>(static_cast<uint8_t>(digits >> (8 * b)));
  return hn::Add(acc, hn::Set(DI(), sum));
#else
  // Even and odd bytes as 16-bit lanes, then pairwise multiply-adds (vpmaddwd): exact.
  const hn::Repartition<int16_t, DF> d16;
  const hn::Repartition<uint16_t, DF> du16;
  const auto c16 = hn::BitCast(du16, codes);
  const auto c_even = hn::BitCast(d16, hn::And(c16, hn::Set(du16, 0xFF)));
  const auto c_odd = hn::BitCast(d16, hn::ShiftRight<8>(c16));
  const auto x16 = hn::BitCast(d16, hn::Set(DU(), digits));
  const auto x_even = hn::ShiftRight<8>(hn::ShiftLeft<8>(x16));
  const auto x_odd = hn::ShiftRight<8>(x16);
  auto extra = hn::Zero(DI());
  auto sum = hn::ReorderWidenMulAccumulate(DI(), c_even, x_even, acc, extra);
  sum = hn::ReorderWidenMulAccumulate(DI(), c_odd, x_odd, sum, extra);
  return hn::Add(sum, extra);
#endif
}

template <int From, int To>
HWY_INLINE hn::Vec<DU> ShiftTo(hn::Vec<DU> v) {
  if constexpr (From > To)
    return hn::ShiftRight<From - To>(v);
  else
    return hn::ShiftLeft<To - From>(v);
}

constexpr uint32_t ByteMask(uint32_t m) { return m * 0x01010101u; }

// Extraction K of a plane of width P (words[j] = the lanes' word j of the chunk): the codes of columns
// 4K .. 4K + 3 in each lane's bytes.
template <int P, int K>
HWY_INLINE hn::Vec<DU> Field(const hn::Vec<DU>* words) {
  constexpr int kFields = 8 / P;
  const auto v = words[K / kFields];
  if constexpr (P == 8) return v;
  return hn::And(hn::ShiftRight<P * (K % kFields)>(v), hn::Set(DU(), ByteMask((1u << P) - 1u)));
}

// code = lo | hi << A for extraction K.
template <int A, int C, int K>
HWY_INLINE hn::Vec<DU> Code(const hn::Vec<DU>* lo, const hn::Vec<DU>* hi) {
  const auto q = Field<A, K>(lo);
  if constexpr (C == 0) {
    return q;
  } else {
    constexpr int kFields = 8 / C;
    const auto moved = ShiftTo<C*(K % kFields), A>(hi[K / kFields]);
    return hn::OrAnd(q, moved, hn::Set(DU(), ByteMask(((1u << C) - 1u) << A)));
  }
}

// 16 values of one metadata slot, converted to f32 (N at a time).
HWY_INLINE hn::Vec<DF> LoadMeta(DType dtype, const uint8_t* slot, int s) {
  const DF df;
  switch (dtype) {
    case DType::BF16:
      return hn::PromoteTo(df, hn::LoadU(hn::Rebind<hwy::bfloat16_t, DF>(),
                                         reinterpret_cast<const hwy::bfloat16_t*>(slot) + s * N));
    case DType::F16:
      return hn::PromoteTo(df, hn::LoadU(hn::Rebind<hwy::float16_t, DF>(),
                                         reinterpret_cast<const hwy::float16_t*>(slot) + s * N));
    default:
      return hn::LoadU(df, reinterpret_cast<const float*>(slot) + s * N);
  }
}

// A group's metadata for rows s N .. s N + N - 1 of a block, in the form w = scale0 lo' + scale1 hi + bias,
// where lo' is the whole code unless two_scales.
struct GroupMeta {
  hn::Vec<DF> scale0, scale1, bias;
  HWY_INLINE GroupMeta(const BlockMatrix& m, const uint8_t* meta, int s) {
    const size_t slot = kBlockRows * dtype_size(m.meta_dtype);
    scale0 = LoadMeta(m.meta_dtype, meta, s);
    scale1 = hn::Zero(DF());
    switch (m.meta) {
      case BlockMeta::scale_bias: bias = LoadMeta(m.meta_dtype, meta + slot, s); break;
      case BlockMeta::scale_offset: bias = hn::Mul(scale0, hn::Set(DF(), -m.offset)); break;
      case BlockMeta::two_scales:
        scale1 = LoadMeta(m.meta_dtype, meta + slot, s);
        bias = LoadMeta(m.meta_dtype, meta + 2 * slot, s);
        break;
    }
  }
  // What multiplies BlockActivations::bias_x: the bias, or for scale_offset the scale (bias_x holds -offset sum x).
  static HWY_INLINE hn::Vec<DF> BiasTerm(const BlockMatrix& m, const uint8_t* meta, int s) {
    const size_t slot = kBlockRows * dtype_size(m.meta_dtype);
    const int bias_slot = m.meta == BlockMeta::scale_offset ? 0 : m.meta == BlockMeta::scale_bias ? 1 : 2;
    return LoadMeta(m.meta_dtype, meta + bias_slot * slot, s);
  }
};

// The two digits' dot products combined (d1 2^8 + d0), in f32.
HWY_INLINE hn::Vec<DF> Combine(const hn::Vec<DI>* acc) {
  const DF df;
  return hn::MulAdd(hn::ConvertTo(df, acc[1]), hn::Set(df, 256.0f), hn::ConvertTo(df, acc[0]));
}

// How far ahead of the record being multiplied the matvec asks for the stream to be loaded into L2: the
// hardware prefetcher alone keeps too few misses in flight while a core also computes (measured: 20-40% more
// bytes streamed from DRAM per CPU-second; 2-3 KB ahead into L2 did better than 1 KB into L1).
constexpr int64_t kPrefetchBytes = 2048;

// y[r] for the rows of blocks [b0, b1) (rows past m.rows are not written). E: extractions per chunk, 8 (32
// columns) or 4 (groups of 16: half a chunk, the first half of each plane's words). kSets independent
// accumulator sets (extraction K feeds set K % kSets) give enough vpdpbusd chains to hide their latency within a
// group; a group of one chunk (16 or 32 columns) takes one set: its products are short chains already, the next
// group's overlap them, and the sets' sum would cost a sixth of its instructions.
template <int A, int C, bool kTwo, int E, int kSets>
LOWBIT_VNNI void MatvecT(const BlockMatrix& m, const BlockActivations& x, size_t b0, size_t b1, float* y) {
  const DF df;
  const DU du;
  constexpr int kTerms = kTwo ? 2 : 1;
  constexpr int WA = A * E / 8, WC = C * E / 8;  // words of each plane per chunk
  const int64_t groups = m.groups(), chunks = m.group_size / (4 * E), record_bytes = m.record_bytes();
  const int64_t code_bytes = m.code_bytes();
  const uint8_t* const records = m.records.get();
  const auto records_bytes = static_cast<int64_t>(m.bytes());
  for (size_t blk = b0; blk < b1; ++blk) {
    hn::Vec<DF> total[S], bias_total[S];
    for (int s = 0; s < S; ++s) total[s] = bias_total[s] = hn::Zero(df);
    const uint8_t* rec = m.record(static_cast<int64_t>(blk), 0);
    for (int64_t g = 0; g < groups; ++g, rec += record_bytes) {
      const int64_t ahead = (rec - records) + kPrefetchBytes;
      for (int64_t at = ahead; at < ahead + record_bytes && at < records_bytes; at += 64)
        __builtin_prefetch(records + at, 0, 2);
      hn::Vec<DI> acc[S][kTerms][kSets][kDigits];
      for (int s = 0; s < S; ++s)
        for (int t = 0; t < kTerms; ++t)
          for (int p = 0; p < kSets; ++p)
            for (int d = 0; d < kDigits; ++d) acc[s][t][p][d] = hn::Zero(DI());
      for (int64_t c = 0; c < chunks; ++c) {
        const auto* words = reinterpret_cast<const uint32_t*>(rec + c * (A + C) * 8 * E);
        const int8_t* xd = x.digits + g * m.group_size + c * 4 * E;
        for (int s = 0; s < S; ++s) {
          hn::Vec<DU> lo[A], hi[std::max(C, 1)];
          for (int j = 0; j < WA; ++j) lo[j] = hn::LoadU(du, words + j * kBlockRows + s * N);
          for (int j = 0; j < WC; ++j) hi[j] = hn::LoadU(du, words + (WA + j) * kBlockRows + s * N);
          ForEach(
              [&](auto k) LOWBIT_VNNI {
                constexpr int K = decltype(k)::value;
                uint32_t d[kDigits];
                for (int t = 0; t < kDigits; ++t) std::memcpy(&d[t], xd + t * m.padded_cols + 4 * K, 4);
                auto& a = acc[s];
                if constexpr (kTwo) {
                  const auto q0 = Field<A, K>(lo), q1 = Field<C, K>(hi);
                  for (int t = 0; t < kDigits; ++t) {
                    a[0][K % kSets][t] = DotBytes(a[0][K % kSets][t], q0, d[t]);
                    a[1][K % kSets][t] = DotBytes(a[1][K % kSets][t], q1, d[t]);
                  }
                } else {
                  const auto q = Code<A, C, K>(lo, hi);
                  for (int t = 0; t < kDigits; ++t) a[0][K % kSets][t] = DotBytes(a[0][K % kSets][t], q, d[t]);
                }
              },
              std::make_integer_sequence<int, E>());
        }
      }
      const uint8_t* meta = rec + code_bytes;
      const size_t slot = kBlockRows * dtype_size(m.meta_dtype);
      const auto factor = hn::Set(df, x.factor[g]), bias_x = hn::Set(df, x.bias_x[g]);
      for (int s = 0; s < S; ++s) {
        for (int t = 0; t < kTerms; ++t) {
          hn::Vec<DI> sum[kDigits];
          for (int d = 0; d < kDigits; ++d) {
            sum[d] = acc[s][t][0][d];
            for (int p = 1; p < kSets; ++p) sum[d] = hn::Add(sum[d], acc[s][t][p][d]);
          }
          total[s] = hn::MulAdd(Combine(sum), hn::Mul(LoadMeta(m.meta_dtype, meta + t * slot, s), factor), total[s]);
        }
        bias_total[s] = hn::MulAdd(GroupMeta::BiasTerm(m, meta, s), bias_x, bias_total[s]);
      }
    }
    HWY_ALIGN float out[kBlockRows];
    for (int s = 0; s < S; ++s) hn::Store(hn::Add(total[s], bias_total[s]), df, out + s * N);
    const int64_t r0 = static_cast<int64_t>(blk) * kBlockRows;
    std::copy_n(out, std::min(kBlockRows, m.rows - r0), y + r0);
  }
}

// Columns [k0, k1) (multiples of 4 E) of block blk decoded to f32, column-major: out[(c - k0) 16 + r].
template <int A, int C, bool kTwo, int E>
void DecodeTileT(const BlockMatrix& m, size_t blk, size_t k0, size_t k1, float* out) {
  const DF df;
  const DU du;
  constexpr int WA = A * E / 8, WC = C * E / 8;
  const auto G = static_cast<size_t>(m.group_size);
  for (size_t c0 = k0; c0 < k1; c0 += 4 * E) {
    const uint8_t* rec = m.record(static_cast<int64_t>(blk), static_cast<int64_t>(c0 / G));
    const auto* words = reinterpret_cast<const uint32_t*>(rec + (c0 % G) / (4 * E) * (A + C) * 8 * E);
    for (int s = 0; s < S; ++s) {
      const GroupMeta meta(m, rec + m.code_bytes(), s);
      hn::Vec<DU> lo[A], hi[std::max(C, 1)];
      for (int j = 0; j < WA; ++j) lo[j] = hn::LoadU(du, words + j * kBlockRows + s * N);
      for (int j = 0; j < WC; ++j) hi[j] = hn::LoadU(du, words + (WA + j) * kBlockRows + s * N);
      float* o = out + (c0 - k0) * kBlockRows + s * N;
      ForEach(
          [&](auto k) {
            constexpr int K = decltype(k)::value;
            const auto q0 = kTwo ? Field<A, K>(lo) : Code<A, C, K>(lo, hi);
            ForEach(
                [&](auto b) {
                  constexpr int B = decltype(b)::value;
                  const auto byte = [&](hn::Vec<DU> q) {
                    return hn::ConvertTo(df, hn::BitCast(DI(), hn::And(hn::ShiftRight<8 * B>(q), hn::Set(du, 255u))));
                  };
                  auto w = hn::MulAdd(byte(q0), meta.scale0, meta.bias);
                  if constexpr (kTwo) w = hn::MulAdd(byte(Field<C, K>(hi)), meta.scale1, w);
                  hn::StoreU(w, df, o + (4 * K + B) * kBlockRows);
                },
                std::make_integer_sequence<int, 4>());
          },
          std::make_integer_sequence<int, E>());
    }
  }
}

// x (zero-padded to padded_cols) quantized per group to integers X = round(x / factor), |X| <= kLargestX, as
// two signed digits X = d1 2^8 + d0; bias_x from the same X, so that the matvec computes W x' for x' = X factor
// (see block_kernels.h). A group holding Inf or NaN gets factor NaN (its rows' sums become NaN, as an f32
// kernel's would).
void Quantize(const BlockMatrix& m, const float* xp, const BlockActivations& out) {
  const DF df;
  const DI di;
  const hn::Rebind<int8_t, DI> d8;
  const int64_t G = m.group_size;
  for (int64_t g = 0; g < m.groups(); ++g) {
    const float* xg = xp + g * G;
    auto amax = hn::Zero(df), nonfinite = hn::Zero(df);
    for (int64_t c = 0; c < G; c += N) {
      const auto v = hn::LoadU(df, xg + c);
      amax = hn::Max(amax, hn::Abs(v));
      nonfinite = hn::Add(nonfinite, hn::Sub(v, v));  // NaN once any lane is Inf or NaN
    }
    const float largest = hn::GetLane(hn::MaxOfLanes(df, amax));
    if (!(hn::GetLane(hn::SumOfLanes(df, nonfinite)) == 0.0f)) {
      out.factor[g] = out.bias_x[g] = std::numeric_limits<float>::quiet_NaN();
      for (int t = 0; t < kDigits; ++t)
        std::memset(out.digits + t * m.padded_cols + g * G, 0, static_cast<size_t>(G));
      continue;
    }
    // Groups whose largest |x| is below kSmallestScaled share its scale (kLargestX / largest would overflow).
    const float up = kLargestX / std::max(largest, kSmallestScaled);
    const float factor = 1.0f / up;
    const auto half = hn::Set(di, 128), low = hn::Set(di, 255);
    auto sum = hn::Zero(di);
    for (int64_t c = 0; c < G; c += N) {
      auto v = hn::NearestInt(hn::Mul(hn::LoadU(df, xg + c), hn::Set(df, up)));
      sum = hn::Add(sum, v);
      for (int t = 0; t < kDigits; ++t) {
        const auto d = hn::Sub(hn::And(hn::Add(v, half), low), half);
        hn::StoreU(hn::DemoteTo(d8, d), d8, out.digits + t * m.padded_cols + g * G + c);
        v = hn::ShiftRight<8>(hn::Sub(v, d));
      }
    }
    // The sum of X is exact in f32: |sum| <= 128 kLargestX < 2^24.
    const float x_sum = static_cast<float>(hn::GetLane(hn::SumOfLanes(di, sum))) * factor;
    out.factor[g] = factor;
    out.bias_x[g] = m.meta == BlockMeta::scale_offset ? -m.offset * x_sum : x_sum;
  }
}

// The compile-time plane widths of one layout, and its extractions per chunk.
template <int A, int C, bool kTwo, int E = 8>
struct Planes {
  static constexpr int kLo = A, kHi = C, kExtractions = E;
  static constexpr bool kTwoScales = kTwo;
};

template <class Fn>
void WithPlanes(const BlockMatrix& m, Fn&& fn) {
  const bool two = m.meta == BlockMeta::two_scales;
  switch (m.lo_bits * 10 + m.hi_bits + (two ? 100 : 0) + (m.group_size == 16 ? 1000 : 0)) {
    case 20: fn(Planes<2, 0, false>()); break;
    case 40: fn(Planes<4, 0, false>()); break;
    case 80: fn(Planes<8, 0, false>()); break;
    case 21: fn(Planes<2, 1, false>()); break;
    case 41: fn(Planes<4, 1, false>()); break;
    case 42: fn(Planes<4, 2, false>()); break;
    case 122: fn(Planes<2, 2, true>()); break;
    case 1020: fn(Planes<2, 0, false, 4>()); break;
    case 1040: fn(Planes<4, 0, false, 4>()); break;
    case 1080: fn(Planes<8, 0, false, 4>()); break;
    case 1042: fn(Planes<4, 2, false, 4>()); break;
    default: HWY_ABORT("block planes %d+%d, groups of %d", m.lo_bits, m.hi_bits, static_cast<int>(m.group_size));
  }
}

void Matvec(const BlockMatrix& m, const BlockActivations& x, size_t b0, size_t b1, float* y) {
  WithPlanes(m, [&](auto p) {
    using P = decltype(p);
    if (m.group_size <= 32)
      MatvecT<P::kLo, P::kHi, P::kTwoScales, P::kExtractions, 1>(m, x, b0, b1, y);
    else
      MatvecT<P::kLo, P::kHi, P::kTwoScales, P::kExtractions, P::kTwoScales ? 2 : 4>(m, x, b0, b1, y);
  });
}

void DecodeTile(const BlockMatrix& m, size_t blk, size_t k0, size_t k1, float* out) {
  WithPlanes(m, [&](auto p) {
    using P = decltype(p);
    DecodeTileT<P::kLo, P::kHi, P::kTwoScales, P::kExtractions>(m, blk, k0, k1, out);
  });
}

// acc[i 16 + r] += sum_k wt[k 16 + r] x[i x_stride + k] for i < MB: each loaded weight vector feeds MB FMAs.
template <int MB>
HWY_INLINE void TileDotRows(const float* wt, size_t k_len, const float* x, size_t x_stride, float* acc) {
  const DF df;
  hn::Vec<DF> a[MB][S];
  for (int i = 0; i < MB; ++i)
    for (int s = 0; s < S; ++s) a[i][s] = hn::Zero(df);
  for (size_t k = 0; k < k_len; ++k) {
    hn::Vec<DF> w[S];
    for (int s = 0; s < S; ++s) w[s] = hn::LoadU(df, wt + k * kBlockRows + s * N);
    for (int i = 0; i < MB; ++i) {
      const auto xi = hn::Set(df, x[i * x_stride + k]);
      for (int s = 0; s < S; ++s) a[i][s] = hn::MulAdd(w[s], xi, a[i][s]);
    }
  }
  for (int i = 0; i < MB; ++i)
    for (int s = 0; s < S; ++s) {
      float* p = acc + i * kBlockRows + s * N;
      hn::StoreU(hn::Add(hn::LoadU(df, p), a[i][s]), df, p);
    }
}

// The batched path's inner product over one decoded column-major tile, for m activation rows.
void TileDot(const float* wt, size_t k_len, const float* x, size_t x_stride, size_t m, float* acc) {
  constexpr int kMB = S == 1 ? 8 : S == 2 ? 4 : 1;
  size_t i = 0;
  for (; i + kMB <= m; i += kMB) TileDotRows<kMB>(wt, k_len, x + i * x_stride, x_stride, acc + i * kBlockRows);
  for (; i < m; ++i) TileDotRows<1>(wt, k_len, x + i * x_stride, x_stride, acc + i * kBlockRows);
}

const char* TargetName() { return hwy::TargetName(HWY_TARGET); }

}  // namespace HWY_NAMESPACE
}  // namespace lowbit::kernels::block_simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "lowbit/core/checked.h"
#include "lowbit/core/error.h"
#include "lowbit/core/thread_pool.h"

namespace lowbit::kernels {

namespace block_simd {
HWY_EXPORT(Quantize);
HWY_EXPORT(Matvec);
HWY_EXPORT(DecodeTile);
HWY_EXPORT(TileDot);
HWY_EXPORT(TargetName);
}  // namespace block_simd

namespace {

bool supported_planes(int lo, int hi, BlockMeta meta, int64_t group_size) {
  if (group_size == 16)  // half chunks: planes whose first half of words holds columns 0..15
    return meta != BlockMeta::two_scales && (hi == 0 || hi == 2) && (lo == 2 || lo == 4 || lo == 8) && lo + hi <= 8;
  if (meta == BlockMeta::two_scales) return lo == 2 && hi == 2;
  return (hi == 0 && (lo == 2 || lo == 4 || lo == 8)) || (lo == 2 && hi == 1) || (lo == 4 && (hi == 1 || hi == 2));
}

// Byte and bit of the field holding column cc (0..31) of a chunk in a plane of width p, row rr of the block.
struct FieldPos {
  int64_t byte;
  int shift;
};
FieldPos field_pos(int p, int64_t cc, int64_t rr) {
  const int64_t k = cc / 4, b = cc % 4, fields = 8 / p;
  return {(k / fields) * 64 + rr * 4 + b, static_cast<int>(p * (k % fields))};
}

}  // namespace

BlockMatrix::BlockMatrix(int lo, int hi, BlockMeta meta_, DType meta_dtype_, int64_t rows_, int64_t cols_,
                         int64_t padded_cols_, int64_t group_size_)
    : lo_bits(lo),
      hi_bits(hi),
      meta(meta_),
      meta_dtype(meta_dtype_),
      rows(rows_),
      cols(cols_),
      padded_cols(padded_cols_),
      group_size(group_size_) {
  if (!supported_planes(lo, hi, meta, group_size) ||
      (group_size != 16 && group_size != 32 && group_size != 64 && group_size != 128) ||
      padded_cols % group_size != 0 || padded_cols < cols || rows < 1 ||
      (meta_dtype != DType::F32 && meta_dtype != DType::F16 && meta_dtype != DType::BF16))
    fail(Errc::internal, "[block_kernels] unsupported layout: planes {}+{}, {} x {} (padded {}), groups of {}", lo,
         hi, rows, cols, padded_cols, group_size);
  const uint64_t n = checked_mul(checked_mul(static_cast<uint64_t>(blocks()), static_cast<uint64_t>(groups()),
                                             "[block_kernels]"),
                                 static_cast<uint64_t>(record_bytes()), "[block_kernels]");
  records = hwy::AllocateAligned<uint8_t>(n);
  if (!records) fail(Errc::limit, "[block_kernels] cannot allocate {} bytes", n);
  std::memset(records.get(), 0, n);
}

void BlockMatrix::set_row_codes(int64_t r, const uint8_t* lo, const uint8_t* hi) {
  const int64_t rr = r % kBlockRows;
  const int planes = hi_bits ? 2 : 1;
  // Where each column of a chunk goes, per plane: the same for every chunk of the row (computed once; the
  // divisions in field_pos dominated preparing a matrix when done per code).
  const int64_t cols_per_chunk = chunk_cols();
  FieldPos pos[2][32];
  for (int plane = 0; plane < planes; ++plane)
    for (int64_t cc = 0; cc < cols_per_chunk; ++cc) pos[plane][cc] = field_pos(plane ? hi_bits : lo_bits, cc, rr);
  for (int64_t g = 0; g < groups(); ++g) {
    uint8_t* words = record(r / kBlockRows, g);
    for (int64_t chunk = 0; chunk < group_size / cols_per_chunk; ++chunk, words += chunk_bytes()) {
      const int64_t c0 = g * group_size + chunk * cols_per_chunk;
      for (int plane = 0; plane < planes; ++plane) {
        const uint8_t* codes = (plane ? hi : lo) + c0;
        uint8_t* base = words + (plane ? lo_bits * 2 * cols_per_chunk : 0);
        for (int64_t cc = 0; cc < cols_per_chunk; ++cc) {
          const FieldPos f = pos[plane][cc];
          base[f.byte] = static_cast<uint8_t>(base[f.byte] | codes[cc] << f.shift);
        }
      }
    }
  }
}

void BlockMatrix::set_meta(int64_t r, int64_t g, int slot, const std::byte* value) {
  const size_t size = dtype_size(meta_dtype);
  std::memcpy(record(r / kBlockRows, g) + code_bytes() + (slot * kBlockRows + r % kBlockRows) * int64_t(size), value,
              size);
}

float BlockMatrix::weight(int64_t r, int64_t c) const {
  const uint8_t* rec = record(r / kBlockRows, c / group_size);
  const int64_t cc = chunk_cols();
  const uint8_t* words = rec + (c % group_size) / cc * chunk_bytes();
  const FieldPos l = field_pos(lo_bits, c % cc, r % kBlockRows);
  const uint32_t lo = (words[l.byte] >> l.shift) & ((1u << lo_bits) - 1u);
  uint32_t hi = 0;
  if (hi_bits != 0) {
    const FieldPos h = field_pos(hi_bits, c % cc, r % kBlockRows);
    hi = (words[lo_bits * 2 * cc + h.byte] >> h.shift) & ((1u << hi_bits) - 1u);
  }
  const auto* meta_bytes = reinterpret_cast<const std::byte*>(rec + code_bytes());
  const auto slot = [&](int i) { return load_float(meta_dtype, meta_bytes, size_t(i * kBlockRows + r % kBlockRows)); };
  switch (meta) {
    case BlockMeta::scale_bias: return slot(0) * static_cast<float>(lo | hi << lo_bits) + slot(1);
    case BlockMeta::scale_offset: return slot(0) * (static_cast<float>(lo | hi << lo_bits) - offset);
    case BlockMeta::two_scales: return slot(0) * static_cast<float>(lo) + slot(1) * static_cast<float>(hi) + slot(2);
  }
  return 0.0f;
}

namespace {

constexpr size_t kChunkCols = 1024;  // batched path: columns decoded per tile

class BlockLinear final : public CpuLinear {
 public:
  BlockLinear(BlockMatrix m, uint64_t stored_bytes) : m_(std::move(m)), stored_bytes_(stored_bytes) {}
  int64_t rows() const override { return m_.rows; }
  int64_t cols() const override { return m_.cols; }
  uint64_t weight_bytes() const override { return stored_bytes_; }
  bool reads_stored_arrays() const override { return false; }

  // y [m, rows] = x [m, cols] @ W^T
  void matmul(const float* x, int64_t m, float* y, ThreadPool& pool) const override {
    if (m == 1) return matvec(x, y, pool);
    // Activations zero-padded to the padded width: padding codes meet zeros, never data.
    const auto padded = static_cast<size_t>(m_.padded_cols), rows = static_cast<size_t>(m_.rows);
    std::vector<float> xp(static_cast<size_t>(m) * padded, 0.0f);
    for (int64_t i = 0; i < m; ++i) std::copy_n(x + i * m_.cols, m_.cols, xp.data() + i * padded);
    const size_t k_chunk = std::min(kChunkCols, padded);
    pool.parallel_for(static_cast<size_t>(m_.blocks()), 1, [&](size_t b0, size_t b1) {
      std::vector<float> tile(k_chunk * kBlockRows), acc(static_cast<size_t>(m) * kBlockRows);
      for (size_t blk = b0; blk < b1; ++blk) {
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (size_t k0 = 0; k0 < padded; k0 += k_chunk) {
          const size_t k1 = std::min(padded, k0 + k_chunk);
          HWY_DYNAMIC_DISPATCH(block_simd::DecodeTile)(m_, blk, k0, k1, tile.data());
          HWY_DYNAMIC_DISPATCH(block_simd::TileDot)(tile.data(), k1 - k0, xp.data() + k0, padded,
                                                    static_cast<size_t>(m), acc.data());
        }
        const size_t r0 = blk * kBlockRows, n = std::min<size_t>(kBlockRows, rows - r0);
        for (int64_t i = 0; i < m; ++i) std::copy_n(acc.data() + i * kBlockRows, n, y + i * rows + r0);
      }
    });
  }

  void gather_rows(std::span<const int32_t> ids, float* out) const override {
    check_gather_ids(ids, m_.rows);
    for (const int32_t id : ids)
      for (int64_t c = 0; c < m_.cols; ++c) *out++ = m_.weight(id, c);
  }

 private:
  void matvec(const float* x, float* y, ThreadPool& pool) const {
    const auto padded = static_cast<size_t>(m_.padded_cols), groups = static_cast<size_t>(m_.groups());
    std::vector<float> xp(padded, 0.0f);
    std::copy_n(x, m_.cols, xp.data());
    std::vector<int8_t> digits(kDigits * padded);
    std::vector<float> factor(groups), bias_x(groups);
    const BlockActivations a{digits.data(), factor.data(), bias_x.data()};
    HWY_DYNAMIC_DISPATCH(block_simd::Quantize)(m_, xp.data(), a);
    // Two contiguous ranges of blocks per thread: each thread streams long runs of records.
    const auto blocks = static_cast<size_t>(m_.blocks());
    const size_t grain = std::max<size_t>(1, (blocks + 2 * pool.size() - 1) / (2 * pool.size()));
    pool.parallel_for(blocks, grain, [&](size_t b0, size_t b1) {
      HWY_DYNAMIC_DISPATCH(block_simd::Matvec)(m_, a, b0, b1, y);
    });
  }

  BlockMatrix m_;
  uint64_t stored_bytes_;
};

}  // namespace

const char* block_target_name() { return HWY_DYNAMIC_DISPATCH(block_simd::TargetName)(); }

std::unique_ptr<CpuLinear> make_block_linear(BlockMatrix matrix, uint64_t stored_bytes) {
  return std::make_unique<BlockLinear>(std::move(matrix), stored_bytes);
}

}  // namespace lowbit::kernels
#endif  // HWY_ONCE
