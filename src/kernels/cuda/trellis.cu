// Trellis decode matmul on tensor cores (batch 1..16): y = x @ W'^T for the stored (unrotated) W', read once.
//
// A warp owns one tile row (16 output rows) and a contiguous slice of its column chunks (4 tiles = 64 columns);
// a block's 16 warps are R tile rows x 16 / R slices (R = 1, 2 or 4, so that small row counts still fill the
// GPU) and add their slices' sums in shared memory at the end, in a fixed order. Each warp streams its chunks
// into a shared-memory ring with cp.async, kStages - 1 chunks ahead, so enough bytes are in flight per SM.
//
// Per chunk, lane 4 g + t decodes rows g and g + 8, states 4 t .. 4 t + 3 of each of the 4 tiles: the tf32
// A fragments of two mma.sync m16n8k8 steps (step s takes the lane's columns 4 t + 2 s and 4 t + 2 s + 1; B
// uses the same column order, so one float4 of x per lane and batch row serves both steps). The L - k bits
// before a tile row in the tail-biting stream are the end of the row above, fetched by shuffle from the lane
// that decodes it. Every weight is decoded once whatever the batch: the batch only adds mma columns. The
// activations split into tf32 hi + lo (x = hi + lo to about 2^-22), so the products keep f32 accuracy; batch
// 1..4 fits one 8-column n-tile (hi in columns 0-3, lo in 4-7), 8 and 16 take 2 and 4 n-tiles.
//
// Decoded values are exact (trellis_code.cuh), and exact in tf32. Batch 1 on tall matrices (512 or more tile
// rows) runs the CUDA-core kernel of trellis_fma.cu instead, which is faster there.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/trellis.h"
#include "kernels/cuda/trellis_code.cuh"

