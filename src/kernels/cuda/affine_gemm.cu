// Prefill GEMM on tensor cores for affine 2/4 bits and two-plane: y [m, rows] = x [m, cols] @ W^T for any m, with
// the weights in the tensor-core layout (AffineMmaDevice in matvec.h; two-plane runs one pass per plane).
//
// A block of 8 warps owns a tile of 128 weight rows (8 row tiles of 16) x 64 tokens; warp w computes rows
// 32 (w % 4) .. + 31 (two row tiles) x tokens 32 (w / 4) .. + 31 (four n-tiles of 8). The block walks its K range
// in stages of 64 columns through a ring of kSlots shared-memory slots filled by cp.async: each slot holds the
// stage's codes of the 8 row tiles (one 16-byte word per lane and tile at 4 bits, half of one at 2 bits: they are
// the mma A fragments already), the groups' meta and the 64 tokens' activations. The block converts each stage's
// activations once into bf16 hi + lo B fragments (x = hi + lo within 2^-17 relative, so the products keep f32
// accuracy; the tests hold the result to 2e-5 like the decode kernels) and the per-segment sums Sx = sum (hi + lo),
// a segment being a group's part of the stage (the group, or half of a group of 128), into one of two buffers: one
// barrier per stage, after which the warps convert stage s + 1 and compute stage s (the copies of stage s + 2 in
// flight meanwhile). Per k16 step a warp decodes its two A fragments (one shift and one LOP3 per register: the
// bf16 2 + q / K) and issues 16 mma.sync m16n8k16: both row tiles x four n-tiles x (hi, lo), hi and lo into the
// same accumulators C = sum (2 + q / K) x. Per group, as in the decode kernels,
//   sum (s q + b) x = s K C + (b - 2 s K) Sx,
// the Sx term added per segment and the C term at the group's end. With few row x token tiles, K is split over a
// cluster of up to 8 blocks that add their partial tiles through distributed shared memory (deterministic order).
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda/gemm.h"
#include "kernels/cuda/mma.cuh"

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
constexpr int kSplits = 4;  // K split over clusters of 1, 2, 4 or 8 blocks (8: the portable cluster size)
constexpr int64_t kMaxTokenBlocks = 65535;  // grid z

// Shared memory: the ring (codes, meta, activations per slot), then the B fragments and the segment sums of the
// stage being computed. After the loop the ring holds the block's partial tile [token][row].
constexpr int kCodesBytes = kRowTiles * 32 * 16;  // per slot; 2 bits use half
constexpr int kMetaTileWords = 64;                 // per row tile and slot: 2 groups x 16 rows x 2 words, or 1 x 16 x 4
constexpr int kMetaBytes = kRowTiles * kMetaTileWords * 4;
constexpr int kXStride = kStageCols + 4;  // floats per token row: the conversion's loads spread over the banks
constexpr int kXBytes = kTileTokens * kXStride * 4;
constexpr int kCodesOff = 0;
constexpr int kMetaOff = kCodesOff + kSlots * kCodesBytes;
constexpr int kXOff = kMetaOff + kSlots * kMetaBytes;
constexpr int kFragOff = kXOff + kSlots * kXBytes;
constexpr int kFragWords = kSteps * kNTiles * 2 * 32;  // per buffer: [step][n-tile][hi, lo][lane] uint2
constexpr int kSxOff = kFragOff + 2 * kFragWords * 8;
constexpr int kSxFloats = 2 * kTileTokens;  // per buffer: [segment][token]
constexpr int kSmemBytes = kSxOff + 2 * kSxFloats * 4;
constexpr int kPartialStride = kTileRows + 4;             // [token][row] padded: the stores spread over the banks
static_assert(kTileTokens * kPartialStride * 4 <= kFragOff, "the partial tile fits the ring");

struct GemmArgs {
  const uint32_t* codes;  // one plane in the tensor-core layout
  const uint32_t* meta;   // [row_tiles][groups][16 rows][meta_stride words]; this plane's pair at meta_offset
  int64_t rows, cols, row_tiles, kblocks, groups, m;
  int group_log2, meta_stride, meta_offset;
  bool meta_f32;    // the pair is two f32 words, else one word of bf16 (scale low, bias high)
  bool x_vector;    // x rows are 16-byte aligned: 16-byte copies
  bool accumulate;  // y += (second plane), else y =
  int stages_per_split;
};

