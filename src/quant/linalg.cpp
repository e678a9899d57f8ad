#include "quant/linalg.h"

#include <algorithm>
#include <cmath>

#include "lowbit/codec/codec.h"
#include "lowbit/core/thread_pool.h"
#include "lowbit/kernels/cpu.h"

namespace lowbit::quant {

namespace {

// sum_k a[k] * b[k] in fp64 with four independent partial sums, so the loop vectorizes without reassociation
// flags.
double dot(const double* a, const double* b, int64_t n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t k = 0;
  for (; k + 4 <= n; k += 4) {
    s0 += a[k] * b[k];
    s1 += a[k + 1] * b[k + 1];
    s2 += a[k + 2] * b[k + 2];
    s3 += a[k + 3] * b[k + 3];
  }
  for (; k < n; ++k) s0 += a[k] * b[k];
  return (s0 + s1) + (s2 + s3);
}

}  // namespace

void matmul_nt(const float* x, int64_t m, int64_t k, const float* w, int64_t n, float* y) {
  // w as a dense f32 weight [n, k]: the kernel reads it in place (no copy).
  const auto bytes = std::as_bytes(std::span(w, static_cast<size_t>(n * k)));
  const codec::TensorRef ref{&codec::codec_or_throw("dense", "[quant] matmul"), codec::Params{{"dtype", "f32"}},
                             Shape{n, k}, codec::ArrayViews{{{"data", TensorView{DType::F32, Shape{n, k}, bytes}}}}};
  kernels::prepare_cpu(ref)->matmul(x, m, y, default_pool());
}

std::vector<float> transpose(const float* m, int64_t rows, int64_t cols, int64_t stride) {
  std::vector<float> t(static_cast<size_t>(rows * cols));
  constexpr int64_t kTile = 32;  // square tiles keep both sides in cache
  for (int64_t r0 = 0; r0 < rows; r0 += kTile)
    for (int64_t c0 = 0; c0 < cols; c0 += kTile)
      for (int64_t r = r0; r < std::min(rows, r0 + kTile); ++r)
        for (int64_t c = c0; c < std::min(cols, c0 + kTile); ++c) t[c * rows + r] = m[r * stride + c];
  return t;
}

bool cholesky_lower(std::vector<double>& a, int64_t n) {
  // Left-looking, column by column: column j's entries below the diagonal are independent dot products of
  // finished rows, computed in parallel.
  for (int64_t j = 0; j < n; ++j) {
    double* aj = a.data() + j * n;
    const double d = aj[j] - dot(aj, aj, j);
    if (!(d > 0)) return false;
    const double ljj = std::sqrt(d);
    aj[j] = ljj;
    default_pool().parallel_for(static_cast<size_t>(n - j - 1), 32, [&](size_t i0, size_t i1) {
      for (size_t t = i0; t < i1; ++t) {
        double* ai = a.data() + (j + 1 + static_cast<int64_t>(t)) * n;
        ai[j] = (ai[j] - dot(ai, aj, j)) / ljj;
      }
    });
  }
  for (int64_t i = 0; i < n; ++i) std::fill(a.begin() + i * n + i + 1, a.begin() + (i + 1) * n, 0.0);
  return true;
}

void invert_lower(std::vector<double>& l, int64_t n) {
  // Row i of X = L^-1 is (e_i - sum_{k<i} L[i,k] X[k,:]) / L[i,i]; each thread owns a slice of columns, where
  // that is a sequence of contiguous axpys (X[k, c] is zero for c > k).
  std::vector<double> x(static_cast<size_t>(n * n), 0.0);
  default_pool().parallel_for(static_cast<size_t>(n), 16, [&](size_t c0s, size_t c1s) {
    const auto c0 = static_cast<int64_t>(c0s), c1 = static_cast<int64_t>(c1s);
    for (int64_t i = c0; i < n; ++i) {
      double* xi = x.data() + i * n;
      const double* li = l.data() + i * n;
      if (i < c1) xi[i] = 1.0;
      for (int64_t k = c0; k < i; ++k) {
        const double f = li[k];
        if (f == 0) continue;
        const double* xk = x.data() + k * n;
        const int64_t end = std::min(c1, k + 1);
        for (int64_t c = c0; c < end; ++c) xi[c] -= f * xk[c];
      }
      const double inv = 1.0 / li[i];
      for (int64_t c = c0; c < std::min(c1, i + 1); ++c) xi[c] *= inv;
    }
  });
  l = std::move(x);
}

}  // namespace lowbit::quant
