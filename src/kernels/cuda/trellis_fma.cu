// Trellis decode matvec for one activation row on CUDA cores (trellis.h), for tall matrices: at batch 1 with
// 512 or more tile rows it beats the tensor-core kernel of trellis.cu (H200, 2026-12-03: 25.7 vs 37.5 us at
// 14336 x 4096, 99.7 vs 116.9 us at 8192 x 28672, k = 2; docs/PERFORMANCE.md), since it spends fewer integer
// instructions per weight: a lane decodes all 16 states of a tile row from one window at fixed shifts.
//
// One block owns a tile row (16 output rows); its 8 warps split the column chunks (4 tiles = 64 columns), two
// chunks per warp step: lanes 0-15 and 16-31 each take one chunk, lane r holding tile row r. A lane's bits for
// its 4 tiles arrive in one contiguous load (device layout, trellis.h); the L - k bits that precede a tile row
// in the tail-biting stream are the end of the row above, fetched from the neighbouring lane with a shuffle.
// Each state is two integer ops from a 64-bit window (80 bits for k = 4, each state's word pair fixed at
// compile time), the code two or three more, then one FMA.
#include "matvec.cuh"
#include "trellis.h"
#include "trellis_code.cuh"

namespace lowbit::kernels::cuda {
namespace {

constexpr int kTileDim = 16;
constexpr int kTilesPerChunk = 4;

__device__ __forceinline__ uint32_t word16(const uint32_t* w, int j) { return (w[j / 2] >> (16 * (j % 2))) & 0xFFFFu; }

// State i of a tile row from the window hi:lo = [16 prefix bits | the row's 16 K bits], MSB first: 64 bits for
// K = 2, 3. For K = 4 the window is 80 bits, hi:mid:lo (lo's low half zero), and the shift falls in one of
// three word pairs (i is a compile-time constant in the unrolled loop, so the choice costs nothing).
template <int K>
__device__ __forceinline__ uint32_t state(uint32_t hi, uint32_t lo, int i, uint32_t mask) {
  const int shift = 64 - (16 + (i + 1) * K);
  const uint32_t v = shift >= 32 ? hi >> (shift - 32) : __funnelshift_r(lo, hi, shift);
  return v & mask;
}
__device__ __forceinline__ uint32_t state4(uint32_t hi, uint32_t mid, uint32_t lo, int i, uint32_t mask) {
  const int shift = 96 - (16 + (i + 1) * 4);
  const uint32_t v = shift >= 64   ? hi >> (shift - 64)
                     : shift >= 32 ? __funnelshift_r(mid, hi, shift - 32)
                                   : __funnelshift_r(lo, mid, shift);
  return v & mask;
}

template <int K, bool kMad1>
__global__ void __launch_bounds__(kThreads, min_blocks<1>()) trellis_fma_kernel(TrellisDevice w,
                                                                                const float* __restrict__ x,
                                                                                float* __restrict__ y) {
  constexpr int kWords = 2 * K;  // 4 tiles x K u16 words per lane
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, half = lane / 16, r = lane % 16;
  const int prev_lane = (lane & 16) | ((lane + 15) & 15);
  const int64_t tile_row = blockIdx.x;
  const uint32_t mask = (1u << w.L) - 1u;
  const float* const xr[1] = {x};
  const uint32_t* base = w.codes + (tile_row * w.chunks * kTileDim + r) * kWords;
  const int stride = 2 * kWarps;
  const int first = warp * 2;
  const int iters = first < w.chunks ? static_cast<int>((w.chunks - first + stride - 1) / stride) : 0;
  float acc = 0.0f;

  auto load = [&](int it, uint32_t (&ch)[kWords]) {
    const int64_t c = first + half + static_cast<int64_t>(it) * stride;
    if (c < w.chunks) {
      load_words<kWords>(base + c * kTileDim * kWords, ch);
    } else {
#pragma unroll
      for (int j = 0; j < kWords; ++j) ch[j] = 0;
    }
  };
  auto compute = [&](int it, const uint32_t (&ch)[kWords]) {
    const int64_t c = first + half + static_cast<int64_t>(it) * stride;
    const bool valid = c < w.chunks;
#pragma unroll
    for (int q = 0; q < kTilesPerChunk; ++q) {
      // Every lane shuffles (the halves may differ in validity); only valid chunks accumulate.
      const uint32_t prev = __shfl_sync(0xFFFFFFFFu, word16(ch, q * K + K - 1), prev_lane);
      if (!valid) continue;
      const uint32_t hi = (prev << 16) | word16(ch, q * K);
      const uint32_t lo = (word16(ch, q * K + 1) << 16) | (K >= 3 ? word16(ch, q * K + 2) : 0u);
      const int64_t k0 = c * (kTilesPerChunk * kTileDim) + q * kTileDim;
      const bool vector = w.cols % 4 == 0 && k0 + kTileDim <= w.cols;
      float F = 0.0f;
#pragma unroll
      for (int g = 0; g < kTileDim / 4; ++g) {
        float xv[1][4];
        load_x4<1>(xr, k0 + 4 * g, w.cols, vector, xv);
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          uint32_t st;
          if constexpr (K == 4) {
            st = state4(hi, lo, word16(ch, q * K + 3) << 16, 4 * g + t, mask);  // lo is the middle word here
          } else {
            st = state<K>(hi, lo, 4 * g + t, mask);
          }
          F = fmaf(trellis_code<kMad1>(st), xv[0][t], F);
        }
      }
      acc += F;
    }
  };

  uint32_t cur[kWords], nxt[kWords];
  if (iters > 0) load(0, cur);
  for (int it = 0; it < iters; it += 2) {
    if (it + 1 < iters) load(it + 1, nxt);
    compute(it, cur);
    if (it + 1 >= iters) break;
    if (it + 2 < iters) load(it + 2, cur);
    compute(it + 1, nxt);
  }

  __shared__ float partial[kWarps][kTileDim];
  const float v = acc + __shfl_xor_sync(0xFFFFFFFFu, acc, 16);
  if (half == 0) partial[warp][r] = v;
  __syncthreads();
  if (threadIdx.x < kTileDim) {
    const int64_t row = tile_row * kTileDim + threadIdx.x;
    if (row >= w.rows) return;
    float s = 0.0f;
#pragma unroll
    for (int wp = 0; wp < kWarps; ++wp) s += partial[wp][threadIdx.x];
    y[row] = (kMad1 ? s * kTrellisMad1Scale : s) * w.scales[row];
  }
}

template <int K, bool kMad1>
void launch(const TrellisDevice& w, const float* x, float* y, CUstream_st* s) {
  trellis_fma_kernel<K, kMad1><<<static_cast<unsigned>(w.padded_rows / kTileDim), kThreads, 0, s>>>(w, x, y);
}

}  // namespace

void launch_trellis_fma_kernel(const TrellisDevice& w, const float* x, float* y, CUstream_st* s) {
  if (w.k == 2) return w.mad1 ? launch<2, true>(w, x, y, s) : launch<2, false>(w, x, y, s);
  if (w.k == 3) return w.mad1 ? launch<3, true>(w, x, y, s) : launch<3, false>(w, x, y, s);
  return w.mad1 ? launch<4, true>(w, x, y, s) : launch<4, false>(w, x, y, s);
}

}  // namespace lowbit::kernels::cuda