__device__ __forceinline__ void cluster_sync() {
#if __CUDA_ARCH__ >= 900
  cooperative_groups::this_cluster().sync();
#else
  __syncthreads();
#endif
}

__device__ __forceinline__ const float* cluster_partial(float* p, int rank) {
#if __CUDA_ARCH__ >= 900
  return cooperative_groups::this_cluster().map_shared_rank(p, rank);
#else
  return p;
#endif
}

template <int B>
__global__ void __launch_bounds__(kThreads, 2) affine_gemm_kernel(GemmArgs a, const float* __restrict__ x,
                                                                  float* __restrict__ y) {
  extern __shared__ __align__(16) unsigned char smem[];
  uint2* const frag = reinterpret_cast<uint2*>(smem + kFragOff);
  float* const sx = reinterpret_cast<float*>(smem + kSxOff);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int wr = warp % 4, wn = warp / 4;
  const int split = blockIdx.x;  // rank in the cluster
  const int64_t tile0 = static_cast<int64_t>(blockIdx.y) * kRowTiles;
  const int64_t tok0 = static_cast<int64_t>(blockIdx.z) * kTileTokens;
  const int tokens = static_cast<int>(min(static_cast<int64_t>(kTileTokens), a.m - tok0));
  const int64_t total_stages = a.kblocks * (256 / B) / kStageCols;
  const int64_t st0 = static_cast<int64_t>(split) * a.stages_per_split;
  const int nst = static_cast<int>(min(static_cast<int64_t>(a.stages_per_split), max(total_stages - st0, int64_t{0})));
  const int seg_steps = min(1 << a.group_log2, kStageCols) / 16;  // k16 steps per segment
  const int group_steps = (1 << a.group_log2) / 16;
  const int meta_tile_words = max(1, kStageCols >> a.group_log2) * 16 * a.meta_stride;
  const bool warp_valid = tile0 + 2 * wr < a.row_tiles;  // row_tiles is even: both tiles or neither

  // Copies of local stage ls into its slot; one commit group per stage (empty past the end).
  auto issue = [&](int ls) {
    if (ls < nst) {
      const int slot = ls % kSlots;
      const int64_t st = st0 + ls;
      const int tl = threadIdx.x / 32;  // codes: one word (or half word) per (row tile, lane)
      if (tile0 + tl < a.row_tiles) {
        unsigned char* dst = smem + kCodesOff + slot * kCodesBytes + (tl * 32 + lane) * 4 * B;
        if constexpr (B == 4)
          cp_async16(dst, a.codes + (((tile0 + tl) * a.kblocks + st) * 32 + lane) * 4);
        else
          cp_async8(dst, a.codes + (((tile0 + tl) * a.kblocks + st / 2) * 32 + lane) * 4 + 2 * (st % 2));
      }
      const int chunks = meta_tile_words / 4;  // 16-byte chunks per row tile
      if (threadIdx.x < kRowTiles * chunks) {
        const int mt = threadIdx.x / chunks, cc = threadIdx.x % chunks;
        if (tile0 + mt < a.row_tiles) {
          const int64_t q0 = (st * kStageCols) >> a.group_log2;
          cp_async16(smem + kMetaOff + slot * kMetaBytes + (mt * kMetaTileWords + 4 * cc) * 4,
                     a.meta + ((tile0 + mt) * a.groups + q0) * 16 * a.meta_stride + 4 * cc);
        }
      }
      float* xd = reinterpret_cast<float*>(smem + kXOff + slot * kXBytes);
      const int64_t k0 = st * kStageCols;
      if (a.x_vector) {
        for (int c = threadIdx.x; c < kTileTokens * kStageCols / 4; c += kThreads) {
          const int n = c / (kStageCols / 4), col = 4 * (c % (kStageCols / 4));
          const int64_t left = a.cols - (k0 + col);
          const int bytes = n >= tokens ? 0 : left >= 4 ? 16 : left > 0 ? static_cast<int>(4 * left) : 0;
          cp_async16(xd + n * kXStride + col, bytes > 0 ? x + (tok0 + n) * a.cols + k0 + col : x, bytes);
        }
      } else {
        for (int c = threadIdx.x; c < kTileTokens * kStageCols; c += kThreads) {
          const int n = c / kStageCols, col = c % kStageCols;
          const bool in = n < tokens && k0 + col < a.cols;
          cp_async4(xd + n * kXStride + col, in ? x + (tok0 + n) * a.cols + k0 + col : x, in ? 4 : 0);
        }
      }
    }
    cp_async_commit();
  };

  // The stage's activations (slot) as B fragments and segment sums (buffer buf). Thread (token n, step j) takes
  // columns 16 j .. 16 j + 15 of token n: lane 4 (n % 8) + t of n-tile n / 8 gets columns 16 j + 2 t + {0, 1, 8, 9},
  // so the thread's four lanes are 32 contiguous bytes of hi (and of lo), and a segment's sum is over seg_steps
  // neighbouring threads.
  static_assert(kTileTokens * kSteps == kThreads, "one (token, step) per thread");
  auto convert = [&](int slot, int buf) {
    const int n = threadIdx.x / kSteps, j = threadIdx.x % kSteps;
    const float4* xs = reinterpret_cast<const float4*>(smem + kXOff + slot * kXBytes) + (n * kXStride + 16 * j) / 4;
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
    uint4* dst = reinterpret_cast<uint4*>(frag + buf * kFragWords + (j * kNTiles + n / 8) * 64 + frag_lane(4 * (n % 8), j));
    dst[0] = {hi[0], hi[1], hi[2], hi[3]};
    dst[1] = {hi[4], hi[5], hi[6], hi[7]};
    dst[16] = {lo[0], lo[1], lo[2], lo[3]};
    dst[17] = {lo[4], lo[5], lo[6], lo[7]};
    for (int off = 1; off < seg_steps; off <<= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, off);
    if ((j & (seg_steps - 1)) == 0) sx[buf * kSxFloats + (j / seg_steps) * kTileTokens + n] = sum;
  };

  float acc[2][4][4], c[2][4][4];  // [row tile][n-tile][fragment element]
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[r][n][e] = c[r][n][e] = 0.0f;

  auto compute = [&](int ls, int buf) {
    const int slot = ls % kSlots;
    const int64_t st = st0 + ls;
    const unsigned char* cs = smem + kCodesOff + slot * kCodesBytes;
    const uint32_t* ms = reinterpret_cast<const uint32_t*>(smem + kMetaOff + slot * kMetaBytes);
    uint4 w[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if constexpr (B == 4) {
        w[r] = reinterpret_cast<const uint4*>(cs)[(2 * wr + r) * 32 + lane];
      } else {
        const uint2 h = reinterpret_cast<const uint2*>(cs)[(2 * wr + r) * 32 + lane];
        w[r] = {h.x, h.y, 0u, 0u};
      }
    }
#pragma unroll
    for (int j = 0; j < kSteps; ++j) {
      uint32_t af[2][4];
#pragma unroll
      for (int r = 0; r < 2; ++r) decode_a<B>(w[r], j, af[r]);
      uint2 bf[2][4];  // [hi, lo][n-tile]
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        const uint2* fj = frag + buf * kFragWords + (j * kNTiles + 4 * wn + n) * 64 + frag_lane(lane, j);
        bf[0][n] = fj[0];
        bf[1][n] = fj[32];
      }
#pragma unroll
      for (int p = 0; p < 2; ++p)  // the hi products, then the lo ones: consecutive mma are independent
#pragma unroll
        for (int n = 0; n < 4; ++n)
#pragma unroll
          for (int r = 0; r < 2; ++r) mma_bf16(c[r][n], af[r], bf[p][n]);
      if (((j + 1) & (seg_steps - 1)) == 0) {  // end of a segment: the Sx term; end of a group: the C term too
        const bool group_end = ((st * kSteps + j + 1) & (group_steps - 1)) == 0;
        const int q = (16 * j) >> a.group_log2;  // the group among the slot's meta (0 unless group 32)
        float2 sxv[4];
#pragma unroll
        for (int n = 0; n < 4; ++n)
          sxv[n] = *reinterpret_cast<const float2*>(sx + buf * kSxFloats + (j / seg_steps) * kTileTokens + 32 * wn +
                                                    8 * n + 2 * t);
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int e0 = (2 * wr + r) * kMetaTileWords + ((q * 16 + g + 8 * h) * a.meta_stride + a.meta_offset);
            float s, b;
            if (a.meta_f32) {
              s = __uint_as_float(ms[e0]), b = __uint_as_float(ms[e0 + 1]);
            } else {
              const uint32_t pair = ms[e0];
              s = __uint_as_float(pair << 16), b = __uint_as_float(pair & 0xFFFF0000u);
            }
            const float sk = kCodeScale<B> * s, bias = fmaf(-2.0f, sk, b);
#pragma unroll
            for (int n = 0; n < 4; ++n)
#pragma unroll
              for (int e2 = 0; e2 < 2; ++e2) {
                float v = fmaf(bias, e2 ? sxv[n].y : sxv[n].x, acc[r][n][2 * h + e2]);
                if (group_end) v = fmaf(sk, c[r][n][2 * h + e2], v);
                acc[r][n][2 * h + e2] = v;
              }
          }
        if (group_end)
#pragma unroll
          for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int n = 0; n < 4; ++n)
#pragma unroll
              for (int e = 0; e < 4; ++e) c[r][n][e] = 0.0f;
      }
    }
  };

  // Iteration ls: wait for stage ls + 1's copies; one barrier (stage ls's fragments are complete, every read of
  // stage ls - 1's slot and buffer is done); copy stage ls + 2 into that slot, convert stage ls + 1 into the other
  // buffer, compute stage ls.
  issue(0);
  issue(1);
  cp_async_wait<1>();
  __syncthreads();
  if (nst > 0) convert(0, 0);
  for (int ls = 0; ls < nst; ++ls) {
    cp_async_wait<0>();
    __syncthreads();
    issue(ls + 2);
    if (ls + 1 < nst) convert((ls + 1) % kSlots, (ls + 1) % 2);
    if (warp_valid) compute(ls, ls % 2);
  }
  cp_async_wait<0>();
  __syncthreads();

  // The block's partial tile [token][row], then each rank of the cluster adds its share of it over the ranks.
  float* const part = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        part[(32 * wn + 8 * n + 2 * t + (e & 1)) * kPartialStride + 32 * wr + 16 * r + g + 8 * (e >> 1)] = acc[r][n][e];
  cluster_sync();
  const int ranks = gridDim.x, share = kTileTokens * kTileRows / ranks;
  for (int idx = threadIdx.x; idx < share; idx += kThreads) {
    const int el = split * share + idx, n = el / kTileRows, row = el % kTileRows;
    const int64_t out_row = tile0 * 16 + row;
    if (n >= tokens || out_row >= a.rows) continue;
    float s = 0.0f;
    for (int rk = 0; rk < ranks; ++rk) s += cluster_partial(part, rk)[n * kPartialStride + row];
    float* dst = y + (tok0 + n) * a.rows + out_row;
    *dst = a.accumulate ? *dst + s : s;
  }
  cluster_sync();  // no block leaves while others read its partial tile
}

