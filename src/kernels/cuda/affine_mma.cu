// Affine 2/4-bit decode matmul on tensor cores, batch 1..16 (layout: AffineMmaDevice in matvec.h).
//
// A block of kBlockWarps warps owns kBlockRows rows (each warp two 16-row tiles) and one contiguous share of
// the k-blocks; when there are too few row blocks to fill the GPU, K is split over a cluster of up to 8 blocks
// that add their partial sums through distributed shared memory at the end. The block walks its K share in
// stages of KC columns through a ring of P shared-memory slots filled by cp.async, P - 1 stages ahead: each
// lane copies its own 16-byte code words (and the warp its group meta), the block the stage's activations, so
// the weights stream at full depth while registers hold only one stage's fragments.
//
// Per stage the block turns the activations into mma B fragments once, for all its warps: x is split into bf16
// hi + lo parts (x = hi + lo within 2^-17 relative, so the products keep f32 accuracy) and the group sums
// Sx = sum (hi + lo) go to shared memory beside them. Per k16 step a lane turns its code word into A fragments
// with one shift and one LOP3 per register pair (the code q in the top mantissa bits of the bf16 2.0 gives
// exactly 2 + q / K, K = 8 for 4 bits and 2 for 2 bits) and issues one mma.sync m16n8k16 per tile and n-tile;
// per group, with C = sum (2 + q / K) x,
//   sum (s q + b) x = s K C + (b - 2 s K) Sx.
// The offset 2 keeps the cancellation of the Sx terms small (an offset of 128 cost 2-bit rows about 2e-5 relative
// error from f32 accumulation alone).
// Batch 1..4 fits one n-tile (columns 0-3 hi, 4-7 lo); 8 and 16 take 2 and 4 (hi tiles, then lo tiles).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cluster.cuh"
#include "grouped.cuh"
#include "matvec.h"
#include "mma.cuh"

