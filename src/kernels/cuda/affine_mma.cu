// Affine 2/4-bit decode matmul on tensor cores, batch 1..16 (layout: AffineMmaDevice in matvec.h).
//
// A warp owns two 16-row tiles and a share of the k-blocks; the block's warps split K and add their partial
// sums in shared memory at the end. Per k16 step a lane turns its code word into mma A fragments with one
// shift and one LOP3 per register pair (the code q under the exponent of the bf16 128.0 gives exactly 128 + q),
// builds the B fragments (activations split into bf16 hi + lo, so the products keep f32 accuracy) once for both
// tiles, and issues one mma.sync m16n8k16 per tile and 8-column n-tile, plus one with an all-ones A that yields
// the group's activation sums in the accumulator layout. Per group segment, with C = sum (128 + q) x and
// Sx = sum x:  sum (s q + b) x = s C + (b - 128 s) Sx.
// Batch 1..4 fits one n-tile (columns 0-3 hi, 4-7 lo), so a batch-1 call costs the same tensor-core work as a
// batch-4 one; 8 and 16 take 2 and 4 n-tiles. The weights are read once, 16 bytes per lane per load.
#include <cuda_bf16.h>

#include "kernels/cuda/matvec.cuh"

namespace lowbit::kernels::cuda {
namespace {

constexpr int kTiles = kMmaRows / 16;
constexpr int kMaxWarps = 16;
constexpr uint32_t kOnes = 0x3F803F80u;  // bf16 pair (1, 1)

__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// (hi, lo) bf16 pairs with hi + lo = (f0, f1) to within 2^-17 relative.
__device__ __forceinline__ void split_pair(float f0, float f1, uint32_t& hi, uint32_t& lo) {
  hi = pack_bf16(f0, f1);
  lo = pack_bf16(f0 - __uint_as_float(hi << 16), f1 - __uint_as_float(hi & 0xFFFF0000u));
}

// A fragment register i of k16 step j from the lane's 16 bytes (matvec.h): bf16 pairs 128 + q.
template <int B>
__device__ __forceinline__ void decode_a(const uint32_t (&w)[4], int j, uint32_t (&a)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (B == 4) {
      a[i] = ((w[j] >> (4 * i)) & 0x000F000Fu) | 0x43004300u;
    } else {
      a[i] = ((w[j / 2] >> (2 * (4 * (j % 2) + i))) & 0x00030003u) | 0x43004300u;
    }
  }
}

struct MmaArgs {
  const uint4* codes;
  const uint32_t* meta;
  int64_t rows, cols, kblocks, groups;  // groups per padded row
  int group_log2;
  bool meta_f32;
};

// Batch width W (4, 8 or 16): n-tiles NT and source activation rows per lane NS.
template <int W>
struct Batch {
  static constexpr int NT = W == 4 ? 1 : W / 4;
  static constexpr int NS = W == 4 ? 1 : W / 8;
};

// k-blocks per stage (two stages in flight): as many as the 128 registers hold.
template <int B, int W>
constexpr int unroll() {
  return W == 4 && B == 4 ? 2 : 1;
}

// B fragments of k16 step at column k0 for every n-tile.
template <int W>
__device__ __forceinline__ void load_b(const float* __restrict__ x, int64_t cols, int m, int64_t k0, int g, int t,
                                       uint32_t (&b)[Batch<W>::NT][2]) {
  constexpr int NS = Batch<W>::NS;
  const bool vector = cols % 2 == 0 && k0 + 16 <= cols;
#pragma unroll
  for (int s = 0; s < NS; ++s) {
    const int src = W == 4 ? (g & 3) : g + 8 * s;
    float f[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (src < m) {
      const float* xr = x + src * cols + k0 + 2 * t;
      if (vector) {
        const float2 v0 = __ldg(reinterpret_cast<const float2*>(xr));
        const float2 v1 = __ldg(reinterpret_cast<const float2*>(xr + 8));
        f[0] = v0.x, f[1] = v0.y, f[2] = v1.x, f[3] = v1.y;
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int64_t k = k0 + 2 * t + (e & 1) + 8 * (e >> 1);
          if (k < cols) f[e] = __ldg(xr + (e & 1) + 8 * (e >> 1));
        }
      }
    }
    uint32_t hi[2], lo[2];
    split_pair(f[0], f[1], hi[0], lo[0]);
    split_pair(f[2], f[3], hi[1], lo[1]);
    if constexpr (W == 4) {
      const bool part_lo = g >= 4;
      b[0][0] = part_lo ? lo[0] : hi[0];
      b[0][1] = part_lo ? lo[1] : hi[1];
    } else {
      b[s][0] = hi[0], b[s][1] = hi[1];
      b[NS + s][0] = lo[0], b[NS + s][1] = lo[1];
    }
  }
}

// The (scale, bias) entries of the groups a k-block touches, [segs][16 rows] consecutive in the meta array,
// spread over the lanes (entry e in lane e % 32, register e / 32) and loaded together with the codes, so no
// dependent load waits inside the decode loop; f32 meta takes two words per entry.
template <int B>
struct BlockMeta {
  static constexpr int kRegs = B == 2 ? 2 : 1;  // 128 / 32 groups x 16 rows / 32 lanes at most
  uint2 v[kRegs];

