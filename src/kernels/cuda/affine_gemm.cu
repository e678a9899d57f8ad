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
// The block tiling, activation pipeline, per-group finish and K split are gemm_tile.cuh's (shared with tile_gemm.cu).
#include "gemm.h"
#include "gemm_tile.cuh"

namespace lowbit::kernels::cuda {
namespace {

// Shared memory: the ring (codes, meta, activations per slot), then the B fragments and the segment sums of the
// stage being computed.
constexpr int kCodesBytes = kRowTiles * 32 * 16;  // per slot; 2 bits use half
constexpr int kMetaTileWords = 64;                 // per row tile and slot: 2 groups x 16 rows x 2 words, or 1 x 16 x 4
constexpr int kMetaBytes = kRowTiles * kMetaTileWords * 4;
constexpr int kCodesOff = 0;
constexpr int kMetaOff = kCodesOff + kSlots * kCodesBytes;
constexpr int kXOff = kMetaOff + kSlots * kMetaBytes;
constexpr int kFragOff = kXOff + kSlots * kXBytes;
constexpr int kSxOff = kFragOff + kFragBytes;
constexpr int kSmemBytes = kSxOff + kSxBytes;
static_assert(kPartialBytes <= kFragOff, "the partial tile fits the ring");

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
      copy_x_stage(reinterpret_cast<float*>(smem + kXOff + slot * kXBytes), x, a.cols, tok0, tokens, st * kStageCols,
                   a.x_vector);
    }
    cp_async_commit();
  };

  float acc[2][4][4], c[2][4][4];  // [row tile][n-tile][fragment element]
  zero(acc);
  zero(c);

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
      load_b(frag + buf * kFragWords, j, wn, lane, bf);
      mma_step(c, af, bf);
      finish_segment(j, st, seg_steps, group_steps, a.group_log2, sx + buf * kSxFloats, wn, t, acc, c,
                     [&](int r, int h, int q) {
                       const int e0 =
                           (2 * wr + r) * kMetaTileWords + ((q * 16 + g + 8 * h) * a.meta_stride + a.meta_offset);
                       float s, b;
                       if (a.meta_f32) {
                         s = __uint_as_float(ms[e0]), b = __uint_as_float(ms[e0 + 1]);
                       } else {
                         const uint32_t pair = ms[e0];
                         s = __uint_as_float(pair << 16), b = __uint_as_float(pair & 0xFFFF0000u);
                       }
                       const float sk = kCodeScale<B> * s;  // C sums 2 + q / K: scale K s, bias' b - 2 K s
                       return make_float2(sk, fmaf(-2.0f, sk, b));
                     });
    }
  };

  // Iteration ls: wait for stage ls + 1's copies; one barrier (stage ls's fragments are complete, every read of
  // stage ls - 1's slot and buffer is done); copy stage ls + 2 into that slot, convert stage ls + 1 into the other
  // buffer, compute stage ls.
  issue(0);
  issue(1);
  cp_async_wait<1>();
  __syncthreads();
  if (nst > 0) convert_x_stage(reinterpret_cast<const float*>(smem + kXOff), frag, sx, seg_steps);
  for (int ls = 0; ls < nst; ++ls) {
    cp_async_wait<0>();
    __syncthreads();
    issue(ls + 2);
    if (ls + 1 < nst)
      convert_x_stage(reinterpret_cast<const float*>(smem + kXOff + (ls + 1) % kSlots * kXBytes),
                      frag + (ls + 1) % 2 * kFragWords, sx + (ls + 1) % 2 * kSxFloats, seg_steps);
    if (warp_valid) compute(ls, ls % 2);
  }
  cp_async_wait<0>();
  __syncthreads();

  reduce_tile(reinterpret_cast<float*>(smem), acc, y, a.rows, tile0 * 16, tok0, tokens, a.accumulate);
}

template <int B>
void launch_bits(GemmArgs a, const float* x, int64_t m, float* y, CUstream_st* s) {
  static const ClusterResidency dev(affine_gemm_kernel<B>, kThreads, kSmemBytes);
  const int64_t row_blocks = (a.row_tiles + kRowTiles - 1) / kRowTiles;
  const int64_t stages = a.kblocks * (256 / B) / kStageCols;
  const int64_t group_stages = std::max(1, (1 << a.group_log2) / kStageCols);  // a K share is whole groups
  launch_tiles(affine_gemm_kernel<B>, dev, kSmemBytes, a, row_blocks, stages, group_stages, x, a.cols, m, y, a.rows, s);
}

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
