// Launchers of the trellis decode matvec (batch 1..kMaxBatch) in its device layout (docs/CUDA.md). Plain C++
// with no lowbit includes: trellis.cu implements the *_kernel launcher, trellis_launch.cpp the checked one.
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
  int k = 2;      // 2 or 3
  int L = 16;     // 8..16
  bool mad1 = true;  // 1MAD, else 3INST
};

void trellis_matmul(const TrellisDevice& w, const float* x, int m, float* y, CUstream_st* stream);
void launch_trellis_kernel(const TrellisDevice& w, const float* x, int m, int batch, float* y, CUstream_st* stream);

}  // namespace lowbit::kernels::cuda