namespace lowbit::kernels::cuda {
namespace {

constexpr int kBlockWarps = 4;
constexpr int kBlockThreads = kBlockWarps * 32;
constexpr int kBlockTiles = kBlockWarps * kMmaRows / 16;
constexpr int kBlockRows = kBlockWarps * kMmaRows;
constexpr int kMaxSplit = 8;  // the portable cluster size

// Per bit width B and batch width W (4, 8 or 16).
template <int B, int W>
struct Config {
  static constexpr int NT = W == 4 ? 1 : W / 4;   // n-tiles: hi and lo parts of W activation rows
  static constexpr int NA = W == 16 ? 2 : 1;      // accumulator n-tiles (hi + lo added per group)
  static constexpr int KC = W == 16 ? 128 : 256;  // columns per stage
  static constexpr int P = W == 16 ? 4 : 3;       // ring slots
  static constexpr int KBS = KC * B / 256;        // k-blocks per stage
  static constexpr int SB = 16 / B;               // k16 steps per k-block
  static constexpr int S = KC / 16;               // k16 steps per stage
  static constexpr int kCodeWords = KBS * 2 * 32;  // uint4 per warp and slot
  static constexpr int kItems = S * W * 4 / kBlockThreads;  // conversion items per thread
  // Shared-memory layout: codes, activations, fragments, group sums, partial sums, then the meta slots.
  static constexpr int kCodesOff = 0;
  static constexpr int kXOff = kCodesOff + P * kBlockWarps * kCodeWords * 16;
  static constexpr int kFragOff = kXOff + P * W * KC * 4;
  static constexpr int kSxOff = kFragOff + S * NT * 32 * 8;
  static constexpr int kPartialOff = kSxOff + KC / 32 * W * 4;
  static constexpr int kMetaOff = kPartialOff + kBlockRows * W * 4;
  static constexpr int kMaxMetaSlotWords = 2 * (KC / 32) * 16 * 2;
  static constexpr int kMaxBytes = kMetaOff + P * kBlockWarps * kMaxMetaSlotWords * 4;
};

struct MmaArgs {
  const uint4* codes;
  const uint32_t* meta;
  int64_t rows, cols, row_tiles, kblocks, groups;  // groups per padded row
  int group_log2;
  bool meta_f32;
  bool x_vector;          // x rows are 16-byte aligned: 16-byte copies
  int stages_per_split;   // stages of each block's K share
  int meta_slot_words;    // meta words per warp and slot: 2 tiles x groups per stage x 16 rows
};

// (K scale, bias - 2 K scale) of row `row` (0..15) of tile r, group q of the stage.
template <int B>
__device__ __forceinline__ float2 meta_get(const MmaArgs& a, const uint32_t* ms, int groups_per_stage, int r, int q,
                                           int row) {
  const int e = (r * groups_per_stage + q) * 16 + row;
  float s, b;
  if (a.meta_f32) {
    s = __uint_as_float(ms[2 * e]), b = __uint_as_float(ms[2 * e + 1]);
  } else {
    const uint32_t pair = ms[e];
    s = __uint_as_float(pair << 16), b = __uint_as_float(pair & 0xFFFF0000u);
  }
  const float sk = kCodeScale<B> * s;
  return {sk, fmaf(-2.0f, sk, b)};
}

// G: a grouped expert launch (matvec.h: ExpertGroups), block z multiplying its group's rows by its expert.
template <int B, int W, bool G>
__global__ void __launch_bounds__(kBlockThreads)
    affine_mma_kernel(MmaArgs a, ExpertGroups groups, const float* __restrict__ x, int m, float* __restrict__ y) {
  using C = Config<B, W>;
  const int32_t* x_rows = nullptr;
  if constexpr (G) {
    const BlockGroup bg = group_of_block(groups);
    if (bg.count == 0) return;
    x_rows = bg.x_rows;
    if (!x_rows) x += bg.start * a.cols;
    y += bg.start * a.rows;
    m = bg.count;
    a.codes = static_cast<const uint4*>(bg.w.codes);
    a.meta = bg.w.meta;
  }
  constexpr int NT = C::NT, NA = C::NA, KC = C::KC, P = C::P, S = C::S;
  extern __shared__ __align__(16) unsigned char smem[];
  uint4* const codes_s = reinterpret_cast<uint4*>(smem + C::kCodesOff);
  float* const xs = reinterpret_cast<float*>(smem + C::kXOff);
  uint2* const frag = reinterpret_cast<uint2*>(smem + C::kFragOff);
  float* const sx = reinterpret_cast<float*>(smem + C::kSxOff);
  float* const partial = reinterpret_cast<float*>(smem + C::kPartialOff);
  uint32_t* const meta_s = reinterpret_cast<uint32_t*>(smem + C::kMetaOff);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int split = blockIdx.x;  // rank in the cluster
  const int64_t tile0 = (static_cast<int64_t>(blockIdx.y) * kBlockWarps + warp) * 2;
  const bool tiles_valid = tile0 < a.row_tiles;
  const int64_t total_stages = (a.kblocks + C::KBS - 1) / C::KBS;
  const int64_t st0 = static_cast<int64_t>(split) * a.stages_per_split;
  const int nst = static_cast<int>(min(static_cast<int64_t>(a.stages_per_split), max(total_stages - st0, int64_t{0})));
  const int gps = KC >> a.group_log2;                 // groups per stage
  const int seg_mask = (1 << (a.group_log2 - 4)) - 1;  // k16 steps per group - 1
  const int mw = a.meta_f32 ? 2 : 1;
  const int xrows = min(m, W);

  // Copies of local stage ls into its ring slot; one commit group per stage (empty past the end).
  auto issue = [&](int ls) {
    if (ls < nst) {
      const int slot = ls % P;
      const int64_t st = st0 + ls, kb0 = st * C::KBS;
      if (tiles_valid) {
        uint4* dst = codes_s + (slot * kBlockWarps + warp) * C::kCodeWords;
#pragma unroll
        for (int kbl = 0; kbl < C::KBS; ++kbl)
#pragma unroll
          for (int r = 0; r < 2; ++r)
            if (kb0 + kbl < a.kblocks)
              cp_async16(dst + (kbl * 2 + r) * 32 + lane, a.codes + ((tile0 + r) * a.kblocks + kb0 + kbl) * 32 + lane);
        const int64_t g0 = st * gps;
        const int chunks = static_cast<int>(min(static_cast<int64_t>(gps), a.groups - g0)) * 4 * mw;  // 16 bytes
        uint32_t* mdst = meta_s + (slot * kBlockWarps + warp) * a.meta_slot_words;
        for (int c = lane; c < 2 * chunks; c += 32) {
          const int r = c / chunks, cc = c % chunks;
          cp_async16(mdst + r * gps * 16 * mw + 4 * cc, a.meta + ((tile0 + r) * a.groups + g0) * 16 * mw + 4 * cc);
        }
      }
      float* xdst = xs + slot * W * KC;
      const int64_t k0 = st * KC;
      if (a.x_vector) {
        for (int c = threadIdx.x; c < xrows * (KC / 4); c += kBlockThreads) {
          const int row = c / (KC / 4), col = 4 * (c % (KC / 4));
          const int64_t left = a.cols - (k0 + col);
          const int bytes = left >= 4 ? 16 : left > 0 ? static_cast<int>(4 * left) : 0;
          cp_async16(xdst + row * KC + col, bytes > 0 ? group_x_row(x, x_rows, row, a.cols) + k0 + col : x, bytes);
        }
      } else {
        for (int c = threadIdx.x; c < xrows * KC; c += kBlockThreads) {
          const int row = c / KC, col = c % KC;
          const bool in = k0 + col < a.cols;
          cp_async4(xdst + row * KC + col, in ? group_x_row(x, x_rows, row, a.cols) + k0 + col : x, in ? 4 : 0);
        }
      }
    }
    cp_async_commit();
  };

  // The stage's activations (slot) as B fragments and group sums. Item (row, step j, t): columns
  // 16 j + 2 t + {0, 1, 8, 9}; a warp's 32 items are one row's 8 consecutive steps, so a group's items are
  // G / 4 consecutive lanes.
  auto convert = [&](int slot) {
    const float* xsrc = xs + slot * W * KC;
#pragma unroll
    for (int i = 0; i < C::kItems; ++i) {
      const int q = i * kBlockThreads + threadIdx.x;
      const int tt = q & 3, j = (q >> 2) % S, row = (q >> 2) / S;
      float2 v0 = {0.0f, 0.0f}, v1 = {0.0f, 0.0f};
      if (row < m) {
        v0 = *reinterpret_cast<const float2*>(xsrc + row * KC + 16 * j + 2 * tt);
        v1 = *reinterpret_cast<const float2*>(xsrc + row * KC + 16 * j + 2 * tt + 8);
      }
      uint32_t hi[2], lo[2];
      float sum = split_pair(v0.x, v0.y, hi[0], lo[0]) + split_pair(v1.x, v1.y, hi[1], lo[1]);
      int hi_at, lo_at;  // (n-tile, lane) of the hi and lo parts
      if constexpr (W == 4) {
        hi_at = row * 4 + tt, lo_at = (row + 4) * 4 + tt;
      } else if constexpr (W == 8) {
        hi_at = row * 4 + tt, lo_at = 32 + row * 4 + tt;
      } else {
        const int lane_at = (row & 7) * 4 + tt, s = row >> 3;
        hi_at = 32 * s + lane_at, lo_at = 32 * (2 + s) + lane_at;
      }
      uint2* fj = frag + j * NT * 32;
      fj[(hi_at & ~31) + frag_lane(hi_at & 31, j)] = {hi[0], hi[1]};
      fj[(lo_at & ~31) + frag_lane(lo_at & 31, j)] = {lo[0], lo[1]};
      for (int off = 1; off < (1 << (a.group_log2 - 2)); off <<= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, off);
      if ((lane & ((1 << (a.group_log2 - 2)) - 1)) == 0) sx[((16 * j) >> a.group_log2) * W + row] = sum;
    }
  };

  float acc[2][NA][4];
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int n = 0; n < NA; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[r][n][e] = 0.0f;

  // acc += the stage's codes times x for both tiles.
  auto compute = [&](int ls) {
    const int slot = ls % P;
    const int64_t kb0 = (st0 + ls) * C::KBS;
    const uint4* cs = codes_s + (slot * kBlockWarps + warp) * C::kCodeWords;
    const uint32_t* ms = meta_s + (slot * kBlockWarps + warp) * a.meta_slot_words;
    float c[2][NT][4];
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) c[r][n][e] = 0.0f;
#pragma unroll
    for (int kbl = 0; kbl < C::KBS; ++kbl) {
      if (kb0 + kbl >= a.kblocks) break;
      const uint4 w[2] = {cs[kbl * 64 + lane], cs[kbl * 64 + 32 + lane]};
#pragma unroll
      for (int j = 0; j < C::SB; ++j) {
        const int jj = kbl * C::SB + j;
        uint2 bf[NT];
#pragma unroll
        for (int n = 0; n < NT; ++n) bf[n] = frag[(jj * NT + n) * 32 + frag_lane(lane, jj)];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          uint32_t af[4];
          decode_a<B>(w[r], j, af);
#pragma unroll
          for (int n = 0; n < NT; ++n) mma_bf16(c[r][n], af, bf[n]);
        }
        if (((jj + 1) & seg_mask) == 0) {  // end of a group: scale, add the bias term, clear
          const int q = jj >> (a.group_log2 - 4);
          const float* sxq = sx + q * W;
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const float2 m0 = meta_get<B>(a, ms, gps, r, q, g), m1 = meta_get<B>(a, ms, gps, r, q, g + 8);
#pragma unroll
            for (int n = 0; n < NA; ++n)
#pragma unroll
              for (int e = 0; e < 4; ++e) {
                const float2 mm = e < 2 ? m0 : m1;
                float v, sxe;
                if constexpr (W == 4) {
                  v = c[r][0][e], sxe = t < 2 ? sxq[2 * t + (e & 1)] : 0.0f;  // lanes t >= 2 hold lo columns
                } else {
                  v = c[r][n][e] + c[r][NA + n][e], sxe = sxq[8 * n + 2 * t + (e & 1)];
                }
                acc[r][n][e] = fmaf(mm.x, v, fmaf(mm.y, sxe, acc[r][n][e]));
              }
#pragma unroll
            for (int n = 0; n < NT; ++n)
#pragma unroll
              for (int e = 0; e < 4; ++e) c[r][n][e] = 0.0f;
          }
        }
      }
    }
  };

  for (int ls = 0; ls < P - 1; ++ls) issue(ls);
  for (int ls = 0; ls < nst; ++ls) {
    __syncwarp();  // the warp's reads of the slot about to be refilled are done
    issue(ls + P - 1);
    cp_async_wait<P - 1>();
    __syncthreads();
    convert(ls % P);
    __syncthreads();
    if (tiles_valid) compute(ls);
  }
  cp_async_wait<0>();

  // Partial sums [rows][W] (hi + lo columns added for W = 4), then each rank of the cluster adds its share of
  // rows over the ranks.
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = warp * kMmaRows + 16 * r + g + 8 * (e >> 1);
      if constexpr (W == 4) {
        const float v = acc[r][0][e] + __shfl_xor_sync(0xFFFFFFFFu, acc[r][0][e], 2);
        if (t < 2) partial[row * W + 2 * t + (e & 1)] = v;
      } else {
#pragma unroll
        for (int n = 0; n < NA; ++n) partial[row * W + 8 * n + 2 * t + (e & 1)] = acc[r][n][e];
      }
    }
  cluster_sync();
  const int ranks = gridDim.x, share = kBlockRows / ranks;
  for (int idx = threadIdx.x; idx < share * W; idx += kBlockThreads) {
    const int rl = split * share + idx / W, i = idx % W;
    const int64_t row = static_cast<int64_t>(blockIdx.y) * kBlockRows + rl;
    if (i >= m || row >= a.rows) continue;
    float s = 0.0f;
    for (int rk = 0; rk < ranks; ++rk) s += cluster_partial(partial, rk)[rl * W + i];
    y[i * a.rows + row] = s;
  }
  cluster_sync();  // no block leaves while others read its partial sums
}

