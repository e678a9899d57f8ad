// Trellis prefill GEMM on tensor cores (m > kMaxBatch activation rows): y = x @ W'^T for the stored W'.
//
// A block owns 256 output rows (16 tile rows, two per warp) and 64 activation rows ("tokens") and walks the
// column chunks (4 tiles = 64 columns) of its share of K. Per chunk, a 3-stage cp.async ring in shared memory
// holds the block's code words and the tokens' f32 activations for those 64 columns. Each warp decodes its two
// tile rows' tiles once per chunk straight into tf32 A fragments (trellis_tile.cuh, as the decode kernel does)
// and multiplies them with all 64 tokens: per tile and 8-token n-tile, one float4 of x per lane from shared
// memory, split into tf32 hi + lo in registers, and 2 x 2 x 2 mma.sync m16n8k8 (tile rows x k8 steps x hi/lo).
// So each weight is decoded once per 64 tokens (the decode costs about a quarter of the mma issue slots), and
// the products keep f32 accuracy (decoded values are exact in tf32, x = hi + lo to about 2^-22).
//
// Too few blocks to fill the GPU (few row blocks, few tokens): K is split over a cluster of up to 8 blocks,
// which add their partial sums through distributed shared memory in rank order (deterministic).
#include <cuda_runtime.h>

#include <algorithm>

#include "cluster.cuh"
#include "trellis.h"
#include "trellis_tile.cuh"

namespace lowbit::kernels::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kWarpTileRows = 2;
constexpr int kBlockTileRows = kWarps * kWarpTileRows;
constexpr int kBlockRows = kBlockTileRows * 16;
constexpr int kTokens = 64;             // activation rows per block
constexpr int kNTiles = kTokens / 8;    // mma n-tiles
constexpr int kChunkCols = 64;
constexpr int kXStride = kChunkCols + 16;  // floats per token in a stage: lanes g, g + 1 hit other banks
constexpr int kStages = 3;
constexpr int kPartialStride = kBlockRows + 4;  // floats per token in the partial sums: lanes t hit other banks
constexpr int kMaxSplit = 8;                    // the portable cluster size

template <int K>
struct Smem {
  static constexpr int kChunkWords = 16 * 2 * K;  // one tile row's chunk: 16 rows x 4 tiles x K u16
  static constexpr int kCodeWords = kBlockTileRows * kChunkWords;
  static constexpr int kStageWords = kCodeWords + kTokens * kXStride;
  static constexpr int kWords = std::max(kStages * kStageWords, kTokens * kPartialStride);
  static constexpr size_t kBytes = kWords * sizeof(uint32_t);
};

// Copies chunk `chunk`'s code words of the block's tile rows and its tokens' activations into a stage (missing
// tile rows, tokens and columns zero-filled).
template <int K>
__device__ __forceinline__ void load_stage(const TrellisDevice& w, const float* x, int64_t m, bool x_vector,
                                           int64_t tile_row0, int64_t token0, int64_t chunk, uint32_t* stage) {
  constexpr int kChunkWords = Smem<K>::kChunkWords, kCopies = kChunkWords / 4;
  const int64_t tile_rows = w.padded_rows / 16;
  for (int i = threadIdx.x; i < kBlockTileRows * kCopies; i += kThreads) {
    const int tr = i / kCopies, part = i % kCopies;
    const bool present = tile_row0 + tr < tile_rows;
    const uint32_t* src = present ? w.codes + ((tile_row0 + tr) * w.chunks + chunk) * kChunkWords + 4 * part : w.codes;
    cp_async16(stage + tr * kChunkWords + 4 * part, src, present ? 16 : 0);
  }
  float* xs = reinterpret_cast<float*>(stage + Smem<K>::kCodeWords);
  const int64_t col0 = chunk * kChunkCols;
  for (int i = threadIdx.x; i < kTokens * (kChunkCols / 4); i += kThreads) {
    const int r = i / (kChunkCols / 4), c = 4 * (i % (kChunkCols / 4));
    const int64_t token = token0 + r, col = col0 + c;
    const int64_t valid = token < m ? std::min<int64_t>(std::max<int64_t>(w.cols - col, 0), 4) : 0;
    const float* src = x + token * w.cols + col;
    float* dst = xs + r * kXStride + c;
    if (valid == 0) {
      cp_async16(dst, w.codes, 0);  // any 16-byte aligned address
    } else if (valid == 4 && x_vector) {
      cp_async16(dst, src);
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) cp_async4(dst + j, j < valid ? src + j : x, j < valid ? 4 : 0);
    }
  }
}

