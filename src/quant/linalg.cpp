#include "linalg.h"

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
  // Column c of X = L^-1 solves L x = e_c by forward substitution, x[i] = (e_c[i] - L[i, c:i] . x[c:i]) / L[i, i]
  // for i >= c. Columns are independent: threads take blocks of them, and each row of L, read once per block
  // while it is in L1, serves the block's columns (L itself is larger than the caches; reading it once per column
  // made this memory-bound). Each step is a dot product over contiguous memory.
  constexpr int64_t kBlock = 16;
  std::vector<double> x(static_cast<size_t>(n * n), 0.0);
  const auto blocks = static_cast<size_t>((n + kBlock - 1) / kBlock);
  default_pool().parallel_for(blocks, 1, [&](size_t b0, size_t b1) {
    std::vector<double> cols(static_cast<size_t>(kBlock * n));  // the block's columns, each contiguous
    for (auto b = static_cast<int64_t>(b0); b < static_cast<int64_t>(b1); ++b) {
      const int64_t c0 = b * kBlock, c1 = std::min(n, c0 + kBlock);
      for (int64_t i = c0; i < n; ++i) {
        const double* li = l.data() + i * n;
        for (int64_t c = c0; c < std::min(c1, i + 1); ++c) {
          double* col = cols.data() + (c - c0) * n;
          col[i] = ((i == c ? 1.0 : 0.0) - dot(li + c, col + c, i - c)) / li[i];
        }
      }
      for (int64_t c = c0; c < c1; ++c)
        for (int64_t i = c; i < n; ++i) x[i * n + c] = cols[(c - c0) * n + i];
    }
  });
  l = std::move(x);
}

}  // namespace lowbit::quant
