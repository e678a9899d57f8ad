// SIMD code for the table-lookup layouts (see lut_kernels.h), compiled per Highway target and dispatched at run
// time (the pattern of simd.cpp).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/lut_kernels.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/lut_kernels.h"

HWY_BEFORE_NAMESPACE();
namespace lowbit::kernels::lut_simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using DU = hn::RebindToUnsigned<DF>;

constexpr int N = static_cast<int>(hn::MaxLanes(DF()));

HWY_INLINE float LoadMeta(const uint8_t* p, int i) {
  float v;
  std::memcpy(&v, p + 4 * i, 4);
  return v;
}

// Lane mask of vector v of a bit plane (bit j of the plane is weight j of the group).
HWY_INLINE hn::Mask<DU> PlaneMask(const uint8_t* plane, int v) {
  const DU du;
  if constexpr (N >= 8) {
    return hn::LoadMaskBits(du, plane + v * N / 8);
  } else {
    const uint8_t bits = static_cast<uint8_t>(plane[v * N / 8] >> ((v * N) % 8));
    return hn::LoadMaskBits(du, &bits);
  }
}

// N bytes of a record as u32 lanes.
HWY_INLINE hn::Vec<DU> LoadBytes(const uint8_t* p) {
  const hn::Rebind<uint8_t, DU> d8;
  return hn::PromoteTo(DU(), hn::LoadU(d8, p));
}

// vpermps reads only the low 4 bits of each index, so with 16 lanes codes need no masking off of their
// neighbours' bits; Highway's portable lookup requires clean indices, so other targets mask.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
constexpr bool kPermLow4 = true;
#else
constexpr bool kPermLow4 = false;
#endif

template <class K>
struct Lut;

// The kinds. A block is kSubs vectors of N consecutive weights; Weights() gives vector s of block b from the
// block's bytes, through the group's table.
template <int G, bool kTwoPlanes>
struct Nibbles {  // block of 2N weights in N bytes: byte j = code j | code (j + N) << 4
  static constexpr int kGroup = G, kSubs = 2, kEntries = 16, kCodeBytes = G / 2;
  static constexpr int kRecordBytes = kCodeBytes + 4 * (kTwoPlanes ? 3 : 1);
  static constexpr bool kTwo = kTwoPlanes;
  static constexpr float C0(int code) { return static_cast<float>(kTwoPlanes ? code & 3 : code); }
  static constexpr float C1(int code) { return static_cast<float>(kTwoPlanes ? code >> 2 : 0); }
  static HWY_INLINE hn::Vec<DU> Bytes(const uint8_t* rec, int b) { return LoadBytes(rec + b * N); }
  static HWY_INLINE hn::Vec<DF> Weights(const Lut<Nibbles>& lut, hn::Vec<DU> bytes, const uint8_t*, int, int s) {
    return lut.LookupLow4(s == 0 ? bytes : hn::ShiftRight<4>(bytes));
  }
};

// Block of 4N weights: N bytes of low 2 bits (weight j + kN in bits 2k, 2k + 1 of byte j), and per group a
// plane of high bits after all blocks. With kPermLow4 the table holds value(code & 3) in all 16 entries and the
// high bit adds 4 * scale under its mask; otherwise the code is assembled and looked up in 8 entries.
struct Crumbs3 {
  static constexpr int kGroup = 64, kSubs = 4, kEntries = kPermLow4 ? 16 : 8, kCodeBytes = kGroup / 4 + kGroup / 8;
  static constexpr int kRecordBytes = kCodeBytes + 4;
  static constexpr bool kTwo = false;
  static constexpr float C0(int code) { return static_cast<float>(kPermLow4 ? code & 3 : code); }
  static constexpr float C1(int) { return 0.0f; }
  static HWY_INLINE hn::Vec<DU> Bytes(const uint8_t* rec, int b) { return LoadBytes(rec + b * N); }
  template <class L>  // Lut<Crumbs3>, complete only where this is called
  static HWY_INLINE hn::Vec<DF> Weights(const L& lut, hn::Vec<DU> bytes, const uint8_t* rec, int b, int s) {
    const DU du;
    const auto high = PlaneMask(rec + kGroup / 4, b * kSubs + s);
    if constexpr (kPermLow4) {
      const auto w = lut.LookupLow4(hn::ShiftRightSame(bytes, 2 * s));
      return hn::IfThenElse(hn::RebindMask(DF(), high), hn::Add(w, lut.high), w);
    } else {
      const auto low = hn::And(hn::ShiftRightSame(bytes, 2 * s), hn::Set(du, 3u));
      return lut.Lookup(hn::IfThenElse(high, hn::Or(low, hn::Set(du, 4u)), low));
    }
  }
};