// A launch configuration with a cluster of `split` blocks along x (none before sm_90, where split is 1).
struct LaunchConfig {
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute cluster[1] = {};
  LaunchConfig(dim3 grid, int split, bool clusters, CUstream_st* s) {
    cfg.gridDim = grid;
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = kSmemBytes;
    cfg.stream = s;
    cluster[0].id = cudaLaunchAttributeClusterDimension;
    cluster[0].val.clusterDim.x = static_cast<unsigned>(split);
    cluster[0].val.clusterDim.y = 1;
    cluster[0].val.clusterDim.z = 1;
    cfg.attrs = cluster;
    cfg.numAttrs = clusters ? 1 : 0;
  }
};

template <int B>
void launch_bits(GemmArgs a, const float* x, int64_t m, float* y, CUstream_st* s) {
  // Blocks resident at once per cluster size 1, 2, 4, 8 (clusters are placed within a GPC, so fewer than the SMs
  // times the blocks per SM may fit).
  struct Device {
    bool clusters = false;
    int64_t resident[kSplits] = {1, 1, 1, 1};
    Device() {
      int dev = 0, sms = 0, major = 0, blocks_per_sm = 1;
      cudaGetDevice(&dev);
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
      cudaFuncSetAttribute(affine_gemm_kernel<B>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, affine_gemm_kernel<B>, kThreads, kSmemBytes);
      resident[0] = static_cast<int64_t>(sms) * std::max(blocks_per_sm, 1);
      clusters = major >= 9;
      for (int i = 1; i < kSplits && clusters; ++i) {
        LaunchConfig lc(dim3(1u << i), 1 << i, true, nullptr);
        int count = 0;
        if (cudaOccupancyMaxActiveClusters(&count, affine_gemm_kernel<B>, &lc.cfg) != cudaSuccess) {
          count = 0;
          cudaGetLastError();  // a failed query leaves the small estimate, not an error for the next check
        }
        resident[i] = std::max<int64_t>(count, 1) << i;
      }
    }
  };
  static const Device dev;
  const int64_t row_blocks = (a.row_tiles + kRowTiles - 1) / kRowTiles;
  const int64_t stages = a.kblocks * (256 / B) / kStageCols;
  const int64_t group_stages = std::max(1, (1 << a.group_log2) / kStageCols);  // a K share is whole groups
  for (int64_t t0 = 0; t0 < m; t0 += kMaxTokenBlocks * kTileTokens) {
    const int64_t part = std::min(m - t0, kMaxTokenBlocks * kTileTokens);
    const int64_t token_blocks = (part + kTileTokens - 1) / kTileTokens;
    // Split K over a cluster where that shortens the critical path: waves of resident blocks x stages per share
    // (shares of at least 8 stages; the smaller split on a tie).
    int split = 1, stages_per_split = 0;
    int64_t best = -1;
    for (int i = 0; i < kSplits && (i == 0 || dev.clusters); ++i) {
      const int sp = 1 << i;
      if (i > 0 && stages < 8 * sp) break;
      const int64_t share = ((stages + sp - 1) / sp + group_stages - 1) / group_stages * group_stages;
      const int64_t waves = (row_blocks * token_blocks * sp + dev.resident[i] - 1) / dev.resident[i];
      if (best < 0 || waves * share < best) {
        best = waves * share;
        split = sp;
        stages_per_split = static_cast<int>(share);
      }
    }
    a.stages_per_split = stages_per_split;
    a.m = part;
    LaunchConfig lc(dim3(static_cast<unsigned>(split), static_cast<unsigned>(row_blocks), static_cast<unsigned>(token_blocks)),
                    split, dev.clusters, s);
    cudaLaunchKernelEx(&lc.cfg, affine_gemm_kernel<B>, a, x + t0 * a.cols, y + t0 * a.rows);
  }
}

