// The block tiling shared by the prefill GEMM kernels (affine_gemm.cu, tile_gemm.cu): y [m, rows] = x [m, cols] @
// W^T on mma.sync m16n8k16 with x as bf16 hi + lo B fragments, whatever the weights' layout.
//
// A block of 8 warps owns a tile of 128 weight rows (8 row tiles of 16) x 64 tokens; warp w computes rows
// 32 (w % 4) .. + 31 (two row tiles) x tokens 32 (w / 4) .. + 31 (four n-tiles of 8). The block walks its K range in
// stages of 64 columns through a ring of kSlots shared-memory slots filled by cp.async; the kernels differ in what a
// slot holds of the weights. Each stage's activations are converted once into bf16 hi + lo B fragments (x = hi + lo
// within 2^-17 relative, so the products keep f32 accuracy) and the per-segment sums Sx = sum (hi + lo), a segment
// being a group's part of the stage, into one of two buffers. With few row x token tiles, K is split over a cluster
// of up to 8 blocks that add their partial tiles through distributed shared memory (deterministic order).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>

#include "cluster.cuh"
#include "mma.cuh"

namespace lowbit::kernels::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kTileRows = 128;
constexpr int kRowTiles = kTileRows / 16;
constexpr int kTileTokens = 64;
constexpr int kNTiles = kTileTokens / 8;
constexpr int kStageCols = 64;
constexpr int kSteps = kStageCols / 16;
constexpr int kSlots = 3;
constexpr int64_t kMaxTokenBlocks = 65535;  // grid z

// Shared memory of the activations: a ring slot of f32 [token][column], the B fragments and the segment sums of a
// stage (two buffers each). After the loop the block's partial tile [token][row] overwrites the start of shared
// memory.
constexpr int kXStride = kStageCols + 4;  // floats per token row: the conversion's loads spread over the banks
constexpr int kXBytes = kTileTokens * kXStride * 4;
constexpr int kFragWords = kSteps * kNTiles * 2 * 32;  // per buffer: [step][n-tile][hi, lo][lane] uint2
constexpr int kFragBytes = 2 * kFragWords * 8;
constexpr int kSxFloats = 2 * kTileTokens;  // per buffer: [segment][token]
constexpr int kSxBytes = 2 * kSxFloats * 4;
constexpr int kPartialStride = kTileRows + 4;  // [token][row] padded: the stores spread over the banks
constexpr int kPartialBytes = kTileTokens * kPartialStride * 4;

// The block's tokens tok0 .. tok0 + tokens - 1, columns k0 .. k0 + 63 of x [m, cols] into xd [token][kXStride];
// zeros past the tokens and past cols. Vector copies need 16-byte aligned rows (x_vector).
__device__ __forceinline__ void copy_x_stage(float* xd, const float* __restrict__ x, int64_t cols, int64_t tok0,
                                             int tokens, int64_t k0, bool vector) {
  if (vector) {
    for (int c = threadIdx.x; c < kTileTokens * kStageCols / 4; c += kThreads) {
      const int n = c / (kStageCols / 4), col = 4 * (c % (kStageCols / 4));
      const int64_t left = cols - (k0 + col);
      const int bytes = n >= tokens ? 0 : left >= 4 ? 16 : left > 0 ? static_cast<int>(4 * left) : 0;
      cp_async16(xd + n * kXStride + col, bytes > 0 ? x + (tok0 + n) * cols + k0 + col : x, bytes);
    }
  } else {
    for (int c = threadIdx.x; c < kTileTokens * kStageCols; c += kThreads) {
      const int n = c / kStageCols, col = c % kStageCols;
      const bool in = n < tokens && k0 + col < cols;
      cp_async4(xd + n * kXStride + col, in ? x + (tok0 + n) * cols + k0 + col : x, in ? 4 : 0);
    }
  }
}