  __device__ void load(const MmaArgs& a, int64_t tile, int64_t kb, int lane) {
    constexpr int KB = 256 / B;
    const int64_t first = (kb * KB) >> a.group_log2;
    const int entries = 16 * (KB > (1 << a.group_log2) ? KB >> a.group_log2 : 1);
    const int64_t base = (tile * a.groups + first) * 16;
#pragma unroll
    for (int r = 0; r < kRegs; ++r) {
      const int e = 32 * r + lane;
      if (e >= entries) continue;
      if (a.meta_f32) {
        v[r] = __ldg(reinterpret_cast<const uint2*>(a.meta) + base + e);
      } else {
        v[r].x = __ldg(a.meta + base + e);
      }
    }
  }

  // (scale, bias - 128 scale) of row `row` (0..15) in segment `seg` of the k-block; all lanes call it.
  __device__ float2 get(const MmaArgs& a, int seg, int row) const {
    const int e = 16 * seg + row;
    const uint2 mine = kRegs == 2 && e >= 32 ? v[kRegs - 1] : v[0];
    float s, b;
    if (a.meta_f32) {
      s = __uint_as_float(__shfl_sync(0xFFFFFFFFu, mine.x, e % 32));
      b = __uint_as_float(__shfl_sync(0xFFFFFFFFu, mine.y, e % 32));
    } else {
      const uint32_t pair = __shfl_sync(0xFFFFFFFFu, mine.x, e % 32);
      s = __uint_as_float(pair << 16), b = __uint_as_float(pair & 0xFFFF0000u);
    }
    return {s, fmaf(-128.0f, s, b)};
  }
};

// The codes and meta of U consecutive k-blocks for the warp's tiles: one set of loads in flight.
template <int B, int U>
struct Stage {
  uint32_t w[U][kTiles][4];
  BlockMeta<B> meta[U][kTiles];

  __device__ void load(const MmaArgs& a, int64_t tile0, int64_t kb0, int lane) {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int r = 0; r < kTiles; ++r) {
        if (kb0 + u < a.kblocks) {
          load_stream(reinterpret_cast<const uint32_t*>(a.codes + ((tile0 + r) * a.kblocks + kb0 + u) * 32 + lane), w[u][r]);
          meta[u][r].load(a, tile0 + r, kb0 + u, lane);
        }
      }
  }
};

// Pulls the activations of a stage's k-blocks into L1 (128-byte lines, at most 64 per stage: W rows x 4 lines)
// one stage ahead: a warp's K share is its own, so without this most x loads would wait on L2 in the decode.
template <int B, int W, int U>
__device__ __forceinline__ void prefetch_x(const MmaArgs& a, const float* x, int m, int64_t kb0, int lane) {
  constexpr int kLines = U * (256 / B) / 32;  // 128-byte lines per activation row and stage
  static_assert(kLines * W <= 64);
  const int64_t k0 = kb0 * (256 / B);
#pragma unroll
  for (int l = lane; l < kLines * W; l += 32) {
    const int row = l / kLines;
    const int64_t k = k0 + 32 * (l % kLines);
    if (row < m && k < a.cols) asm volatile("prefetch.global.L1 [%0];" ::"l"(x + row * a.cols + k));
  }
}

// acc += the stage's k-blocks times x, for both tiles and every n-tile.
template <int B, int W, int U>
__device__ __forceinline__ void compute_stage(const MmaArgs& a, const Stage<B, U>& st, int64_t kb0,
                                              const float* __restrict__ x, int m, int g, int t, int seg_log2,
                                              float (&acc)[kTiles][Batch<W>::NT][4]) {
  constexpr int NT = Batch<W>::NT;
  constexpr int S = 16 / B;   // k16 steps per k-block
  constexpr int KB = 16 * S;  // columns per k-block
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (kb0 + u >= a.kblocks) break;
    float c[kTiles][NT][4], sx[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        sx[n][e] = 0.0f;
#pragma unroll
        for (int r = 0; r < kTiles; ++r) c[r][n][e] = 0.0f;
      }
#pragma unroll
    for (int j = 0; j < S; ++j) {
      const int64_t k0 = (kb0 + u) * KB + 16 * j;
      uint32_t bf[NT][2];
      load_b<W>(x, a.cols, m, k0, g, t, bf);
      const uint32_t ones[4] = {kOnes, kOnes, kOnes, kOnes};
#pragma unroll
      for (int n = 0; n < NT; ++n) mma_bf16(sx[n], ones, bf[n]);
#pragma unroll
      for (int r = 0; r < kTiles; ++r) {
        uint32_t af[4];
        decode_a<B>(st.w[u][r], j, af);
#pragma unroll
        for (int n = 0; n < NT; ++n) mma_bf16(c[r][n], af, bf[n]);
      }
      if (((j + 1) & ((1 << seg_log2) - 1)) == 0) {  // end of a group segment: scale and clear
        const int seg = j >> seg_log2;
#pragma unroll
        for (int r = 0; r < kTiles; ++r) {
          const float2 m0 = st.meta[u][r].get(a, seg, g), m1 = st.meta[u][r].get(a, seg, g + 8);
#pragma unroll
          for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const float2 mm = e < 2 ? m0 : m1;
              acc[r][n][e] = fmaf(mm.x, c[r][n][e], fmaf(mm.y, sx[n][e], acc[r][n][e]));
              c[r][n][e] = 0.0f;
            }
        }
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) sx[n][e] = 0.0f;
      }
    }
  }
}

