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

#include "trellis.h"
#include "trellis_tile.cuh"

namespace lowbit::kernels::cuda {
namespace {

constexpr int kTileDim = 16;
constexpr int kTilesPerChunk = 4;
constexpr int kWarps = 16;
constexpr int kThreads = kWarps * 32;
constexpr int kStages = 6;
constexpr int64_t kFmaMinTileRows = 512;  // batch 1 from here on: trellis_fma.cu

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
      const uint32_t hi = tf32_hi(f[j]);
      if constexpr (NT == 1) {
        v[0][j] = lo_lane ? __float_as_uint(f[j] - __uint_as_float(hi)) : hi;
      } else {
        v[s][j] = hi;
        v[NS + s][j] = __float_as_uint(f[j] - __uint_as_float(hi));
      }
    }
  }
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

  const TileDecoder<K, kMad1, kL16> decoder(w.L, g, t);
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
      float fg[4], fh[4];
      decoder.decode(rg, rh, q, fg, fh);
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
