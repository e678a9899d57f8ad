// Randomized Hadamard rotation of activations (trellis tensors store W' = R_out W R_in^T, so a matmul rotates x
// by R_in first and un-rotates y' by R_out^T after). One block per batch row holds the row in shared memory.
// H = H_chunks (x) H_small and the two factors commute, so the Sylvester butterflies (stride `small`) run in place
// first and the small factor is applied on the way out, one output element per thread:
//   forward  (R x):   s = D x;  s <- H_chunks s;  out_i = norm * sum_j H_small[i][j] s[chunk * small + j]
//   inverse (R^T y):  s = y;    s <- H_chunks s;  out_i = norm * D_i * sum_j H_small[j][i] s[chunk * small + j]
// The same sums as codec/hadamard.cpp in another order (float rounding differs, not the transform).
#include <cuda_runtime.h>

#include "trellis.h"

namespace lowbit::kernels::cuda {
namespace {

constexpr int kRotateThreads = 512;

__global__ void __launch_bounds__(kRotateThreads) rotate_kernel(RotationDevice r, bool inverse,
                                                                const float* __restrict__ in, int64_t in_len,
                                                                float* __restrict__ out, int64_t out_len) {
  extern __shared__ float s[];
  const int64_t n = r.n, small = r.small, chunks = n / small;
  const float* row_in = in + blockIdx.x * in_len;
  float* row_out = out + blockIdx.x * out_len;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = i < in_len ? row_in[i] : 0.0f;
    s[i] = inverse ? v : v * r.signs[i];
  }
  __syncthreads();
  for (int64_t h = 1; h < chunks; h *= 2) {
    for (int64_t p = threadIdx.x; p < n / 2; p += blockDim.x) {
      const int64_t q = p / small, i = p % small;
      const int64_t a = ((q / h) * 2 * h + q % h) * small + i, b = a + h * small;
      const float u = s[a], w = s[b];
      s[a] = u + w;
      s[b] = u - w;
    }
    __syncthreads();
  }
  const float norm = rsqrtf(static_cast<float>(n));
  for (int64_t o = threadIdx.x; o < out_len; o += blockDim.x) {
    const int64_t chunk = o / small, i = o % small;
    const float* v = s + chunk * small;
    float acc = 0.0f;
    for (int64_t j = 0; j < small; ++j) acc += v[j] * r.small_matrix[inverse ? j * small + i : i * small + j];
    row_out[o] = inverse ? acc * norm * r.signs[o] : acc * norm;
  }
}

}  // namespace

void launch_rotate_kernel(const RotationDevice& r, bool inverse, const float* in, int64_t in_len, int m, float* out,
                          int64_t out_len, CUstream_st* stream) {
  // Once, outside any graph capture's stream work: allow the largest row the checked entry lets through.
  static const cudaError_t raised = cudaFuncSetAttribute(rotate_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                         static_cast<int>(kMaxRotation * sizeof(float)));
  (void)raised;  // a failure surfaces as the launch error
  const size_t smem = static_cast<size_t>(r.n) * sizeof(float);
  rotate_kernel<<<m, kRotateThreads, smem, stream>>>(r, inverse, in, in_len, out, out_len);
}

}  // namespace lowbit::kernels::cuda
