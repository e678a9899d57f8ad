// SIMD code for the bit-plane layout (see bitplane_kernels.h), compiled per Highway target and dispatched at run
// time (the pattern of simd.cpp).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/bitplane_kernels.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/bitplane_kernels.h"

HWY_BEFORE_NAMESPACE();
namespace lowbit::kernels::bitplane_simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using DU = hn::RebindToUnsigned<DF>;

constexpr int kPlaneGroup = 64;  // offset_scale q3 / q3_full8: 3 planes of 64 bits, then {scale}
constexpr int kPlanes = 3;
constexpr int kPlaneBytes = kPlaneGroup / 8;
constexpr int kPlaneRecord = kPlanes * kPlaneBytes + 4;

// The nibble kinds: group size, metadata floats and the table coefficients of a code.
template <int G, bool kTwoPlanes>
struct Nibbles {
  static constexpr int kGroup = G;
  static constexpr bool kTwo = kTwoPlanes;
  static constexpr int kCodeBytes = G / 2;
  static constexpr int kRecordBytes = kCodeBytes + 4 * (kTwoPlanes ? 3 : 1);
  static constexpr float C0(int code) { return static_cast<float>(kTwoPlanes ? code & 3 : code); }
  static constexpr float C1(int code) { return static_cast<float>(kTwoPlanes ? code >> 2 : 0); }
};
using OffsetScale4 = Nibbles<64, false>;
using TwoPlane = Nibbles<128, true>;

HWY_INLINE float LoadMeta(const uint8_t* p, int i) {
  float v;
  std::memcpy(&v, p + 4 * i, 4);
  return v;
}

// Lane mask of vector v of a plane (bit j of the plane is lane j of the group).
HWY_INLINE hn::Mask<DF> PlaneMask(DF d, const uint8_t* plane, int v) {
  constexpr size_t N = hn::MaxLanes(DF());
  if constexpr (N >= 8) {
    return hn::LoadMaskBits(d, plane + v * N / 8);
  } else {
    const uint8_t bits = static_cast<uint8_t>(plane[v * N / 8] >> ((v * N) % 8));
    return hn::LoadMaskBits(d, &bits);
  }
}

// y[r] for R consecutive rows of 3-bit planes.
template <int R>
HWY_INLINE void PlaneRowsDot(const uint8_t* rows_base, int64_t row_stride, int64_t groups,
                             const BitplaneActivations& x, float bias_per_scale, float* y) {
  const DF d;
  constexpr int N = static_cast<int>(hn::MaxLanes(DF()));
  hn::Vec<DF> acc[R];
  float bias_acc[R];
  for (int r = 0; r < R; ++r) acc[r] = hn::Zero(d), bias_acc[r] = 0.0f;
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* rec[R];
    hn::Vec<DF> t[R];
    for (int r = 0; r < R; ++r) rec[r] = rows_base + r * row_stride + g * kPlaneRecord, t[r] = hn::Zero(d);
    const float* xg = x.multiples + g * kPlaneGroup;
    for (int v = 0; v < kPlaneGroup / N; ++v) {
      hn::Vec<DF> xv[kPlanes];
      for (int p = 0; p < kPlanes; ++p) xv[p] = hn::LoadU(d, xg + p * x.padded_cols + v * N);
      for (int r = 0; r < R; ++r)
        for (int p = 0; p < kPlanes; ++p)
          t[r] = hn::IfThenElse(PlaneMask(d, rec[r] + p * kPlaneBytes, v), hn::Add(t[r], xv[p]), t[r]);
    }
    for (int r = 0; r < R; ++r) {
      const float scale = LoadMeta(rec[r] + kPlanes * kPlaneBytes, 0);
      acc[r] = hn::MulAdd(hn::Set(d, scale), t[r], acc[r]);
      bias_acc[r] += bias_per_scale * scale * x.group_sums[g];
    }
  }
  for (int r = 0; r < R; ++r) y[r] = hn::GetLane(hn::SumOfLanes(d, acc[r])) + bias_acc[r];
}