template <int B, int W, bool G>
void launch_bw(MmaArgs a, const ExpertGroups& g, const float* x, int m, float* y, CUstream_st* s) {
  using C = Config<B, W>;
  struct Device {
    int sms = 0, major = 0, blocks_per_sm = 1;
    Device() {
      int dev = 0;
      cudaGetDevice(&dev);
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
      cudaFuncSetAttribute(affine_mma_kernel<B, W, G>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kMaxBytes);
      // Typical meta (bf16, group 128) sets how many blocks share an SM.
      const int typical = C::kMetaOff + C::P * kBlockWarps * 2 * (C::KC / 128) * 16 * 4;
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, affine_mma_kernel<B, W, G>, kBlockThreads, typical);
      if (blocks_per_sm < 1) blocks_per_sm = 1;
    }
  };
  static const Device dev;
  a.meta_slot_words = 2 * (C::KC >> a.group_log2) * 16 * (a.meta_f32 ? 2 : 1);
  const size_t smem = C::kMetaOff + static_cast<size_t>(C::P) * kBlockWarps * a.meta_slot_words * 4;
  const int64_t row_blocks = (a.row_tiles + kBlockTiles - 1) / kBlockTiles;
  const int64_t layers = G ? g.max_groups : 1;  // grid z: the groups (most of them empty at small batches)
  const int64_t stages = (a.kblocks + C::KBS - 1) / C::KBS;
  // Split K (a cluster per row block) while the blocks still fit the GPU at once and every share has 2 stages.
  int split = 1;
  const int64_t slots = static_cast<int64_t>(dev.sms) * dev.blocks_per_sm;
  if (dev.major >= 9)
    while (split < kMaxSplit && row_blocks * layers * split * 2 <= slots && stages >= 4 * split) split *= 2;
  a.stages_per_split = static_cast<int>((stages + split - 1) / split);

  const ClusterLaunch config(
      dim3(static_cast<unsigned>(split), static_cast<unsigned>(row_blocks), static_cast<unsigned>(layers)),
      kBlockThreads, split, dev.major >= 9, smem, s);
  cudaLaunchKernelEx(&config.cfg, affine_mma_kernel<B, W, G>, a, g, x, m, y);
}

