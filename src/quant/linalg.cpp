#include "linalg.h"

#include <cblas.h>
#include <lapacke.h>

#include <algorithm>
#include <mutex>

#include "lowbit/core/error.h"
#include "lowbit/core/thread_pool.h"

namespace lowbit::quant {

namespace {

// OpenBLAS's own threads, as many as lowbit's pool: set once, before the first call, so that every call of a
// run splits its work the same way.
void fix_blas_threads() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(static_cast<int>(default_pool().size())); });
}

blasint dim(int64_t v) { return static_cast<blasint>(v); }

}  // namespace

void gemm(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
          bool b_transposed, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  fix_blas_threads();
  cblas_sgemm(CblasRowMajor, CblasNoTrans, b_transposed ? CblasTrans : CblasNoTrans, dim(m), dim(n), dim(k), alpha, a,
              dim(lda), b, dim(ldb), beta, c, dim(ldc));
}

void add_gram(const float* a, int64_t k, int64_t n, int64_t lda, std::vector<float>& scratch, std::vector<double>& c) {
  fix_blas_threads();
  scratch.resize(static_cast<size_t>(n * n));
  cblas_ssyrk(CblasRowMajor, CblasLower, CblasTrans, dim(n), dim(k), 1.0f, a, dim(lda), 0.0f, scratch.data(), dim(n));
  // The lower triangle into both of c's, so that c stays exactly symmetric: tiles (bi, bj <= bi) and their
  // mirrors, a row of tiles per task.
  constexpr int64_t kTile = 64;
  const int64_t tiles = (n + kTile - 1) / kTile;
  default_pool().parallel_for(static_cast<size_t>(tiles), 1, [&](size_t t0, size_t t1) {
    for (auto bi = static_cast<int64_t>(t0); bi < static_cast<int64_t>(t1); ++bi)
      for (int64_t bj = 0; bj <= bi; ++bj)
        for (int64_t i = bi * kTile; i < std::min(n, (bi + 1) * kTile); ++i)
          for (int64_t j = bj * kTile; j < std::min(i + 1, (bj + 1) * kTile); ++j) {
            const double v = scratch[i * n + j];
            c[i * n + j] += v;
            if (j != i) c[j * n + i] += v;
          }
  });
}

double gram_inner(const float* a, int64_t k, int64_t n, const std::vector<double>& h) {
  fix_blas_threads();
  std::vector<float> g(static_cast<size_t>(n * n));
  cblas_ssyrk(CblasRowMajor, CblasLower, CblasTrans, dim(n), dim(k), 1.0f, a, dim(n), 0.0f, g.data(), dim(n));
  std::vector<double> per_row(static_cast<size_t>(n), 0.0);
  default_pool().parallel_for(static_cast<size_t>(n), 16, [&](size_t i0, size_t i1) {
    for (size_t i = i0; i < i1; ++i) {
      double s = 0;
      for (size_t j = 0; j < i; ++j) s += h[i * n + j] * g[i * n + j];
      per_row[i] = 2 * s + h[i * n + i] * g[i * n + i];
    }
  });
  double total = 0;
  for (const double v : per_row) total += v;
  return total;
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

// A row-major lower triangle is the column-major upper one of the same memory, so LAPACK runs on the matrix in
// place, column-major, with no transposing copy (LAPACKE's row-major entry points make one).
bool cholesky_lower(std::vector<double>& a, int64_t n) {
  fix_blas_threads();
  const lapack_int info = LAPACKE_dpotrf(LAPACK_COL_MAJOR, 'U', dim(n), a.data(), dim(n));
  if (info < 0) fail(Errc::internal, "[linalg] dpotrf: argument {} is invalid", -info);
  if (info > 0) return false;
  for (int64_t i = 0; i < n; ++i) std::fill(a.begin() + i * n + i + 1, a.begin() + (i + 1) * n, 0.0);
  return true;
}

void invert_lower(std::vector<double>& l, int64_t n) {
  fix_blas_threads();
  const lapack_int info = LAPACKE_dtrtri(LAPACK_COL_MAJOR, 'U', 'N', dim(n), l.data(), dim(n));
  if (info != 0) fail(Errc::internal, "[linalg] dtrtri: the triangular factor is singular (info {})", info);
}

}  // namespace lowbit::quant