// A group's 16-entry table of values: one vector for 16 lanes, two for 8, a scalar array below.
template <class K>
struct Lut {
  static constexpr size_t N = hn::MaxLanes(DF());
  static constexpr int kVectors = N >= 16 ? 1 : N == 8 ? 2 : 0;
  hn::Vec<DF> v[kVectors > 0 ? kVectors : 1];
  float table[16];

  HWY_INLINE void Build(const uint8_t* meta, float bias_per_scale) {
    const DF d;
    const float s0 = LoadMeta(meta, 0);
    const float s1 = K::kTwo ? LoadMeta(meta, 1) : 0.0f;
    const float bias = K::kTwo ? LoadMeta(meta, 2) : bias_per_scale * s0;
    if constexpr (kVectors > 0) {
      alignas(64) static constexpr auto kC0 = Coefficients(0), kC1 = Coefficients(1);
      for (int i = 0; i < kVectors; ++i)
        v[i] = hn::MulAdd(hn::Set(d, s0), hn::Load(d, kC0.data() + i * N),
                          hn::MulAdd(hn::Set(d, s1), hn::Load(d, kC1.data() + i * N), hn::Set(d, bias)));
    } else {
      for (int c = 0; c < 16; ++c) table[c] = s0 * K::C0(c) + (s1 * K::C1(c) + bias);
    }
  }

  // Values of codes (u32 lanes in 0..15).
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
      for (size_t i = 0; i < N; ++i) w[i] = table[c[i]];
      return hn::Load(d, w);
    }
  }

 private:
  static constexpr std::array<float, 16> Coefficients(int which) {
    std::array<float, 16> c{};
    for (int i = 0; i < 16; ++i) c[i] = which == 0 ? K::C0(i) : K::C1(i);
    return c;
  }
};

// The codes of block b of a record: lanes of the low and the high nibbles.
HWY_INLINE void BlockCodes(const uint8_t* codes, int b, hn::Vec<DU>& low, hn::Vec<DU>& high) {
  const DU du;
  const hn::Rebind<uint8_t, DU> d8;
  constexpr int N = static_cast<int>(hn::MaxLanes(DF()));
  const auto bytes = hn::PromoteTo(du, hn::LoadU(d8, codes + b * N));
  low = hn::And(bytes, hn::Set(du, 15u));
  high = hn::ShiftRight<4>(bytes);
}

