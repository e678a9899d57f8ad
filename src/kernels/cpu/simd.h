// SIMD building blocks shared by the CPU kernels. Each function is compiled for every x86 target Highway knows
// (SSE4, AVX2, AVX-512 and the portable baseline) and dispatched at run time to the best one the CPU supports
// (hwy/foreach_target.h + HWY_DYNAMIC_DISPATCH in simd.cpp); callers see plain functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "lowbit/core/dtype.h"

namespace lowbit {
class ThreadPool;
}

namespace lowbit::kernels::simd {

// f32 lanes of the dispatched target's vectors (4, 8 or 16); kernels whose layout depends on it ask here.
size_t float_lanes();
// Name of the dispatched target ("AVX3", "AVX2", ...), for benchmark reports.
const char* target_name();

// out[i] = src[i] as f32, for src of dtype F32, F16 or BF16.
void to_f32(DType src_dtype, const void* src, size_t n, float* out);

// sum_i a[i] * b[i] in f32.
float dot(const float* a, const float* b, size_t n);

// y[r - r0] = sum_c W[r, c] * x[c] for r in [r0, r1); W row-major [*, cols] of dtype F32, F16 or BF16.
void dense_matvec(DType w_dtype, const void* w, size_t cols, const float* x, size_t r0, size_t r1, float* y);

// acc[i * acc_stride + r] += sum_k w[r * w_stride + k] * x[i * x_stride + k] for r < rows, i < m, k < k_len:
// a tile of decoded weight rows against m activation rows (the batched path's inner product).
void tile_dot(const float* w, size_t w_stride, size_t rows, const float* x, size_t x_stride, size_t m,
              size_t k_len, float* acc, size_t acc_stride);

// Writes rows [r0, r1) x columns [k0, k1) of a weight, decoded to f32, into out (row stride out_stride).
using DecodeTile = std::function<void(size_t r0, size_t r1, size_t k0, size_t k1, float* out, size_t out_stride)>;

// The batched path shared by every codec: y [m, rows] (row stride y_stride) = x [m, k_len] (row stride x_stride)
// @ W^T, where W's rows are decoded a tile at a time (tile_rows x k_chunk floats of scratch per thread) and each
// tile is reused across all m activations. k_chunk must be a multiple of the codec's decode block. Parallel
// over tiles of output rows.
void tiled_matmul(size_t rows, size_t k_len, size_t k_chunk, const DecodeTile& decode, const float* x,
                  size_t x_stride, size_t m, float* y, size_t y_stride, ThreadPool& pool);

}  // namespace lowbit::kernels::simd