namespace lowbit::kernels::cuda {
namespace {

constexpr int kTileDim = 16;
constexpr int kTilesPerChunk = 4;
constexpr int kWarps = 16;
constexpr int kThreads = kWarps * 32;
constexpr int kStages = 6;
constexpr int64_t kFmaMinTileRows = 512;  // batch 1 from here on: trellis_fma.cu

// States 4 t .. 4 t + 3 of a tile row from its window hi:lo:tail = [16 prefix bits | the row's 16 K bits], MSB
// first (tail = 0 for K = 2, 3, whose window fits in 64 bits; for K = 4 it holds bits 64..79 in its high
// half): state i is the L bits ending at bit 16 + (i + 1) K. `u` = the window's 32 bits from bit (4 t + 1) K
// on (`shift` = that mod 32, `wide` = it is >= 32), so state j sits at the fixed offset 16 - j K in it, and
// state 0 of a 16-bit trellis needs no mask.
template <int K, bool kMad1, bool kL16>
__device__ __forceinline__ void decode4(uint32_t hi, uint32_t lo, uint32_t tail, int shift, bool wide,
                                        uint32_t mask, float (&f)[4]) {
  uint32_t u;
  if constexpr (13 * K < 32) {
    u = __funnelshift_l(lo, hi, shift);
  } else {
    u = __funnelshift_l(wide ? tail : lo, wide ? lo : hi, shift);
  }
  f[0] = trellis_code<kMad1>(kL16 ? u >> 16 : (u >> 16) & mask);
#pragma unroll
  for (int j = 1; j < 4; ++j) f[j] = trellis_code<kMad1>((u >> (16 - j * K)) & (kL16 ? 0xFFFFu : mask));
}

__device__ __forceinline__ void mma_tf32(float (&c)[4], const float (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(__float_as_uint(a[0])), "r"(__float_as_uint(a[1])), "r"(__float_as_uint(a[2])),
        "r"(__float_as_uint(a[3])), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

// n-tiles NT (hi and lo columns) and activation rows per lane NS for batch widths 4 (1..4), 8 and 16.
template <int NT>
constexpr int sources() {
  return NT == 4 ? 2 : 1;
}

// The B fragment values of one tile for batch width NT: v[n][j] = tf32 part (hi or lo) of x[row][k + j] for
// n-tile n; xs[s] = the lane's source row s at column 4 t (null past the batch), k = the tile's first column,
// limit = the row's columns past 4 t.
// `full`: the whole chunk lies inside the row and rows are 16-byte aligned, so one float4 per row.
template <int NT>
__device__ __forceinline__ void load_b(const float* const (&xs)[sources<NT>()], int64_t limit, int64_t k, bool full,
                                       bool lo_lane, uint32_t (&v)[NT][4]) {
  constexpr int NS = sources<NT>();
#pragma unroll
  for (int s = 0; s < NS; ++s) {
    float f[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (xs[s]) {
      if (full) {
        const float4 q = __ldg(reinterpret_cast<const float4*>(xs[s] + k));
        f[0] = q.x, f[1] = q.y, f[2] = q.z, f[3] = q.w;
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (k + j < limit) f[j] = __ldg(xs[s] + k + j);
      }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t hi = __float_as_uint(f[j]) & 0xFFFFE000u;
      if constexpr (NT == 1) {
        v[0][j] = lo_lane ? __float_as_uint(f[j] - __uint_as_float(hi)) : hi;
      } else {
        v[s][j] = hi;
        v[NS + s][j] = __float_as_uint(f[j] - __uint_as_float(hi));
      }
    }
  }
}

// The u16 words j (high half of the result) and i (low half) of a row's words, in one PRMT.
__device__ __forceinline__ uint32_t pack16(const uint32_t* hi_words, int j, const uint32_t* lo_words, int i) {
  return __byte_perm(lo_words[i / 2], hi_words[j / 2], (i % 2 ? 0x32u : 0x10u) | (j % 2 ? 0x7600u : 0x5400u));
}

template <int K, bool kMad1, bool kL16, int NT>
__global__ void __launch_bounds__(kThreads, NT == 4 ? 1 : 2)
    trellis_kernel(TrellisDevice w, const float* __restrict__ x, int m, float* __restrict__ y, int tiles_per_block) {
  constexpr int NS = sources<NT>();
  constexpr int kRowWords = 2 * K;                   // one row's 4 tiles x K u16
  constexpr int kChunkWords = kTileDim * kRowWords;  // one chunk of a tile row
  constexpr int kCopyLanes = kChunkWords / 4;        // 16-byte copies per chunk
  constexpr int kPartial = kWarps * kTileDim * kTileDim;
  constexpr int kRing = kWarps * kStages * kChunkWords;  // K = 4: 48 KB, the most static shared memory allows
  __shared__ __align__(16) uint32_t smem[kRing > kPartial ? kRing : kPartial];

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int tile_local = warp % tiles_per_block, slice = warp / tiles_per_block;
  const int slices = kWarps / tiles_per_block;
  const int64_t tile_row = static_cast<int64_t>(blockIdx.x) * tiles_per_block + tile_local;
  const int64_t tile_rows = w.padded_rows / kTileDim;
  const int64_t per_slice = (w.chunks + slices - 1) / slices;
  const int64_t c0 = slice * per_slice;
  const int64_t c_end = tile_row < tile_rows ? (c0 + per_slice < w.chunks ? c0 + per_slice : w.chunks) : c0;
  const int n = c_end > c0 ? static_cast<int>(c_end - c0) : 0;
  const uint32_t* src = w.codes + (tile_row * w.chunks + c0) * kChunkWords + 4 * lane;
  uint32_t* const ring = smem + warp * kStages * kChunkWords;
  const bool copier = lane < kCopyLanes;

  const uint32_t mask = (1u << w.L) - 1u;
  const int shift = ((4 * t + 1) * K) % 32;
  const bool wide = (4 * t + 1) * K >= 32;
  const int prefix_lane = ((g + 7) & 7) * 4 + t;
  // Prefix of row g: the last word of row g - 1 (lane g - 1's first row), of row 15 for g = 0 (lane 7's second);
  // the selectors put it above the row's first word (low or high half of its u32).
  const uint32_t sel_g0 = g > 0 ? 0x5410u : 0x7610u, sel_h0 = g > 0 ? 0x7610u : 0x5410u;
  const uint32_t sel_g1 = sel_g0 + 0x22u, sel_h1 = sel_h0 + 0x22u;
  // Activation rows this lane feeds into B: batch 1..4 rows g % 4 (hi in lanes g < 4, lo above), else g, g + 8.
  const float* xs[NS];
#pragma unroll
  for (int s = 0; s < NS; ++s) {
    const int row = NT == 1 ? (g & 3) : g + 8 * s;
    xs[s] = row < m ? x + row * w.cols + 4 * t : nullptr;
  }
  const bool lo_lane = g >= 4;
  const bool x_aligned = w.cols % 4 == 0;
  const int64_t x_limit = w.cols - 4 * t;  // columns of xs[s] that lie inside the row

  float acc[NT][4];
#pragma unroll
  for (int a = 0; a < NT; ++a)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[a][e] = 0.0f;

#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (i < n && copier) cp_async16(ring + i * kChunkWords + 4 * lane, src + i * kChunkWords);
    cp_async_commit();
  }
  int read_stage = 0, write_stage = kStages - 1;
  for (int i = 0; i < n; ++i) {
    __syncwarp();  // every lane is done with the stage the next copy overwrites
    if (i + kStages - 1 < n && copier)
      cp_async16(ring + write_stage * kChunkWords + 4 * lane,
                 src + static_cast<int64_t>(i + kStages - 1) * kChunkWords);
    cp_async_commit();
    write_stage = write_stage + 1 == kStages ? 0 : write_stage + 1;
    cp_async_wait<kStages - 1>();
    __syncwarp();
    const uint32_t* stage = ring + read_stage * kChunkWords;
    read_stage = read_stage + 1 == kStages ? 0 : read_stage + 1;
    uint32_t rg[kRowWords], rh[kRowWords];
#pragma unroll
    for (int j = 0; j < kRowWords; ++j) {
      rg[j] = stage[g * kRowWords + j];
      rh[j] = stage[(g + 8) * kRowWords + j];
    }
    const int64_t chunk_col = (c0 + i) * (kTilesPerChunk * kTileDim);
    const bool full = x_aligned && chunk_col + kTilesPerChunk * kTileDim <= w.cols;
#pragma unroll
    for (int q = 0; q < kTilesPerChunk; ++q) {
      const int j0 = q * K;  // the tile's first u16 word in the row's words
      const uint32_t p = __shfl_sync(0xFFFFFFFFu, pack16(rh, j0 + K - 1, rg, j0 + K - 1), prefix_lane);
      const uint32_t hi_g = __byte_perm(rg[j0 / 2], p, j0 % 2 ? sel_g1 : sel_g0);
      const uint32_t hi_h = __byte_perm(rh[j0 / 2], p, j0 % 2 ? sel_h1 : sel_h0);
      uint32_t lo_g, lo_h, tail_g = 0u, tail_h = 0u;
      if constexpr (K == 2) {
        lo_g = rg[q] & 0xFFFF0000u;
        lo_h = rh[q] & 0xFFFF0000u;
      } else {
        lo_g = pack16(rg, j0 + 1, rg, j0 + 2);
        lo_h = pack16(rh, j0 + 1, rh, j0 + 2);
      }
      if constexpr (K == 4) {  // word j0 + 3, the high half of u32 j0 / 2 + 1
        tail_g = rg[j0 / 2 + 1] & 0xFFFF0000u;
        tail_h = rh[j0 / 2 + 1] & 0xFFFF0000u;
      }
      float fg[4], fh[4];
      decode4<K, kMad1, kL16>(hi_g, lo_g, tail_g, shift, wide, mask, fg);
      decode4<K, kMad1, kL16>(hi_h, lo_h, tail_h, shift, wide, mask, fh);
      uint32_t b[NT][4];
      load_b<NT>(xs, x_limit, chunk_col + q * kTileDim, full, lo_lane, b);
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        const float a[4] = {fg[2 * s], fh[2 * s], fg[2 * s + 1], fh[2 * s + 1]};
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) mma_tf32(acc[nt], a, b[nt][2 * s], b[nt][2 * s + 1]);
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // the ring becomes the partial sums

  // Lane (g, t) holds rows g and g + 8 at n-tile columns 2 t, 2 t + 1; add lo to hi, store per batch row.
  float* partial = reinterpret_cast<float*>(smem);  // [warp][batch row][tile row]
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int r = g + 8 * (e / 2);
    if constexpr (NT == 1) {
      const float v = acc[0][e] + __shfl_xor_sync(0xFFFFFFFFu, acc[0][e], 2);
      if (t < 2) partial[(warp * kTileDim + 2 * t + e % 2) * kTileDim + r] = v;
    } else {
#pragma unroll
      for (int nt = 0; nt < NT / 2; ++nt)
        partial[(warp * kTileDim + 8 * nt + 2 * t + e % 2) * kTileDim + r] = acc[nt][e] + acc[NT / 2 + nt][e];
    }
  }
  __syncthreads();
  const int batch = NT == 1 ? 4 : 4 * NT;
  for (int idx = threadIdx.x; idx < tiles_per_block * batch * kTileDim; idx += kThreads) {
    const int tl = idx / (batch * kTileDim), i = idx / kTileDim % batch, r = idx % kTileDim;
    const int64_t row = (static_cast<int64_t>(blockIdx.x) * tiles_per_block + tl) * kTileDim + r;
    if (i >= m || row >= w.rows) continue;
    float sum = 0.0f;
    for (int s = 0; s < slices; ++s) sum += partial[((s * tiles_per_block + tl) * kTileDim + i) * kTileDim + r];
    y[i * w.rows + row] = (kMad1 ? sum * kTrellisMad1Scale : sum) * w.scales[row];
  }
}

template <int K, bool kMad1, bool kL16, int NT>
void launch_kn(const TrellisDevice& w, const float* x, int m, float* y, CUstream_st* s) {
  // Few tile rows: one per block, all 16 warps on its columns; many: up to 4 per block, so x is shared in L1.
  const int64_t tile_rows = w.padded_rows / kTileDim;
  const int per_block = tile_rows >= 1024 ? 4 : (tile_rows >= 512 ? 2 : 1);
  const auto blocks = static_cast<unsigned>((tile_rows + per_block - 1) / per_block);
  trellis_kernel<K, kMad1, kL16, NT><<<blocks, kThreads, 0, s>>>(w, x, m, y, per_block);
}

template <int K, bool kMad1, bool kL16>
void launch_l(const TrellisDevice& w, const float* x, int m, int batch, float* y, CUstream_st* s) {
  if (batch <= 4) return launch_kn<K, kMad1, kL16, 1>(w, x, m, y, s);
  if (batch <= 8) return launch_kn<K, kMad1, kL16, 2>(w, x, m, y, s);
  return launch_kn<K, kMad1, kL16, 4>(w, x, m, y, s);
}

template <int K, bool kMad1>
void launch_k(const TrellisDevice& w, const float* x, int m, int batch, float* y, CUstream_st* s) {
  if (w.L == 16) return launch_l<K, kMad1, true>(w, x, m, batch, y, s);
  return launch_l<K, kMad1, false>(w, x, m, batch, y, s);
}

}  // namespace

void launch_trellis_kernel(const TrellisDevice& w, const float* x, int m, int batch, float* y, CUstream_st* s) {
  if (batch == 1 && w.padded_rows / kTileDim >= kFmaMinTileRows) return launch_trellis_fma_kernel(w, x, y, s);
  if (w.k == 2) return w.mad1 ? launch_k<2, true>(w, x, m, batch, y, s) : launch_k<2, false>(w, x, m, batch, y, s);
  if (w.k == 3) return w.mad1 ? launch_k<3, true>(w, x, m, batch, y, s) : launch_k<3, false>(w, x, m, batch, y, s);
  return w.mad1 ? launch_k<4, true>(w, x, m, batch, y, s) : launch_k<4, false>(w, x, m, batch, y, s);
}

}  // namespace lowbit::kernels::cuda