using OffsetScale3 = Crumbs3;
using OffsetScale4 = Nibbles<64, false>;
using TwoPlane = Nibbles<128, true>;

// A group's table of values, lut[code] = s0 * C0(code) + s1 * C1(code) + bias: one vector when it fits, two
// for 16 entries in 8 lanes, a scalar array below.
template <class K>
struct Lut {
  static constexpr int kVectors = N >= K::kEntries ? 1 : N == 8 ? 2 : 0;
  hn::Vec<DF> v[kVectors > 0 ? kVectors : 1];
  hn::Vec<DF> high;  // Crumbs3 with kPermLow4: 4 * scale
  float table[16];

  // The per-call part of the tables: the coefficient vectors, offset_scale's offset folded into c0.
  struct Basis {
    hn::Vec<DF> c0[kVectors > 0 ? kVectors : 1], c1[kVectors > 0 ? kVectors : 1];
    float bias_per_scale;
    explicit Basis(float bias_per_scale_) : bias_per_scale(bias_per_scale_) {
      const DF d;
      for (int i = 0; i < kVectors; ++i) {
        c0[i] = hn::LoadU(d, kC0.data() + i * N);
        if constexpr (!K::kTwo) c0[i] = hn::Add(c0[i], hn::Set(d, bias_per_scale));
        c1[i] = hn::LoadU(d, kC1.data() + i * N);
      }
    }
  };

  HWY_INLINE void Build(const uint8_t* meta, const Basis& basis) {
    const DF d;
    const float s0 = LoadMeta(meta, 0);
    const auto scale = hn::Set(d, s0);
    if constexpr (std::is_same_v<K, Crumbs3> && kPermLow4) high = hn::Mul(scale, hn::Set(d, 4.0f));
    if constexpr (kVectors > 0 && K::kTwo) {
      const auto s1 = hn::Set(d, LoadMeta(meta, 1)), bias = hn::Set(d, LoadMeta(meta, 2));
      for (int i = 0; i < kVectors; ++i) v[i] = hn::MulAdd(scale, basis.c0[i], hn::MulAdd(s1, basis.c1[i], bias));
    } else if constexpr (kVectors > 0) {
      for (int i = 0; i < kVectors; ++i) v[i] = hn::Mul(scale, basis.c0[i]);
    } else {
      const float s1 = K::kTwo ? LoadMeta(meta, 1) : 0.0f;
      const float bias = K::kTwo ? LoadMeta(meta, 2) : basis.bias_per_scale * s0;
      for (int c = 0; c < K::kEntries; ++c) table[c] = s0 * K::C0(c) + (s1 * K::C1(c) + bias);
    }
  }

  // Values of codes whose bits above the low four are to be ignored.
  HWY_INLINE hn::Vec<DF> LookupLow4(hn::Vec<DU> codes) const {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
    return hn::Vec<DF>{_mm512_permutexvar_ps(codes.raw, v[0].raw)};
#else
    return Lookup(hn::And(codes, hn::Set(DU(), 15u)));
#endif
  }

  // Values of codes (u32 lanes below kEntries).
  HWY_INLINE hn::Vec<DF> Lookup(hn::Vec<DU> codes) const {
    const DF d;
    const DU du;
    if constexpr (kVectors == 1) {
      return hn::TableLookupLanes(v[0], hn::IndicesFromVec(d, codes));
    } else if constexpr (kVectors == 2) {
      const auto low3 = hn::IndicesFromVec(d, hn::And(codes, hn::Set(du, 7u)));
      const auto high = hn::RebindMask(d, hn::TestBit(codes, hn::Set(du, 8u)));
      return hn::IfThenElse(high, hn::TableLookupLanes(v[1], low3), hn::TableLookupLanes(v[0], low3));
    } else {
      alignas(64) uint32_t c[N];
      alignas(64) float w[N];
      hn::Store(codes, du, c);
      for (int i = 0; i < N; ++i) w[i] = table[c[i]];
      return hn::Load(d, w);
    }
  }

 private:
  static constexpr std::array<float, 32> Coefficients(int which) {
    std::array<float, 32> c{};
    for (int i = 0; i < K::kEntries; ++i) c[i] = which == 0 ? K::C0(i) : K::C1(i);
    return c;
  }
  static constexpr std::array<float, 32> kC0 = Coefficients(0), kC1 = Coefficients(1);
};

