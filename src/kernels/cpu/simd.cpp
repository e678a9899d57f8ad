// Highway re-includes this file once per target (foreach_target.h); the code between HWY_BEFORE_NAMESPACE and
// HWY_AFTER_NAMESPACE is compiled for each, the HWY_ONCE part once.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "simd.h"

HWY_BEFORE_NAMESPACE();
namespace lowbit::kernels::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;

size_t FloatLanes() { return hn::Lanes(DF()); }

const char* TargetName() { return hwy::TargetName(HWY_TARGET); }

// Lanes(d) elements of p as f32.
template <class D>
HWY_INLINE hn::Vec<D> LoadF32(D d, const float* p) {
  return hn::LoadU(d, p);
}
template <class D>
HWY_INLINE hn::Vec<D> LoadF32(D d, const hwy::bfloat16_t* p) {
  return hn::PromoteTo(d, hn::LoadU(hn::Rebind<hwy::bfloat16_t, D>(), p));
}
template <class D>
HWY_INLINE hn::Vec<D> LoadF32(D d, const hwy::float16_t* p) {
  return hn::PromoteTo(d, hn::LoadU(hn::Rebind<hwy::float16_t, D>(), p));
}

HWY_INLINE float ScalarF32(float v) { return v; }
HWY_INLINE float ScalarF32(hwy::bfloat16_t v) { return bf16_to_f32(v.bits); }
HWY_INLINE float ScalarF32(hwy::float16_t v) { return f16_to_f32(v.bits); }

template <typename T>
void ToF32T(const T* src, size_t n, float* out) {
  const DF d;
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(LoadF32(d, src + i), d, out + i);
  for (; i < n; ++i) out[i] = ScalarF32(src[i]);
}

// Dispatches on the storage dtype once per call, never per element.
template <class Fn>
void WithSourceType(DType t, const void* p, Fn&& fn) {
  switch (t) {
    case DType::BF16: fn(static_cast<const hwy::bfloat16_t*>(p)); break;
    case DType::F16: fn(static_cast<const hwy::float16_t*>(p)); break;
    default: fn(static_cast<const float*>(p)); break;
  }
}

void ToF32(DType t, const void* src, size_t n, float* out) {
  WithSourceType(t, src, [&](const auto* s) { ToF32T(s, n, out); });
}

// Four independent accumulators hide the FMA latency.
template <typename T>
float DotT(const T* a, const float* b, size_t n) {
  const DF d;
  const size_t N = hn::Lanes(d);
  auto s0 = hn::Zero(d), s1 = hn::Zero(d), s2 = hn::Zero(d), s3 = hn::Zero(d);
  size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    s0 = hn::MulAdd(LoadF32(d, a + i), hn::LoadU(d, b + i), s0);
    s1 = hn::MulAdd(LoadF32(d, a + i + N), hn::LoadU(d, b + i + N), s1);
    s2 = hn::MulAdd(LoadF32(d, a + i + 2 * N), hn::LoadU(d, b + i + 2 * N), s2);
    s3 = hn::MulAdd(LoadF32(d, a + i + 3 * N), hn::LoadU(d, b + i + 3 * N), s3);
  }
  for (; i + N <= n; i += N) s0 = hn::MulAdd(LoadF32(d, a + i), hn::LoadU(d, b + i), s0);
  float sum = hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(s0, s1), hn::Add(s2, s3))));
  for (; i < n; ++i) sum += ScalarF32(a[i]) * b[i];
  return sum;
}

float Dot(const float* a, const float* b, size_t n) { return DotT(a, b, n); }

void DenseMatvec(DType t, const void* w, size_t cols, const float* x, size_t r0, size_t r1, float* y) {
  WithSourceType(t, w, [&](const auto* rows) {
    for (size_t r = r0; r < r1; ++r) y[r - r0] = DotT(rows + r * cols, x, cols);
  });
}

// RR weight rows x MM activation rows of accumulators: each loaded vector feeds several FMAs.
template <int RR, int MM>
HWY_INLINE void TileBlock(const float* w, size_t w_stride, const float* x, size_t x_stride, size_t k_len,
                          float* acc, size_t acc_stride) {
  const DF d;
  const size_t N = hn::Lanes(d);
  hn::Vec<DF> s[RR][MM];
  for (int r = 0; r < RR; ++r)
    for (int i = 0; i < MM; ++i) s[r][i] = hn::Zero(d);
  size_t k = 0;
  for (; k + N <= k_len; k += N) {
    hn::Vec<DF> xv[MM];
    for (int i = 0; i < MM; ++i) xv[i] = hn::LoadU(d, x + i * x_stride + k);
    for (int r = 0; r < RR; ++r) {
      const auto wv = hn::LoadU(d, w + r * w_stride + k);
      for (int i = 0; i < MM; ++i) s[r][i] = hn::MulAdd(wv, xv[i], s[r][i]);
    }
  }
  for (int r = 0; r < RR; ++r)
    for (int i = 0; i < MM; ++i) {
      float sum = hn::GetLane(hn::SumOfLanes(d, s[r][i]));
      for (size_t kk = k; kk < k_len; ++kk) sum += w[r * w_stride + kk] * x[i * x_stride + kk];
      acc[i * acc_stride + r] += sum;
    }
}