template <int B, bool G>
void launch_b(const MmaArgs& a, const ExpertGroups& g, const float* x, int m, int batch, float* y, CUstream_st* s) {
  if (batch <= 4) return launch_bw<B, 4, G>(a, g, x, m, y, s);
  if (batch <= 8) return launch_bw<B, 8, G>(a, g, x, m, y, s);
  launch_bw<B, 16, G>(a, g, x, m, y, s);
}

MmaArgs mma_args(const AffineMmaDevice& w, const float* x) {
  int log2 = 0;
  while ((1 << log2) < w.group) ++log2;
  const int64_t kpad = w.kblocks * mma_kblock_cols(w.bits);
  const bool x_vector = w.cols % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  return {reinterpret_cast<const uint4*>(w.codes), w.meta, w.rows, w.cols, w.row_tiles, w.kblocks,
          kpad / w.group, log2, w.meta_f32, x_vector, 0, 0};
}

}  // namespace

void launch_affine_mma_kernel(const AffineMmaDevice& w, const float* x, int m, int batch, float* y, CUstream_st* s) {
  const MmaArgs a = mma_args(w, x);
  if (w.bits == 2) return launch_b<2, false>(a, {}, x, m, batch, y, s);
  launch_b<4, false>(a, {}, x, m, batch, y, s);
}

// Every group's x rows start 16-byte aligned when the first does and cols % 4 == 0 (mma_args' x_vector).
void launch_grouped_affine_mma_kernel(const AffineMmaDevice& w, const ExpertGroups& g, const float* x, int batch,
                                      float* y, CUstream_st* s) {
  const MmaArgs a = mma_args(w, x);
  if (w.bits == 2) return launch_b<2, true>(a, g, x, batch, batch, y, s);
  launch_b<4, true>(a, g, x, batch, batch, y, s);
}

}  // namespace lowbit::kernels::cuda
