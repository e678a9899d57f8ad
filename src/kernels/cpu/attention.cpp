// Highway re-includes this file once per target (foreach_target.h), as simd.cpp does.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention.cpp"
#include <algorithm>
#include <cmath>

#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <hwy/contrib/math/math-inl.h>

#include "lowbit/kernels/cpu_attention.h"

HWY_BEFORE_NAMESPACE();
namespace lowbit::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;

HWY_INLINE float Dot(const float* a, const float* b, size_t n) {
  const DF d;
  const size_t N = hn::Lanes(d);
  auto s0 = hn::Zero(d), s1 = hn::Zero(d);
  size_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    s0 = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), s0);
    s1 = hn::MulAdd(hn::LoadU(d, a + i + N), hn::LoadU(d, b + i + N), s1);
  }
  for (; i + N <= n; i += N) s0 = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), s0);
  float sum = hn::GetLane(hn::SumOfLanes(d, hn::Add(s0, s1)));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

void AttendHead(const float* q, const float* keys, const float* values, size_t stride, size_t n, size_t hd, float scale,
                float softcap, float* scores, float* out) {
  const DF d;
  const size_t N = hn::Lanes(d);
  float max = -INFINITY;
  for (size_t t = 0; t < n; ++t) {
    float s = scale * Dot(q, keys + t * stride, hd);
    if (softcap > 0.0f) s = softcap * std::tanh(s / softcap);
    scores[t] = s;
    max = std::max(max, s);
  }
  // p_t = exp(s_t - max), n at a time.
  const auto vmax = hn::Set(d, max);
  auto vsum = hn::Zero(d);
  size_t t = 0;
  for (; t + N <= n; t += N) {
    const auto e = hn::Exp(d, hn::Sub(hn::LoadU(d, scores + t), vmax));
    hn::StoreU(e, d, scores + t);
    vsum = hn::Add(vsum, e);
  }
  float sum = hn::GetLane(hn::SumOfLanes(d, vsum));
  for (; t < n; ++t) {
    scores[t] = std::exp(scores[t] - max);
    sum += scores[t];
  }
  const float inv = 1.0f / sum;
  // out = sum_t p_t v_t / sum, hd at a time per position; head dims up to 4 vectors stay in registers.
  size_t c = 0;
  for (; c + 4 * N <= hd; c += 4 * N) {
    auto a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
    for (size_t u = 0; u < n; ++u) {
      const float* v = values + u * stride + c;
      const auto p = hn::Set(d, scores[u]);
      a0 = hn::MulAdd(p, hn::LoadU(d, v), a0);
      a1 = hn::MulAdd(p, hn::LoadU(d, v + N), a1);
      a2 = hn::MulAdd(p, hn::LoadU(d, v + 2 * N), a2);
      a3 = hn::MulAdd(p, hn::LoadU(d, v + 3 * N), a3);
    }
    const auto vinv = hn::Set(d, inv);
    hn::StoreU(hn::Mul(a0, vinv), d, out + c);
    hn::StoreU(hn::Mul(a1, vinv), d, out + c + N);
    hn::StoreU(hn::Mul(a2, vinv), d, out + c + 2 * N);
    hn::StoreU(hn::Mul(a3, vinv), d, out + c + 3 * N);
  }
  for (; c + N <= hd; c += N) {
    auto a = hn::Zero(d);
    for (size_t u = 0; u < n; ++u) a = hn::MulAdd(hn::Set(d, scores[u]), hn::LoadU(d, values + u * stride + c), a);
    hn::StoreU(hn::Mul(a, hn::Set(d, inv)), d, out + c);
  }
  for (; c < hd; ++c) {
    float a = 0.0f;
    for (size_t u = 0; u < n; ++u) a += scores[u] * values[u * stride + c];
    out[c] = a * inv;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace lowbit::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace lowbit::kernels {

HWY_EXPORT(AttendHead);

void attend_head(const float* q, const float* keys, const float* values, size_t stride, size_t n, size_t hd,
                 float scale, float softcap, float* scores, float* out) {
  HWY_DYNAMIC_DISPATCH(AttendHead)(q, keys, values, stride, n, hd, scale, softcap, scores, out);
}

}  // namespace lowbit::kernels
#endif  // HWY_ONCE
