// Trellis decode matvec (batch 1..16): y = x @ W'^T for the stored (unrotated) W', read once.
//
// One block owns a tile row (16 output rows); its 8 warps split the column chunks (4 tiles = 64 columns), two
// chunks per warp step: lanes 0-15 and 16-31 each take one chunk, lane r holding tile row r. A lane's bits for
// its 4 tiles arrive in one contiguous load (device layout, trellis.h); the L - k bits that precede a tile row
// in the tail-biting stream are the end of the row above, fetched from the neighbouring lane with a shuffle.
// Each state is two integer ops from a 64-bit window, the code two or three more, then one FMA per batch row.
//
// 1MAD's byte sum goes straight into a float: dp4a(x, 0x01010101, bits(1.5 * 2^23) - 510) is the bit pattern
// of 1.5 * 2^23 + (sum - 510), so one FADD gives the exact integer sum - 510; 1 / 147.8005... joins the row
// scale at the end. No int-to-float conversion (a quarter-rate instruction) on the hot path.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/matvec.cuh"
#include "kernels/cuda/trellis.h"

namespace lowbit::kernels::cuda {
namespace {

constexpr int kTileDim = 16;
constexpr int kTilesPerChunk = 4;
constexpr float kMad1Scale = 1.0f / 147.800537109375f;

__device__ __forceinline__ uint32_t word16(const uint32_t* w, int j) { return (w[j / 2] >> (16 * (j % 2))) & 0xFFFFu; }

// State i of a tile row from the 64-bit window hi:lo = [16 prefix bits | the row's 16 k bits], MSB first.
template <int K>
__device__ __forceinline__ uint32_t state(uint32_t hi, uint32_t lo, int i, uint32_t mask) {
  const int shift = 64 - (16 + (i + 1) * K);
  const uint32_t v = shift >= 32 ? hi >> (shift - 32) : __funnelshift_r(lo, hi, shift);
  return v & mask;
}

template <bool kMad1>
__device__ __forceinline__ float code(uint32_t s) {
  if constexpr (kMad1) {
    return __uint_as_float(__dp4a(s * 34038481u + 76625530u, 0x01010101u, 0x4B400000u - 510u)) - 12582912.0f;
  } else {
    const uint32_t r = ((s * 89226354u + 64248484u) & 0x8FFF8FFFu) ^ 0x3B603B60u;
    const __half sum = __hadd(__ushort_as_half(static_cast<unsigned short>(r & 0xFFFFu)),
                              __ushort_as_half(static_cast<unsigned short>(r >> 16)));
    return __half2float(sum);
  }
}

template <int K, bool kMad1, int M>
__global__ void __launch_bounds__(kThreads, min_blocks<M>()) trellis_kernel(TrellisDevice w, const float* __restrict__ x, int m,
                                                           float* __restrict__ y) {
  constexpr int kWords = 2 * K;  // 4 tiles x K u16 words per lane
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, half = lane / 16, r = lane % 16;
  const int prev_lane = (lane & 16) | ((lane + 15) & 15);
  const int64_t tile_row = blockIdx.x;
  const uint32_t mask = (1u << w.L) - 1u;
  const float* xr[M];
#pragma unroll
  for (int i = 0; i < M; ++i) xr[i] = x + (i < m ? i : 0) * w.cols;
  const uint32_t* base = w.codes + (tile_row * w.chunks * kTileDim + r) * kWords;
  const int stride = 2 * kWarps;
  const int first = warp * 2;
  const int iters = first < w.chunks ? static_cast<int>((w.chunks - first + stride - 1) / stride) : 0;

  float acc[M];
#pragma unroll
  for (int i = 0; i < M; ++i) acc[i] = 0.0f;

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
      const uint32_t lo = (word16(ch, q * K + 1) << 16) | (K == 3 ? word16(ch, q * K + 2) : 0u);
      const int64_t k0 = c * (kTilesPerChunk * kTileDim) + q * kTileDim;
      const bool vector = w.cols % 4 == 0 && k0 + kTileDim <= w.cols;
      float F[M];
#pragma unroll
      for (int i = 0; i < M; ++i) F[i] = 0.0f;
#pragma unroll
      for (int g = 0; g < kTileDim / 4; ++g) {
        float xv[M][4];
        load_x4<M>(xr, k0 + 4 * g, w.cols, vector, xv);
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          const float f = code<kMad1>(state<K>(hi, lo, 4 * g + t, mask));
#pragma unroll
          for (int i = 0; i < M; ++i) F[i] = fmaf(f, xv[i][t], F[i]);
        }
      }
#pragma unroll
      for (int i = 0; i < M; ++i) acc[i] += F[i];
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

  __shared__ float partial[kWarps][M][kTileDim];
#pragma unroll
  for (int i = 0; i < M; ++i) {
    const float v = acc[i] + __shfl_xor_sync(0xFFFFFFFFu, acc[i], 16);
    if (half == 0) partial[warp][i][r] = v;
  }
  __syncthreads();
  for (int t = threadIdx.x; t < M * kTileDim; t += kThreads) {
    const int i = t / kTileDim, rr = t % kTileDim;
    const int64_t row = tile_row * kTileDim + rr;
    if (i >= m || row >= w.rows) continue;
    float s = 0.0f;
#pragma unroll
    for (int wp = 0; wp < kWarps; ++wp) s += partial[wp][i][rr];
    y[i * w.rows + row] = (kMad1 ? s * kMad1Scale : s) * w.scales[row];
  }
}

template <int K, bool kMad1, int M>
void launch_km(const TrellisDevice& w, const float* x, int m, float* y, CUstream_st* s) {
  trellis_kernel<K, kMad1, M><<<static_cast<unsigned>(w.padded_rows / kTileDim), kThreads, 0, s>>>(w, x, m, y);
}

template <int K, bool kMad1>
void launch_k(const TrellisDevice& w, const float* x, int m, int batch, float* y, CUstream_st* s) {
  switch (batch) {
    case 1: return launch_km<K, kMad1, 1>(w, x, m, y, s);
    case 2: return launch_km<K, kMad1, 2>(w, x, m, y, s);
    case 4: return launch_km<K, kMad1, 4>(w, x, m, y, s);
    case 8: return launch_km<K, kMad1, 8>(w, x, m, y, s);
    default: return launch_km<K, kMad1, 16>(w, x, m, y, s);
  }
}

}  // namespace

void launch_trellis_kernel(const TrellisDevice& w, const float* x, int m, int batch, float* y, CUstream_st* s) {
  if (w.k == 2) return w.mad1 ? launch_k<2, true>(w, x, m, batch, y, s) : launch_k<2, false>(w, x, m, batch, y, s);
  return w.mad1 ? launch_k<3, true>(w, x, m, batch, y, s) : launch_k<3, false>(w, x, m, batch, y, s);
}

}  // namespace lowbit::kernels::cuda