int log2_of(int v) {
  int l = 0;
  while ((1 << l) < v) ++l;
  return l;
}

bool x_vector(const float* x, int64_t cols) { return cols % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0; }

}  // namespace

void launch_affine_gemm_kernel(const AffineMmaDevice& w, const float* x, int64_t m, float* y, CUstream_st* s) {
  const int64_t kpad = w.kblocks * mma_kblock_cols(w.bits);
  const GemmArgs a{w.codes, w.meta, w.rows, w.cols, w.row_tiles, w.kblocks, kpad / w.group, m, log2_of(w.group),
                   w.meta_f32 ? 2 : 1, 0, w.meta_f32, x_vector(x, w.cols), false, 0};
  if (w.bits == 2) return launch_bits<2>(a, x, m, y, s);
  launch_bits<4>(a, x, m, y, s);
}

// One pass per plane, the residual's adding to the base's outputs.
void launch_two_plane_gemm_kernel(const TwoPlaneDevice& w, const float* x, int64_t m, float* y, CUstream_st* s) {
  const int stride = w.meta_f32 ? 4 : 2;
  GemmArgs a{w.base, w.meta, w.rows, w.cols, w.row_tiles, w.kblocks, w.kblocks, m, 7,
             stride, 0, w.meta_f32, x_vector(x, w.cols), false, 0};
  launch_bits<2>(a, x, m, y, s);
  a.codes = w.residual;
  a.meta_offset = stride / 2;
  a.accumulate = true;
  launch_bits<2>(a, x, m, y, s);
}

}  // namespace lowbit::kernels::cuda