// A stage's activations (xs) as B fragments (frag) and segment sums (sx) of seg_steps k16 steps each. Thread
// (token n, step j) takes columns 16 j .. 16 j + 15 of token n: lane 4 (n % 8) + t of n-tile n / 8 gets columns
// 16 j + 2 t + {0, 1, 8, 9}, so the thread's four lanes are 32 contiguous bytes of hi (and of lo), and a segment's
// sum is over seg_steps neighbouring threads.
static_assert(kTileTokens * kSteps == kThreads, "one (token, step) per thread");
__device__ __forceinline__ void convert_x_stage(const float* xs_slot, uint2* frag, float* sx, int seg_steps) {
  const int n = threadIdx.x / kSteps, j = threadIdx.x % kSteps;
  const float4* xs = reinterpret_cast<const float4*>(xs_slot) + (n * kXStride + 16 * j) / 4;
  const float4 v[4] = {xs[0], xs[1], xs[2], xs[3]};
  const float f[16] = {v[0].x, v[0].y, v[0].z, v[0].w, v[1].x, v[1].y, v[1].z, v[1].w,
                       v[2].x, v[2].y, v[2].z, v[2].w, v[3].x, v[3].y, v[3].z, v[3].w};
  uint32_t hi[8], lo[8];  // lane t: hi[2 t], hi[2 t + 1]
  float sum = 0.0f;
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    sum += split_pair(f[2 * t], f[2 * t + 1], hi[2 * t], lo[2 * t]);
    sum += split_pair(f[2 * t + 8], f[2 * t + 9], hi[2 * t + 1], lo[2 * t + 1]);
  }
  uint4* dst = reinterpret_cast<uint4*>(frag + (j * kNTiles + n / 8) * 64 + frag_lane(4 * (n % 8), j));
  dst[0] = {hi[0], hi[1], hi[2], hi[3]};
  dst[1] = {hi[4], hi[5], hi[6], hi[7]};
  dst[16] = {lo[0], lo[1], lo[2], lo[3]};
  dst[17] = {lo[4], lo[5], lo[6], lo[7]};
  for (int off = 1; off < seg_steps; off <<= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, off);
  if ((j & (seg_steps - 1)) == 0) sx[(j / seg_steps) * kTileTokens + n] = sum;
}

// Warp wn's B fragments of k16 step j: [hi, lo][n-tile].
__device__ __forceinline__ void load_b(const uint2* frag, int j, int wn, int lane, uint2 (&bf)[2][4]) {
#pragma unroll
  for (int n = 0; n < 4; ++n) {
    const uint2* fj = frag + (j * kNTiles + 4 * wn + n) * 64 + frag_lane(lane, j);
    bf[0][n] = fj[0];
    bf[1][n] = fj[32];
  }
}

// c [row tile][n-tile] += A (two row tiles) x (hi + lo): the hi products, then the lo ones, so that consecutive mma
// are independent.
__device__ __forceinline__ void mma_step(float (&c)[2][4][4], const uint32_t (&af)[2][4], const uint2 (&bf)[2][4]) {
#pragma unroll
  for (int p = 0; p < 2; ++p)
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int r = 0; r < 2; ++r) mma_bf16(c[r][n], af[r], bf[p][n]);
}

// Segment `seg`'s sums of the lane's tokens: n-tile n, elements (2 t, 2 t + 1).
__device__ __forceinline__ void load_segment_sums(const float* sx, int seg, int wn, int t, float2 (&sxv)[4]) {
#pragma unroll
  for (int n = 0; n < 4; ++n)
    sxv[n] = *reinterpret_cast<const float2*>(sx + seg * kTileTokens + 32 * wn + 8 * n + 2 * t);
}

// acc (row tile r, fragment half h) += bias Sx, and + scale c at a group's end.
__device__ __forceinline__ void apply_segment(float (&acc)[4][4], const float (&c)[4][4], const float2 (&sxv)[4], int h,
                                              float scale, float bias, bool group_end) {
#pragma unroll
  for (int n = 0; n < 4; ++n)
#pragma unroll
    for (int e2 = 0; e2 < 2; ++e2) {
      float v = fmaf(bias, e2 ? sxv[n].y : sxv[n].x, acc[n][2 * h + e2]);
      if (group_end) v = fmaf(scale, c[n][2 * h + e2], v);
      acc[n][2 * h + e2] = v;
    }
}

__device__ __forceinline__ void zero(float (&v)[2][4][4]) {
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) v[r][n][e] = 0.0f;
}