// y[r] for R consecutive rows of nibbles.
template <class K, int R>
HWY_INLINE void NibbleRowsDot(const uint8_t* rows_base, int64_t row_stride, int64_t groups, const float* x,
                              float bias_per_scale, float* y) {
  const DF d;
  constexpr int N = static_cast<int>(hn::MaxLanes(DF()));
  hn::Vec<DF> acc[R];
  for (int r = 0; r < R; ++r) acc[r] = hn::Zero(d);
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* rec[R];
    Lut<K> lut[R];
    for (int r = 0; r < R; ++r) {
      rec[r] = rows_base + r * row_stride + g * K::kRecordBytes;
      lut[r].Build(rec[r] + K::kCodeBytes, bias_per_scale);
    }
    const float* xg = x + g * K::kGroup;
    for (int b = 0; b < K::kGroup / (2 * N); ++b) {
      const auto x_low = hn::LoadU(d, xg + 2 * b * N), x_high = hn::LoadU(d, xg + 2 * b * N + N);
      for (int r = 0; r < R; ++r) {
        hn::Vec<DU> low, high;
        BlockCodes(rec[r], b, low, high);
        acc[r] = hn::MulAdd(lut[r].Lookup(low), x_low, acc[r]);
        acc[r] = hn::MulAdd(lut[r].Lookup(high), x_high, acc[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) y[r] = hn::GetLane(hn::SumOfLanes(d, acc[r]));
}

template <class Rows>
HWY_INLINE void ForRowBlocks(size_t r0, size_t r1, Rows&& rows) {
  size_t r = r0;
  for (; r + 4 <= r1; r += 4) rows(r, std::integral_constant<int, 4>());
  for (; r < r1; ++r) rows(r, std::integral_constant<int, 1>());
}

void Matvec(const BitplaneMatrix& m, const BitplaneActivations& x, size_t r0, size_t r1, float* y) {
  const int64_t stride = m.groups() * m.record_bytes();
  const auto run = [&](auto kind) {
    using K = decltype(kind);
    ForRowBlocks(r0, r1, [&](size_t r, auto rows) {
      NibbleRowsDot<K, decltype(rows)::value>(m.records.data() + r * stride, stride, m.groups(), x.multiples,
                                               m.bias_per_scale, y + (r - r0));
    });
  };
  switch (m.kind) {
    case BitplaneKind::offset_scale3:
      ForRowBlocks(r0, r1, [&](size_t r, auto rows) {
        PlaneRowsDot<decltype(rows)::value>(m.records.data() + r * stride, stride, m.groups(), x, m.bias_per_scale,
                                            y + (r - r0));
      });
      break;
    case BitplaneKind::offset_scale4: run(OffsetScale4()); break;
    case BitplaneKind::two_plane: run(TwoPlane()); break;
  }
}

// Rows [r0, r1) x columns [k0, k1) (both multiples of the group size) decoded to f32.
void DecodeTile(const BitplaneMatrix& m, size_t r0, size_t r1, size_t k0, size_t k1, float* out, size_t stride) {
  const DF d;
  constexpr int N = static_cast<int>(hn::MaxLanes(DF()));
  const auto G = static_cast<size_t>(m.group_size);
  const auto decode_nibbles = [&](auto kind, const uint8_t* rec, float* o) {
    using K = decltype(kind);
    Lut<K> lut;
    lut.Build(rec + K::kCodeBytes, m.bias_per_scale);
    for (int b = 0; b < K::kGroup / (2 * N); ++b) {
      hn::Vec<DU> low, high;
      BlockCodes(rec, b, low, high);
      hn::StoreU(lut.Lookup(low), d, o + 2 * b * N);
      hn::StoreU(lut.Lookup(high), d, o + 2 * b * N + N);
    }
  };
  const auto decode_planes = [&](const uint8_t* rec, float* o) {
    const float scale = LoadMeta(rec + kPlanes * kPlaneBytes, 0);
    for (int v = 0; v < kPlaneGroup / N; ++v) {
      auto w = hn::Set(d, m.bias_per_scale * scale);
      for (int p = 0; p < kPlanes; ++p)
        w = hn::IfThenElse(PlaneMask(d, rec + p * kPlaneBytes, v), hn::Add(w, hn::Set(d, scale * (1 << p))), w);
      hn::StoreU(w, d, o + v * N);
    }
  };
  for (size_t r = r0; r < r1; ++r) {
    float* o = out + (r - r0) * stride;
    for (size_t g = k0 / G; g < k1 / G; ++g, o += G) {
      const uint8_t* rec = m.records.data() + (r * m.groups() + g) * m.record_bytes();
      switch (m.kind) {
        case BitplaneKind::offset_scale3: decode_planes(rec, o); break;
        case BitplaneKind::offset_scale4: decode_nibbles(OffsetScale4(), rec, o); break;
        case BitplaneKind::two_plane: decode_nibbles(TwoPlane(), rec, o); break;
      }
    }
  }
}

size_t Lanes() { return hn::Lanes(DF()); }

}  // namespace HWY_NAMESPACE
}  // namespace lowbit::kernels::bitplane_simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <vector>

#include "kernels/cpu/simd.h"
#include "lowbit/core/checked.h"
#include "lowbit/core/error.h"
#include "lowbit/core/thread_pool.h"

namespace lowbit::kernels {

namespace bitplane_simd {
HWY_EXPORT(Matvec);
HWY_EXPORT(DecodeTile);
HWY_EXPORT(Lanes);
}  // namespace bitplane_simd

BitplaneMatrix::BitplaneMatrix(BitplaneKind k, int64_t rows_, int64_t cols_, int64_t padded_cols_, float bias)
    : kind(k), bias_per_scale(bias), rows(rows_), cols(cols_), padded_cols(padded_cols_) {
  lanes = static_cast<int64_t>(HWY_DYNAMIC_DISPATCH(bitplane_simd::Lanes)());
  group_size = k == BitplaneKind::two_plane ? 128 : 64;
  code_bytes = static_cast<int>(nibbles() ? group_size / 2 : 3 * group_size / 8);
  meta_floats = k == BitplaneKind::two_plane ? 3 : 1;
  if (padded_cols % group_size != 0 || padded_cols < cols || group_size % (2 * lanes) != 0)
    fail(Errc::internal, "[bitplane] padded width {} for {} columns, groups of {}, {} lanes", padded_cols, cols,
         group_size, lanes);
  records.assign(checked_mul(checked_mul(static_cast<uint64_t>(rows), static_cast<uint64_t>(groups()), "[bitplane]"),
                             static_cast<uint64_t>(record_bytes()), "[bitplane]"),
                 0);
}

void BitplaneMatrix::set_codes(int64_t r, const uint8_t* codes) {
  for (int64_t g = 0; g < groups(); ++g) {
    uint8_t* rec = record(r, g);
    const uint8_t* q = codes + g * group_size;
    std::memset(rec, 0, static_cast<size_t>(code_bytes));
    if (nibbles()) {
      for (int64_t j = 0; j < group_size; ++j) {
        const int64_t block = j / (2 * lanes), lane = j % lanes, high = (j / lanes) % 2;
        rec[block * lanes + lane] |= static_cast<uint8_t>((q[j] & 15u) << (4 * high));
      }
    } else {
      const int64_t plane_bytes = group_size / 8;
      for (int64_t j = 0; j < group_size; ++j)
        for (int p = 0; p < 3; ++p)
          rec[p * plane_bytes + j / 8] |= static_cast<uint8_t>(((q[j] >> p) & 1u) << (j % 8));
    }
  }
}

namespace {

constexpr size_t kChunkCols = 1024;  // batched path: columns decoded per tile (a multiple of 64 and 128)

class BitplaneLinear final : public CpuLinear {
 public:
  explicit BitplaneLinear(BitplaneMatrix m) : m_(std::move(m)) {}
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
          HWY_DYNAMIC_DISPATCH(bitplane_simd::DecodeTile)(m_, r0, r1, k0, k1, out, stride);
        },
        xp.data(), padded, static_cast<size_t>(m), y, static_cast<size_t>(m_.rows), pool);
  }

  void gather_rows(std::span<const int32_t> ids, float* out) const override {
    check_gather_ids(ids, m_.rows);
    check_target();
    std::vector<float> row(static_cast<size_t>(m_.padded_cols));
    for (const int32_t id : ids) {
      const auto r = static_cast<size_t>(id);
      HWY_DYNAMIC_DISPATCH(bitplane_simd::DecodeTile)(m_, r, r + 1, 0, row.size(), row.data(), row.size());
      out = std::copy_n(row.data(), m_.cols, out);
    }
  }

 private:
  void matvec(const float* x, float* y, ThreadPool& pool) const {
    const int multiples = m_.nibbles() ? 1 : 3;
    const auto padded = static_cast<size_t>(m_.padded_cols);
    std::vector<float> xm(multiples * padded, 0.0f), sums(static_cast<size_t>(m_.groups()), 0.0f);
    for (int64_t c = 0; c < m_.cols; ++c) {
      for (int k = 0; k < multiples; ++k) xm[k * padded + c] = x[c] * static_cast<float>(1 << k);
      sums[c / m_.group_size] += x[c];
    }
    const BitplaneActivations xd{xm.data(), m_.padded_cols, sums.data()};
    pool.parallel_for(static_cast<size_t>(m_.rows), 16, [&](size_t r0, size_t r1) {
      HWY_DYNAMIC_DISPATCH(bitplane_simd::Matvec)(m_, xd, r0, r1, y + r0);
    });
  }

  // The nibble layout depends on the lanes of the target it was built for.
  void check_target() const {
    const auto lanes = static_cast<int64_t>(HWY_DYNAMIC_DISPATCH(bitplane_simd::Lanes)());
    if (lanes != m_.lanes)
      fail(Errc::internal, "[bitplane] weight prepared for {} SIMD lanes, running with {}", m_.lanes, lanes);
  }

  BitplaneMatrix m_;
};

}  // namespace

std::unique_ptr<CpuLinear> make_bitplane_linear(BitplaneMatrix matrix) {
  return std::make_unique<BitplaneLinear>(std::move(matrix));
}

}  // namespace lowbit::kernels
#endif  // HWY_ONCE