template <int K, bool kMad1, bool kL16>
__global__ void __launch_bounds__(kThreads, 2) trellis_gemm_kernel(TrellisDevice w, const float* __restrict__ x,
                                                                int64_t m, float* __restrict__ y, int split,
                                                                int64_t chunks_per_split) {
  using S = Smem<K>;
  constexpr int kRowWords = 2 * K;
  extern __shared__ __align__(16) uint32_t smem[];

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int rank = static_cast<int>(blockIdx.x % split);
  const int64_t tile_row0 = static_cast<int64_t>(blockIdx.x / split) * kBlockTileRows;
  const int64_t token0 = static_cast<int64_t>(blockIdx.y) * kTokens;
  const int64_t c0 = rank * chunks_per_split;
  const int n = static_cast<int>(std::max<int64_t>(std::min(c0 + chunks_per_split, w.chunks) - c0, 0));
  const bool x_vector = w.cols % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  // A warp whose first tile row lies past the matrix only helps with the copies.
  const bool active = tile_row0 + kWarpTileRows * warp < w.padded_rows / 16;
  const TileDecoder<K, kMad1, kL16> decoder(w.L, g, t);

  float acc[kWarpTileRows][kNTiles][4];
#pragma unroll
  for (int rw = 0; rw < kWarpTileRows; ++rw)
#pragma unroll
    for (int j = 0; j < kNTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[rw][j][e] = 0.0f;

#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (i < n) load_stage<K>(w, x, m, x_vector, tile_row0, token0, c0 + i, smem + i * S::kStageWords);
    cp_async_commit();
  }
  for (int i = 0; i < n; ++i) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // chunk i has landed for every thread, and every warp is done with chunk i - 1's stage
    if (i + kStages - 1 < n)
      load_stage<K>(w, x, m, x_vector, tile_row0, token0, c0 + i + kStages - 1,
                    smem + (i + kStages - 1) % kStages * S::kStageWords);
    cp_async_commit();
    if (!active) continue;
    const uint32_t* stage = smem + i % kStages * S::kStageWords;
    const float* xs = reinterpret_cast<const float*>(stage + S::kCodeWords) + g * kXStride + 4 * t;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      float a[kWarpTileRows][2][4];
#pragma unroll
      for (int rw = 0; rw < kWarpTileRows; ++rw) {
        const uint32_t* rows = stage + (kWarpTileRows * warp + rw) * S::kChunkWords;
        uint32_t rg[kRowWords], rh[kRowWords];
#pragma unroll
        for (int j = 0; j < kRowWords; ++j) {
          rg[j] = rows[g * kRowWords + j];
          rh[j] = rows[(g + 8) * kRowWords + j];
        }
        float fg[4], fh[4];
        decoder.decode(rg, rh, q, fg, fh);
#pragma unroll
        for (int s = 0; s < 2; ++s) {
          a[rw][s][0] = fg[2 * s], a[rw][s][1] = fh[2 * s], a[rw][s][2] = fg[2 * s + 1], a[rw][s][3] = fh[2 * s + 1];
        }
      }
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) {
        const float4 v = *reinterpret_cast<const float4*>(xs + j * 8 * kXStride + 16 * q);
        const float f[4] = {v.x, v.y, v.z, v.w};
        uint32_t b[2][4];  // tf32 hi, lo
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          b[0][e] = tf32_hi(f[e]);
          b[1][e] = __float_as_uint(f[e] - __uint_as_float(b[0][e]));
        }
        // Consecutive mma into different accumulators (each one waits only on the one two back).
#pragma unroll
        for (int part = 0; part < 2; ++part)
#pragma unroll
          for (int s = 0; s < 2; ++s)
#pragma unroll
            for (int rw = 0; rw < kWarpTileRows; ++rw)
              mma_tf32(acc[rw][j], a[rw][s], b[part][2 * s], b[part][2 * s + 1]);
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // the ring becomes the partial sums

  // Lane (g, t) holds rows g and g + 8 of each tile row, tokens 2 t and 2 t + 1 of each n-tile.
  float* partial = reinterpret_cast<float*>(smem);  // [token][block row]