template <int B, int W>
__global__ void __launch_bounds__(kMaxWarps * 32, 1)
    affine_mma_kernel(MmaArgs a, const float* __restrict__ x, int m, float* __restrict__ y) {
  using Bt = Batch<W>;
  constexpr int NT = Bt::NT, U = unroll<B, W>();
  constexpr int KB_LOG2 = B == 2 ? 7 : 6;  // log2 of the k-block's 256 / B columns
  const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int64_t tile0 = static_cast<int64_t>(blockIdx.x) * kTiles;
  const int seg_log2 = (a.group_log2 < KB_LOG2 ? a.group_log2 : KB_LOG2) - 4;  // log2 k16 steps per group segment

  float acc[kTiles][NT][4];
#pragma unroll
  for (int r = 0; r < kTiles; ++r)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[r][n][e] = 0.0f;

  const int64_t stride = static_cast<int64_t>(warps) * U;
  // Two stages: the next stage's loads are in flight while this one decodes.
  Stage<B, U> cur, nxt;
  int64_t kb0 = static_cast<int64_t>(warp) * U;
  if (kb0 < a.kblocks) {
    cur.load(a, tile0, kb0, lane);
    prefetch_x<B, W, U>(a, x, m, kb0, lane);
  }
  for (; kb0 < a.kblocks; kb0 += stride) {
    if (kb0 + stride < a.kblocks) {
      nxt.load(a, tile0, kb0 + stride, lane);
      prefetch_x<B, W, U>(a, x, m, kb0 + stride, lane);
    }
    compute_stage<B, W, U>(a, cur, kb0, x, m, g, t, seg_log2, acc);
    cur = nxt;
  }

  // hi + lo parts, then the warps' K shares through shared memory.
  __shared__ float partial[kMaxWarps][kMmaRows][W];
#pragma unroll
  for (int r = 0; r < kTiles; ++r)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = 16 * r + g + 8 * (e >> 1);
      if constexpr (W == 4) {
        const float v = acc[r][0][e] + __shfl_xor_sync(0xFFFFFFFFu, acc[r][0][e], 2);
        if (t < 2) partial[warp][row][2 * t + (e & 1)] = v;
      } else {
#pragma unroll
        for (int s = 0; s < Bt::NS; ++s) partial[warp][row][8 * s + 2 * t + (e & 1)] = acc[r][s][e] + acc[r][Bt::NS + s][e];
      }
    }
  __syncthreads();
  for (int idx = threadIdx.x; idx < kMmaRows * W; idx += blockDim.x) {
    const int rr = idx / W, i = idx % W;
    const int64_t row = tile0 * 16 + rr;
    if (i >= m || row >= a.rows) continue;
    float s = 0.0f;
    for (int wp = 0; wp < warps; ++wp) s += partial[wp][rr][i];
    y[i * a.rows + row] = s;
  }
}

template <int B, int W>
void launch_bw(const MmaArgs& a, int64_t row_tiles, const float* x, int m, float* y, CUstream_st* s) {
  const int64_t blocks = row_tiles / kTiles;
  // Few row pairs (e.g. 4096 rows): split K over more warps so that enough loads are in flight per SM.
  const int warps = blocks < 264 ? kMaxWarps : kMaxWarps / 2;
  affine_mma_kernel<B, W><<<static_cast<unsigned>(blocks), warps * 32, 0, s>>>(a, x, m, y);
}

template <int B>
void launch_b(const MmaArgs& a, int64_t row_tiles, const float* x, int m, int batch, float* y, CUstream_st* s) {
  if (batch <= 4) return launch_bw<B, 4>(a, row_tiles, x, m, y, s);
  if (batch <= 8) return launch_bw<B, 8>(a, row_tiles, x, m, y, s);
  launch_bw<B, 16>(a, row_tiles, x, m, y, s);
}

}  // namespace

void launch_affine_mma_kernel(const AffineMmaDevice& w, const float* x, int m, int batch, float* y, CUstream_st* s) {
  int log2 = 0;
  while ((1 << log2) < w.group) ++log2;
  const int64_t kpad = w.kblocks * mma_kblock_cols(w.bits);
  const MmaArgs a{reinterpret_cast<const uint4*>(w.codes), w.meta, w.rows, w.cols, w.kblocks, kpad / w.group, log2, w.meta_f32};
  if (w.bits == 2) return launch_b<2>(a, w.row_tiles, x, m, batch, y, s);
  launch_b<4>(a, w.row_tiles, x, m, batch, y, s);
}

}  // namespace lowbit::kernels::cuda