template <int RR>
HWY_INLINE void TileRows(const float* w, size_t w_stride, const float* x, size_t x_stride, size_t m,
                         size_t k_len, float* acc, size_t acc_stride) {
  size_t i = 0;
  for (; i + 2 <= m; i += 2)
    TileBlock<RR, 2>(w, w_stride, x + i * x_stride, x_stride, k_len, acc + i * acc_stride, acc_stride);
  if (i < m) TileBlock<RR, 1>(w, w_stride, x + i * x_stride, x_stride, k_len, acc + i * acc_stride, acc_stride);
}

void TileDot(const float* w, size_t w_stride, size_t rows, const float* x, size_t x_stride, size_t m,
             size_t k_len, float* acc, size_t acc_stride) {
  size_t r = 0;
  for (; r + 4 <= rows; r += 4)
    TileRows<4>(w + r * w_stride, w_stride, x, x_stride, m, k_len, acc + r, acc_stride);
  for (; r < rows; ++r) TileRows<1>(w + r * w_stride, w_stride, x, x_stride, m, k_len, acc + r, acc_stride);
}

}  // namespace HWY_NAMESPACE
}  // namespace lowbit::kernels::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <algorithm>
#include <vector>

#include "lowbit/core/thread_pool.h"

namespace lowbit::kernels::simd {

HWY_EXPORT(FloatLanes);
HWY_EXPORT(TargetName);
HWY_EXPORT(ToF32);
HWY_EXPORT(Dot);
HWY_EXPORT(DenseMatvec);
HWY_EXPORT(TileDot);

size_t float_lanes() { return HWY_DYNAMIC_DISPATCH(FloatLanes)(); }
const char* target_name() { return HWY_DYNAMIC_DISPATCH(TargetName)(); }
void to_f32(DType t, const void* src, size_t n, float* out) { HWY_DYNAMIC_DISPATCH(ToF32)(t, src, n, out); }
float dot(const float* a, const float* b, size_t n) { return HWY_DYNAMIC_DISPATCH(Dot)(a, b, n); }

void dense_matvec(DType t, const void* w, size_t cols, const float* x, size_t r0, size_t r1, float* y) {
  HWY_DYNAMIC_DISPATCH(DenseMatvec)(t, w, cols, x, r0, r1, y);
}

void tile_dot(const float* w, size_t w_stride, size_t rows, const float* x, size_t x_stride, size_t m,
              size_t k_len, float* acc, size_t acc_stride) {
  HWY_DYNAMIC_DISPATCH(TileDot)(w, w_stride, rows, x, x_stride, m, k_len, acc, acc_stride);
}

namespace {
constexpr size_t kTileRows = 16;
}

void tiled_matmul(size_t rows, size_t k_len, size_t k_chunk, const DecodeTile& decode, const float* x,
                  size_t x_stride, size_t m, float* y, size_t y_stride, ThreadPool& pool) {
  const size_t tiles = (rows + kTileRows - 1) / kTileRows;
  // Scratch no wider than a row: a small model's rows (64 columns) would otherwise zero 16 x 1024 floats per chunk
  // of every matmul, which costs more than its few-row decode steps' arithmetic. k_len is whole rows, so still a
  // multiple of the decode block.
  k_chunk = std::min(k_chunk, k_len);
  pool.parallel_for(tiles, 1, [&](size_t t0, size_t t1) {
    std::vector<float> scratch(kTileRows * k_chunk);
    std::vector<float> acc(m * kTileRows);
    for (size_t t = t0; t < t1; ++t) {
      const size_t r0 = t * kTileRows, r1 = std::min(rows, r0 + kTileRows);
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (size_t k0 = 0; k0 < k_len; k0 += k_chunk) {
        const size_t k1 = std::min(k_len, k0 + k_chunk);
        decode(r0, r1, k0, k1, scratch.data(), k_chunk);
        tile_dot(scratch.data(), k_chunk, r1 - r0, x + k0, x_stride, m, k1 - k0, acc.data(), kTileRows);
      }
      for (size_t i = 0; i < m; ++i)
        std::copy_n(acc.data() + i * kTileRows, r1 - r0, y + i * y_stride + r0);
    }
  });
}

}  // namespace lowbit::kernels::simd
#endif  // HWY_ONCE