#pragma unroll
  for (int rw = 0; rw < kWarpTileRows; ++rw)
#pragma unroll
    for (int j = 0; j < kNTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        partial[(8 * j + 2 * t + e % 2) * kPartialStride + (kWarpTileRows * warp + rw) * 16 + g + 8 * (e / 2)] =
            acc[rw][j][e];
  cluster_sync();
  // Rank r of the cluster adds up and writes its share of the block's outputs, 4 rows per thread and step (rows
  // fastest: coalesced y), with the loads from every rank in flight at once, added in rank order.
  const float4* parts[kMaxSplit];
#pragma unroll
  for (int rk = 0; rk < kMaxSplit; ++rk)
    parts[rk] = reinterpret_cast<const float4*>(rk == rank || rk >= split ? partial : cluster_partial(partial, rk));
  constexpr int kQuads = kBlockRows / 4;
  const int per_rank = kTokens * kQuads / split;
  for (int idx = rank * per_rank + threadIdx.x; idx < (rank + 1) * per_rank; idx += kThreads) {
    const int token = idx / kQuads, r = 4 * (idx % kQuads);
    const int64_t row0 = tile_row0 * 16 + r;
    if (token0 + token >= m || row0 >= w.rows) continue;
    float4 v[kMaxSplit];
#pragma unroll
    for (int rk = 0; rk < kMaxSplit; ++rk)
      if (rk < split) v[rk] = parts[rk][(token * kPartialStride + r) / 4];
    float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int rk = 0; rk < kMaxSplit; ++rk)
      if (rk < split) sum[0] += v[rk].x, sum[1] += v[rk].y, sum[2] += v[rk].z, sum[3] += v[rk].w;
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (row0 + e < w.rows)
        y[(token0 + token) * w.rows + row0 + e] = (kMad1 ? sum[e] * kTrellisMad1Scale : sum[e]) * w.scales[row0 + e];
  }
  cluster_sync();  // no block leaves while others read its partial sums
}

template <int K, bool kMad1, bool kL16>
void launch(const TrellisDevice& w, const float* x, int64_t m, float* y, CUstream_st* s) {
  const auto kernel = trellis_gemm_kernel<K, kMad1, kL16>;
  static const ClusterResidency dev(kernel, kThreads, Smem<K>::kBytes);  // once, outside any graph capture
  const int64_t row_blocks = (w.padded_rows / 16 + kBlockTileRows - 1) / kBlockTileRows;
  const int64_t token_blocks = (m + kTokens - 1) / kTokens;
  // The split with the fewest waves of clusters per unit of work (ties: the smaller), every share 2+ chunks.
  const int64_t base = row_blocks * token_blocks;
  int split = 1;
  double best = static_cast<double>((base + dev.blocks - 1) / dev.blocks);
  for (int i = 1, c = 2; c <= kMaxSplit && w.chunks >= 2 * c; ++i, c *= 2) {
    if (dev.clusters_of[i] < 1) continue;
    const double cost = static_cast<double>((base + dev.clusters_of[i] - 1) / dev.clusters_of[i]) / c;
    if (cost < best) best = cost, split = c;
  }
  const ClusterLaunch config(dim3(static_cast<unsigned>(row_blocks * split), static_cast<unsigned>(token_blocks)),
                             kThreads, split, dev.clusters, Smem<K>::kBytes, s);
  cudaLaunchKernelEx(&config.cfg, kernel, w, x, m, y, split, (w.chunks + split - 1) / split);
}

template <int K, bool kMad1>
void launch_k(const TrellisDevice& w, const float* x, int64_t m, float* y, CUstream_st* s) {
  if (w.L == 16) return launch<K, kMad1, true>(w, x, m, y, s);
  launch<K, kMad1, false>(w, x, m, y, s);
}

}  // namespace

void launch_trellis_gemm_kernel(const TrellisDevice& w, const float* x, int64_t m, float* y, CUstream_st* s) {
  if (w.k == 2) return w.mad1 ? launch_k<2, true>(w, x, m, y, s) : launch_k<2, false>(w, x, m, y, s);
  if (w.k == 3) return w.mad1 ? launch_k<3, true>(w, x, m, y, s) : launch_k<3, false>(w, x, m, y, s);
  w.mad1 ? launch_k<4, true>(w, x, m, y, s) : launch_k<4, false>(w, x, m, y, s);
}

}  // namespace lowbit::kernels::cuda
