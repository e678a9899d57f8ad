// Launchers of the trellis decode matvec (batch 1..kMaxBatch) in its device layout (docs/CUDA.md). Plain C++
// with no lowbit includes: trellis.cu and trellis_fma.cu implement the *_kernel launchers, matvec.cpp the
// checked one.
#pragma once

#include <cstdint>

struct CUstream_st;

namespace lowbit::kernels::cuda {

// The stored matrix W' [padded_rows, padded_cols] (no Hadamard rotation) in 16 x 16 tiles, re-laid out so
// that one lane reads one tile row's bits for four consecutive column tiles with one contiguous load:
//   codes: [padded_rows / 16][chunks][16 rows][4 tiles][k u16 stream words], chunks = ceil(col_tiles / 4),
//          missing tiles zero (their x is zero); the words are the artifact's, in stream order.
//   scales: f32 [padded_rows] (a per-tensor scale repeated).
struct TrellisDevice {
  const uint32_t* codes = nullptr;
  const float* scales = nullptr;
  int64_t rows = 0;  // logical rows (outputs written)
  int64_t cols = 0;  // logical cols (x read)
  int64_t padded_rows = 0;
  int64_t chunks = 0;
  int k = 2;      // 2, 3 or 4
  int L = 16;     // 8..16
  bool mad1 = true;  // 1MAD, else 3INST
};

void trellis_matmul(const TrellisDevice& w, const float* x, int m, float* y, CUstream_st* stream);
// The same for any m >= 1 (prefill): up to kMaxBatch rows run the decode kernel, more the tensor-core GEMM of
// trellis_gemm.cu (each weight decoded once per 64 rows).
void trellis_gemm(const TrellisDevice& w, const float* x, int64_t m, float* y, CUstream_st* stream);

// A randomized Hadamard transform R = H D / sqrt(n) of size n = chunks * small, H = H_chunks (Sylvester) (x) H_small
// (codec/hadamard.h), on the device: signs f32 [n], small_matrix int8 [small, small] row-major.
struct RotationDevice {
  const float* signs = nullptr;
  const int8_t* small_matrix = nullptr;
  int64_t n = 0;
  int small = 1;
};
// Largest n one block rotates in shared memory.
inline constexpr int64_t kMaxRotation = 49152;

// out [m, n] = R in for any m >= 1 (inverse = false: in [m, in_len] zero-padded to n) or R^T in (inverse = true: in [m, n],
// only the first out_len outputs of each row written, out [m, out_len]).
void rotate(const RotationDevice& r, bool inverse, const float* in, int64_t in_len, int m, float* out, int64_t out_len,
            CUstream_st* stream);
void launch_rotate_kernel(const RotationDevice& r, bool inverse, const float* in, int64_t in_len, int m, float* out,
                          int64_t out_len, CUstream_st* stream);
// Batch width `batch` (batch_width in matvec.h): the tensor-core kernel, or for batch 1 on tall matrices the
// CUDA-core one (launch_trellis_fma_kernel, one activation row).
void launch_trellis_kernel(const TrellisDevice& w, const float* x, int m, int batch, float* y, CUstream_st* stream);
void launch_trellis_fma_kernel(const TrellisDevice& w, const float* x, float* y, CUstream_st* stream);
void launch_trellis_gemm_kernel(const TrellisDevice& w, const float* x, int64_t m, float* y, CUstream_st* stream);

}  // namespace lowbit::kernels::cuda
