// Dense linear algebra for Hessian-aware rounding: the products run through the CPU kernels' batched dense path
// (SIMD, multithreaded), the factorizations in fp64 with their inner loops parallel over rows.
#pragma once

#include <cstdint>
#include <vector>

namespace lowbit::quant {

// y [m, n] (row stride n) = x [m, k] @ w^T for w [n, k], both row-major and contiguous, in f32.
void matmul_nt(const float* x, int64_t m, int64_t k, const float* w, int64_t n, float* y);

// out [cols, rows] = m^T for m [rows, cols] row-major with row stride `stride`.
std::vector<float> transpose(const float* m, int64_t rows, int64_t cols, int64_t stride);

// In place: the lower Cholesky factor L of a symmetric positive definite A (n x n, row-major), A = L L^T, with
// the strict upper triangle zeroed. False when A is not (numerically) positive definite.
bool cholesky_lower(std::vector<double>& a, int64_t n);

// In place: L^-1 of a lower triangular, nonsingular L (n x n, row-major).
void invert_lower(std::vector<double>& l, int64_t n);

}  // namespace lowbit::quant