// After k16 step j of stage st: at a segment's end (every seg_steps steps) acc += bias' Sx for both row tiles,
// and at a group's end also + scale C, restarting C. row_meta(r, h, q) gives (scale, bias') of the lane's row in
// row tile r, fragment half h, for group q among the stage's.
template <class RowMeta>
__device__ __forceinline__ void finish_segment(int j, int64_t st, int seg_steps, int group_steps, int group_log2,
                                               const float* sx, int wn, int t, float (&acc)[2][4][4],
                                               float (&c)[2][4][4], RowMeta row_meta) {
  if (((j + 1) & (seg_steps - 1)) != 0) return;
  const bool group_end = ((st * kSteps + j + 1) & (group_steps - 1)) == 0;
  const int q = (16 * j) >> group_log2;  // the group among the stage's meta (0 unless group 32)
  float2 sxv[4];
  load_segment_sums(sx, j / seg_steps, wn, t, sxv);
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float2 sb = row_meta(r, h, q);
      apply_segment(acc[r], c[r], sxv, h, sb.x, sb.y, group_end);
    }
  if (group_end) zero(c);
}

// After the K loop (every copy waited for, a barrier passed): the block's partial tile [token][row] into part
// (shared memory), then each rank of the cluster adds its share of it over the ranks into y rows row0 ..,
// tokens tok0 .. (y = or y +=).
__device__ __forceinline__ void reduce_tile(float* part, const float (&acc)[2][4][4], float* __restrict__ y, int64_t rows,
                                            int64_t row0, int64_t tok0, int tokens, bool accumulate) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int wr = warp % 4, wn = warp / 4;
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        part[(32 * wn + 8 * n + 2 * t + (e & 1)) * kPartialStride + 32 * wr + 16 * r + g + 8 * (e >> 1)] = acc[r][n][e];
  cluster_sync();
  const int ranks = gridDim.x, split = blockIdx.x, share = kTileTokens * kTileRows / ranks;
  for (int idx = threadIdx.x; idx < share; idx += kThreads) {
    const int el = split * share + idx, n = el / kTileRows, row = el % kTileRows;
    const int64_t out_row = row0 + row;
    if (n >= tokens || out_row >= rows) continue;
    float s = 0.0f;
    for (int rk = 0; rk < ranks; ++rk) s += cluster_partial(part, rk)[n * kPartialStride + row];
    float* dst = y + (tok0 + n) * rows + out_row;
    *dst = accumulate ? *dst + s : s;
  }
  cluster_sync();  // no block leaves while others read its partial tile
}

// Launches kernel(args, x, y) over m tokens in grids of at most kMaxTokenBlocks token blocks, each with the K split
// that shortens the critical path: waves of resident blocks x stages per share (shares of whole groups of
// group_stages stages and at least 8 stages; the smaller split on a tie). Args has members m and stages_per_split.
template <class Kernel, class Args>
void launch_tiles(Kernel kernel, const ClusterResidency& dev, int smem_bytes, Args a, int64_t row_blocks,
                  int64_t stages, int64_t group_stages, const float* x, int64_t cols, int64_t m, float* y, int64_t rows,
                  CUstream_st* s) {
  for (int64_t t0 = 0; t0 < m; t0 += kMaxTokenBlocks * kTileTokens) {
    const int64_t part = std::min(m - t0, kMaxTokenBlocks * kTileTokens);
    const int64_t token_blocks = (part + kTileTokens - 1) / kTileTokens;
    int split = 1, stages_per_split = 0;
    int64_t best = -1;
    for (int i = 0; i < ClusterResidency::kSizes && (i == 0 || dev.clusters); ++i) {
      const int sp = 1 << i;
      if (i > 0 && stages < 8 * sp) break;
      const int64_t share = ((stages + sp - 1) / sp + group_stages - 1) / group_stages * group_stages;
      const int64_t resident = i == 0 ? dev.blocks : int64_t{std::max(dev.clusters_of[i], 1)} << i;
      const int64_t waves = (row_blocks * token_blocks * sp + resident - 1) / resident;
      if (best < 0 || waves * share < best) {
        best = waves * share;
        split = sp;
        stages_per_split = static_cast<int>(share);
      }
    }
    a.stages_per_split = stages_per_split;
    a.m = part;
    const ClusterLaunch config(
        dim3(static_cast<unsigned>(split), static_cast<unsigned>(row_blocks), static_cast<unsigned>(token_blocks)),
        kThreads, split, dev.clusters, smem_bytes, s);
    cudaLaunchKernelEx(&config.cfg, kernel, a, x + t0 * cols, y + t0 * rows);
  }
}

int log2_of(int v) {
  int l = 0;
  while ((1 << l) < v) ++l;
  return l;
}

bool x_vector(const float* x, int64_t cols) { return cols % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0; }

}  // namespace
}  // namespace lowbit::kernels::cuda
