// Dense linear algebra for Hessian-aware rounding through OpenBLAS and LAPACK(E): the products in f32, the
// factorizations in f64. OpenBLAS runs with the thread count of lowbit's pool, fixed for the process, so results
// are the same run to run.
#pragma once

#include <cstdint>
#include <vector>

namespace lowbit::quant {

// c [m, n] (row stride ldc) = alpha * a [m, k] (row stride lda) @ op(b) + beta * c, row-major f32. op(b) is
// b [k, n] (row stride ldb), or b^T for b [n, k] (row stride ldb) when `b_transposed`.
void gemm(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
          bool b_transposed, float beta, float* c, int64_t ldc);

// c [n, n] += a^T a for a [k, n] (row stride lda): the f32 product (one triangle of it) folded into the f64
// total, which stays exactly symmetric.
void add_gram(const float* a, int64_t k, int64_t n, int64_t lda, std::vector<float>& scratch, std::vector<double>& c);

// <h, a^T a> = sum over rows of a_r^T h a_r for a [k, n] (row-major, contiguous) and a symmetric h [n, n] (f64,
// row-major): the f32 Gram matrix's lower triangle against h's, summed in f64 row by row in a fixed order.
double gram_inner(const float* a, int64_t k, int64_t n, const std::vector<double>& h);

// out [cols, rows] = m^T for m [rows, cols] row-major with row stride `stride`.
std::vector<float> transpose(const float* m, int64_t rows, int64_t cols, int64_t stride);

// In place: the lower Cholesky factor L of a symmetric positive definite A (n x n, row-major), A = L L^T, with
// the strict upper triangle zeroed. Reads only A's lower triangle. False when A is not (numerically) positive
// definite.
bool cholesky_lower(std::vector<double>& a, int64_t n);

// In place: L^-1 of a lower triangular, nonsingular L (n x n, row-major, strict upper triangle zero).
void invert_lower(std::vector<double>& l, int64_t n);

}  // namespace lowbit::quant
