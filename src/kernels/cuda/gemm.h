// Launchers of the prefill GEMM kernels (any number of activation rows) in the device layouts of matvec.h. Plain
// C++ with no lowbit includes: affine_gemm.cu and tile_gemm.cu implement the *_kernel launchers, gemm.cpp the
// checked ones.
#pragma once

#include <cstdint>

#include "matvec.h"

namespace lowbit::kernels::cuda {

// y [m, rows] = x [m, cols] @ W^T, f32, for any m >= 1 (meant for m > kMaxBatch; the decode kernels serve fewer
// rows better). Checks m and the layout, launches on `stream`, reports a failed launch as Errc::internal.
void affine_mma_gemm(const AffineMmaDevice& w, const float* x, int64_t m, float* y, CUstream_st* stream);
void two_plane_gemm(const TwoPlaneDevice& w, const float* x, int64_t m, float* y, CUstream_st* stream);
void coalesced_gemm(const CoalescedDevice& w, const float* x, int64_t m, float* y, CUstream_st* stream);
void affine_gemm(const AffineDevice& w, const float* x, int64_t m, float* y, CUstream_st* stream);

// Unchecked launches (affine_gemm.cu: the tensor-core layout; tile_gemm.cu: the others).
void launch_affine_gemm_kernel(const AffineMmaDevice& w, const float* x, int64_t m, float* y, CUstream_st* stream);
void launch_two_plane_gemm_kernel(const TwoPlaneDevice& w, const float* x, int64_t m, float* y, CUstream_st* stream);
void launch_coalesced_gemm_kernel(const CoalescedDevice& w, const float* x, int64_t m, float* y, CUstream_st* stream);
void launch_affine_tile_gemm_kernel(const AffineDevice& w, const float* x, int64_t m, float* y, CUstream_st* stream);

}  // namespace lowbit::kernels::cuda