// y[r] for R consecutive rows: per group the rows' tables, then per block each row's codes looked up and
// multiplied with the activations loaded once for all R rows.
template <class K, int R>
HWY_INLINE void RowsDot(const uint8_t* rows_base, int64_t row_stride, int64_t groups, const float* x,
                        float bias_per_scale, float* y) {
  const DF d;
  hn::Vec<DF> acc[R];
  for (int r = 0; r < R; ++r) acc[r] = hn::Zero(d);
  const typename Lut<K>::Basis basis(bias_per_scale);
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* rec[R];
    Lut<K> lut[R];
    for (int r = 0; r < R; ++r) {
      rec[r] = rows_base + r * row_stride + g * K::kRecordBytes;
      lut[r].Build(rec[r] + K::kCodeBytes, basis);
    }
    const float* xg = x + g * K::kGroup;
    for (int b = 0; b < K::kGroup / (K::kSubs * N); ++b) {
      hn::Vec<DU> bytes[R];
      for (int r = 0; r < R; ++r) bytes[r] = K::Bytes(rec[r], b);
      for (int s = 0; s < K::kSubs; ++s) {
        const auto xv = hn::LoadU(d, xg + (b * K::kSubs + s) * N);
        for (int r = 0; r < R; ++r) acc[r] = hn::MulAdd(K::Weights(lut[r], bytes[r], rec[r], b, s), xv, acc[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) y[r] = hn::GetLane(hn::SumOfLanes(d, acc[r]));
}

template <class Fn>
void WithKind(LutKind kind, Fn&& fn) {
  switch (kind) {
    case LutKind::offset_scale3: fn(OffsetScale3()); break;
    case LutKind::offset_scale4: fn(OffsetScale4()); break;
    case LutKind::two_plane: fn(TwoPlane()); break;
  }
}

// y[r - r0] for rows [r0, r1), four rows at a time.
void Matvec(const LutMatrix& m, const float* x, size_t r0, size_t r1, float* y) {
  WithKind(m.kind, [&](auto kind) {
    using K = decltype(kind);
    const int64_t stride = m.groups() * K::kRecordBytes;
    const uint8_t* base = m.records.data();
    size_t r = r0;
    for (; r + 4 <= r1; r += 4) RowsDot<K, 4>(base + r * stride, stride, m.groups(), x, m.bias_per_scale, y + (r - r0));
    for (; r < r1; ++r) RowsDot<K, 1>(base + r * stride, stride, m.groups(), x, m.bias_per_scale, y + (r - r0));
  });
}

// Rows [r0, r1) x columns [k0, k1) (both multiples of the group size) decoded to f32.
void DecodeTile(const LutMatrix& m, size_t r0, size_t r1, size_t k0, size_t k1, float* out, size_t stride) {
  const DF d;
  WithKind(m.kind, [&](auto kind) {
    using K = decltype(kind);
    const typename Lut<K>::Basis basis(m.bias_per_scale);
    for (size_t r = r0; r < r1; ++r) {
      float* o = out + (r - r0) * stride;
      for (size_t g = k0 / K::kGroup; g < k1 / K::kGroup; ++g, o += K::kGroup) {
        const uint8_t* rec = m.records.data() + (r * m.groups() + g) * K::kRecordBytes;
        Lut<K> lut;
        lut.Build(rec + K::kCodeBytes, basis);
        for (int b = 0; b < K::kGroup / (K::kSubs * N); ++b) {
          const auto bytes = K::Bytes(rec, b);
          for (int s = 0; s < K::kSubs; ++s)
            hn::StoreU(K::Weights(lut, bytes, rec, b, s), d, o + (b * K::kSubs + s) * N);
        }
      }
    }
  });
}

size_t Lanes() { return hn::Lanes(DF()); }

}  // namespace HWY_NAMESPACE
}  // namespace lowbit::kernels::lut_simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <vector>

#include "kernels/cpu/simd.h"
#include "lowbit/core/checked.h"
#include "lowbit/core/error.h"
#include "lowbit/core/thread_pool.h"

namespace lowbit::kernels {

namespace lut_simd {
HWY_EXPORT(Matvec);
HWY_EXPORT(DecodeTile);
HWY_EXPORT(Lanes);
}  // namespace lut_simd

LutMatrix::LutMatrix(LutKind k, int64_t rows_, int64_t cols_, int64_t padded_cols_, float bias)
    : kind(k), bias_per_scale(bias), rows(rows_), cols(cols_), padded_cols(padded_cols_) {
  lanes = static_cast<int64_t>(HWY_DYNAMIC_DISPATCH(lut_simd::Lanes)());
  group_size = k == LutKind::two_plane ? 128 : 64;
  code_bytes = static_cast<int>(nibbles() ? group_size / 2 : 3 * group_size / 8);
  const int64_t block = (nibbles() ? 2 : 4) * lanes;
  meta_floats = k == LutKind::two_plane ? 3 : 1;
  if (padded_cols % group_size != 0 || padded_cols < cols || group_size % block != 0)
    fail(Errc::internal, "[lut_kernels] padded width {} for {} columns, groups of {}, {} lanes", padded_cols, cols,
         group_size, lanes);
  records.assign(checked_mul(checked_mul(static_cast<uint64_t>(rows), static_cast<uint64_t>(groups()), "[lut_kernels]"),
                             static_cast<uint64_t>(record_bytes()), "[lut_kernels]"),
                 0);
}

void LutMatrix::set_codes(int64_t r, const uint8_t* codes) {
  for (int64_t g = 0; g < groups(); ++g) {
    uint8_t* rec = record(r, g);
    const uint8_t* q = codes + g * group_size;
    if (nibbles()) {
      for (int64_t b = 0; b < group_size / (2 * lanes); ++b, q += 2 * lanes)
        for (int64_t j = 0; j < lanes; ++j) *rec++ = static_cast<uint8_t>((q[j] & 15u) | (q[lanes + j] & 15u) << 4);
      continue;
    }
    for (int64_t b = 0; b < group_size / (4 * lanes); ++b)
      for (int64_t j = 0; j < lanes; ++j) {
        const uint8_t* w = q + b * 4 * lanes + j;
        *rec++ = static_cast<uint8_t>((w[0] & 3u) | (w[lanes] & 3u) << 2 | (w[2 * lanes] & 3u) << 4 |
                                      (w[3 * lanes] & 3u) << 6);
      }
    for (int64_t i = 0; i < group_size / 8; ++i) {
      uint8_t high = 0;
      for (int t = 0; t < 8; ++t) high |= static_cast<uint8_t>(((q[8 * i + t] >> 2) & 1u) << t);
      *rec++ = high;
    }
  }
}

namespace {

constexpr size_t kChunkCols = 1024;  // batched path: columns decoded per tile (a multiple of 64 and 128)

class LutLinear final : public CpuLinear {
 public:
  explicit LutLinear(LutMatrix m) : m_(std::move(m)) {}
  int64_t rows() const override { return m_.rows; }
  int64_t cols() const override { return m_.cols; }
  uint64_t weight_bytes() const override { return m_.records.size(); }

  // y [m, rows] = x [m, cols] @ W^T
  void matmul(const float* x, int64_t m, float* y, ThreadPool& pool) const override {
    check_target();
    if (m == 1) return matvec(x, y, pool);
    const auto padded = static_cast<size_t>(m_.padded_cols);
    std::vector<float> xp(static_cast<size_t>(m) * padded, 0.0f);
    for (int64_t i = 0; i < m; ++i) std::copy_n(x + i * m_.cols, m_.cols, xp.data() + i * padded);
    simd::tiled_matmul(
        static_cast<size_t>(m_.rows), padded, kChunkCols,
        [&](size_t r0, size_t r1, size_t k0, size_t k1, float* out, size_t stride) {
          HWY_DYNAMIC_DISPATCH(lut_simd::DecodeTile)(m_, r0, r1, k0, k1, out, stride);
        },
        xp.data(), padded, static_cast<size_t>(m), y, static_cast<size_t>(m_.rows), pool);
  }

  void gather_rows(std::span<const int32_t> ids, float* out) const override {
    check_gather_ids(ids, m_.rows);
    check_target();
    std::vector<float> row(static_cast<size_t>(m_.padded_cols));
    for (const int32_t id : ids) {
      const auto r = static_cast<size_t>(id);
      HWY_DYNAMIC_DISPATCH(lut_simd::DecodeTile)(m_, r, r + 1, 0, row.size(), row.data(), row.size());
      out = std::copy_n(row.data(), m_.cols, out);
    }
  }

 private:
  // The activations zero-padded to the padded width: padding codes meet zeros, never data.
  void matvec(const float* x, float* y, ThreadPool& pool) const {
    std::vector<float> xp(static_cast<size_t>(m_.padded_cols), 0.0f);
    std::copy_n(x, m_.cols, xp.data());
    pool.parallel_for(static_cast<size_t>(m_.rows), 16, [&](size_t r0, size_t r1) {
      HWY_DYNAMIC_DISPATCH(lut_simd::Matvec)(m_, xp.data(), r0, r1, y + r0);
    });
  }

  // The nibble layout depends on the lanes of the target it was built for.
  void check_target() const {
    const auto lanes = static_cast<int64_t>(HWY_DYNAMIC_DISPATCH(lut_simd::Lanes)());
    if (lanes != m_.lanes)
      fail(Errc::internal, "[lut_kernels] weight prepared for {} SIMD lanes, running with {}", m_.lanes, lanes);
  }

  LutMatrix m_;
};

}  // namespace

std::unique_ptr<CpuLinear> make_lut_linear(LutMatrix matrix) {
  return std::make_unique<LutLinear>(std::move(matrix));
}

}  // namespace lowbit::kernels
#endif  // HWY_ONCE
