// Affine 2/4-bit (batch 1) and two-plane (batch 1..4) decode matvec on the CUDA cores, reading the tensor-core layout
// (AffineMmaDevice in matvec.h), so one device copy of the weights serves both kernels.
//
// A block of W warps owns one 16-row tile; its warps split K in stages of 128 columns (two k-blocks of 4 bits,
// one of 2 bits), each warp loading the next stage's codes (and pulling its group meta into L1) while it
// decodes this one. Per stage a lane's 16-byte loads hold 32 columns of rows g and g + 8 (lane 4 g + t; step J
// of the stage covers columns 16 J + 2 t + {0, 1, 8, 9}), so one activation load serves both rows and the
// warp's loads stay contiguous.
//
// Decoding 4 bits costs about 1.4 integer instructions per code: one AND (and one shift) per word isolates the
// low and the high nibbles of every byte, and one PRMT per code moves a byte under the exponent byte 0x43,
// giving the float 128 + q exactly. So F = sum (128 + q) x costs one FFMA per code and batch row, and per group
//   sum (s q + b) x = s F + (b - 128 s) Sx,
// where the block computes the group sums Sx of x once, into shared memory, before its main loop (the lanes'
// F cover a quarter of a group's columns each; the four lanes of a row add to one sum, so one of them adds the
// Sx term). No shuffle until the warps' K shares are added. 2-bit codes become 1 + q / 4 (code2_as_float).
#include "kernels/cuda/matvec.cuh"

namespace lowbit::kernels::cuda {
namespace {

constexpr int kMaxWarps = 16;
constexpr int kStageCols = 128;
constexpr uint32_t kExp128 = 0x43000000u;  // 128.0f: a code q in byte 2 reads as 128 + q

struct FmaArgs {
  const uint32_t* planes[2];  // codes in the tensor-core layout; the second plane only for two-plane tensors
  const uint32_t* meta;       // [row_tiles][groups][16 rows] (matvec.h)
  int64_t rows, cols, kblocks, groups;
  bool meta_f32;
};

// Words per meta entry (one row's group): bf16 pairs take one word per plane, f32 two.
template <int P>
__device__ __forceinline__ int meta_words(const FmaArgs& a) {
  return P * (a.meta_f32 ? 2 : 1);
}

// Byte k of v (a code of at most 7 bits) as the float 128 + v_k.
__device__ __forceinline__ float byte_as_float(uint32_t v, int k) {
  return __uint_as_float(__byte_perm(v, kExp128, 0x7044u | (static_cast<uint32_t>(k) << 8)));
}

// The 2-bit code at bit `bit` of w as the float 1 + q / 4 (the code under the exponent of 1.0, at bits 21-22):
// a shift and a LOP3, but an offset of 4 code units instead of 128 + q's 128, so that the group's cancellation
// F - Sx keeps 2-bit products (rms code 1.9) as accurate as 4-bit ones.
__device__ __forceinline__ float code2_as_float(uint32_t w, int bit) {
  const uint32_t v = bit <= 21 ? w << (21 - bit) : w >> (bit - 21);
  return __uint_as_float((v & 0x00600000u) | 0x3F800000u);
}

// Scale per plane and bias summed over planes, rows g and g + 8 of the tile, for one group.
template <int P>
struct SegMeta {
  float scale[P][2];
  float bias[2];

  __device__ void load(const FmaArgs& a, int64_t tile, int64_t group, int g) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      bias[r] = 0.0f;
#pragma unroll
      for (int p = 0; p < P; ++p) scale[p][r] = 0.0f;
      if (group >= a.groups) continue;
      const int64_t e = (tile * a.groups + group) * 16 + g + 8 * r;
      if (a.meta_f32) {
        if constexpr (P == 1) {
          const uint2 v = __ldg(reinterpret_cast<const uint2*>(a.meta) + e);
          scale[0][r] = __uint_as_float(v.x), bias[r] = __uint_as_float(v.y);
        } else {
          const uint4 v = __ldg(reinterpret_cast<const uint4*>(a.meta) + e);
          scale[0][r] = __uint_as_float(v.x), scale[1][r] = __uint_as_float(v.z);
          bias[r] = __uint_as_float(v.y) + __uint_as_float(v.w);
        }
      } else {
        uint32_t v[P];
        if constexpr (P == 1) {
          v[0] = __ldg(a.meta + e);
        } else {
          const uint2 u = __ldg(reinterpret_cast<const uint2*>(a.meta) + e);
          v[0] = u.x, v[1] = u.y;
        }
#pragma unroll
        for (int p = 0; p < P; ++p) {
          scale[p][r] = __uint_as_float(v[p] << 16);
          bias[r] += __uint_as_float(v[p] & 0xFFFF0000u);
        }
      }
    }
  }
};

// The activations of step J for lane t: columns c + {0, 1, 8, 9} with c = c0 + 16 J + 2 t. Vector: xs[i] points
// at column c0 + 2 t of batch row i and the stage lies inside the row (constant offsets from one address); else
// scalar loads with zeros past `cols`.
template <bool Vector, int M>
__device__ __forceinline__ void load_step_x(const float* const (&xs)[M], int J, int64_t c, int64_t cols,
                                            float (&xv)[M][4]) {
#pragma unroll
  for (int i = 0; i < M; ++i) {
    if constexpr (Vector) {
      const float2 v0 = __ldg(reinterpret_cast<const float2*>(xs[i] + 16 * J));
      const float2 v1 = __ldg(reinterpret_cast<const float2*>(xs[i] + 16 * J + 8));
      xv[i][0] = v0.x, xv[i][1] = v0.y, xv[i][2] = v1.x, xv[i][3] = v1.y;
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t k = c + 16 * J + (e & 1) + 8 * (e >> 1);
        xv[i][e] = k < cols ? __ldg(xs[i] + 16 * J + (e & 1) + 8 * (e >> 1)) : 0.0f;
      }
    }
  }
}

// acc[r][i] (rows g, g + 8; batch row i) += the stage's codes times x. Within a step's word, 4 bits: byte k
// holds column 2 t + {0, 8, 1, 9}[k] of row g (low nibble) and row g + 8 (high nibble); 2 bits (word J / 2):
// byte J % 2 + 2 e holds, in slot c, row g + 8 (c % 2) at column 2 t + 8 (c / 2) + e.
template <bool Vector, int B, int P, int M, int SEGS>
__device__ __forceinline__ void compute_stage(const FmaArgs& a, const uint32_t (&w)[P][B / 2][4], int64_t tile,
                                              int64_t s, const float* const (&xr)[M], const float* group_sx, int g,
                                              int t, float (&acc)[2][M]) {
  constexpr int kSteps = 8 / SEGS;  // k16 steps per group segment
  const int64_t c = s * kStageCols + 2 * t;
  const float* xs[M];
#pragma unroll
  for (int i = 0; i < M; ++i) xs[i] = xr[i] + c;
#pragma unroll
  for (int seg = 0; seg < SEGS; ++seg) {
    const int64_t group = s * SEGS + seg;
    SegMeta<P> meta;
    meta.load(a, tile, group, g);
    float F[P][2][M];
#pragma unroll
    for (int p = 0; p < P; ++p)
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int i = 0; i < M; ++i) F[p][r][i] = 0.0f;
#pragma unroll
    for (int jj = 0; jj < kSteps; ++jj) {
      const int J = seg * kSteps + jj;
      float xv[M][4];
      load_step_x<Vector, M>(xs, J, c, a.cols, xv);
#pragma unroll
      for (int p = 0; p < P; ++p) {
        if constexpr (B == 4) {
          const uint32_t word = w[p][J / 4][J % 4];
          const uint32_t nib[2] = {word & 0x0F0F0F0Fu, (word >> 4) & 0x0F0F0F0Fu};
#pragma unroll
          for (int k = 0; k < 4; ++k)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
              const float f = byte_as_float(nib[r], k);
#pragma unroll
              for (int i = 0; i < M; ++i) F[p][r][i] = fmaf(f, xv[i][(k & 1) * 2 + (k >> 1)], F[p][r][i]);
            }
        } else {
          const uint32_t word = w[p][0][J / 2];
#pragma unroll
          for (int c = 0; c < 4; ++c)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float f = code2_as_float(word, 8 * (J % 2 + 2 * e) + 2 * c);
#pragma unroll
              for (int i = 0; i < M; ++i) F[p][c % 2][i] = fmaf(f, xv[i][2 * (c / 2) + e], F[p][c % 2][i]);
            }
        }
      }
    }
    // F = U^-1 sum q x + O U^-1 Sx: 4 bits U = 1, O = 128 (128 + q); 2 bits U = 4, O = 4 (1 + q / 4).
    constexpr float U = B == 4 ? 1.0f : 4.0f, O = B == 4 ? 128.0f : 4.0f;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float s_sum = 0.0f;
#pragma unroll
      for (int p = 0; p < P; ++p) s_sum += meta.scale[p][r];
      const float d = t == 0 ? fmaf(-O, s_sum, meta.bias[r]) : 0.0f;
#pragma unroll
      for (int i = 0; i < M; ++i) {
        float v = acc[r][i];
#pragma unroll
        for (int p = 0; p < P; ++p) v = fmaf(U * meta.scale[p][r], F[p][r][i], v);
        if (group < a.groups) v = fmaf(d, group_sx[group * M + i], v);
        acc[r][i] = v;
      }
    }
  }
}

// The stage's codes (zeros past the last k-block), B / 2 k-blocks of 16 bytes per lane and plane; its meta
// lines are pulled into L1 so that compute_stage's meta loads wait on L1, not on memory.
template <int B, int P, int SEGS>
__device__ __forceinline__ void load_stage(const FmaArgs& a, int64_t tile, int64_t s, int lane,
                                           uint32_t (&w)[P][B / 2][4]) {
#pragma unroll
  for (int u = 0; u < B / 2; ++u) {
    const int64_t kb = s * (B / 2) + u;
#pragma unroll
    for (int p = 0; p < P; ++p) {
      if (kb < a.kblocks) {
        load_stream(a.planes[p] + ((tile * a.kblocks + kb) * 32 + lane) * 4, w[p][u]);
      } else {
#pragma unroll
        for (int k = 0; k < 4; ++k) w[p][u][k] = 0;
      }
    }
  }
  const int64_t group = s * SEGS, left = a.groups - group, groups = left < SEGS ? left : SEGS;
  const int64_t bytes = groups * 16 * 4 * meta_words<P>(a);
  if (lane * 128 < bytes)
    asm volatile("prefetch.global.L1 [%0];" ::"l"(reinterpret_cast<const char*>(a.meta) +
                                                  (tile * a.groups + group) * 16 * 4 * meta_words<P>(a) + lane * 128));
}

// group_sx [groups][M] = the sums of x over each group's columns: warp w takes 128-column chunks w, w + W, ...;
// lane l sums columns 4 l .. 4 l + 3 and the group's lanes add by shuffle.
template <int M, int SEGS>
__device__ __forceinline__ void group_sums(const FmaArgs& a, const float* const (&xr)[M], float* group_sx, int warp,
                                           int warps, int lane) {
  constexpr int kLanes = 32 / SEGS;  // lanes per group
  const bool aligned = a.cols % 4 == 0;
  for (int64_t c = warp; c * SEGS < a.groups; c += warps) {
    const int64_t col = c * kStageCols + 4 * lane;
#pragma unroll
    for (int i = 0; i < M; ++i) {
      float v = 0.0f;
      if (aligned && col + 4 <= a.cols) {
        const float4 q = __ldg(reinterpret_cast<const float4*>(xr[i] + col));
        v = (q.x + q.y) + (q.z + q.w);
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) v += col + e < a.cols ? __ldg(xr[i] + col + e) : 0.0f;
      }
#pragma unroll
      for (int off = 1; off < kLanes; off *= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, off);
      const int64_t group = c * SEGS + lane / kLanes;
      if (lane % kLanes == 0 && group < a.groups) group_sx[group * M + i] = v;
    }
  }
}

// Batch 1 fits 64 registers (two blocks of 16 warps per SM); wider batches hold M times the activations.
template <int M>
constexpr int fma_min_blocks() {
  return M == 1 ? 2 : 1;
}

template <int B, int P, int M, int SEGS>
__global__ void __launch_bounds__(kMaxWarps * 32, fma_min_blocks<M>())
    affine_fma_kernel(FmaArgs a, const float* __restrict__ x, int m, float* __restrict__ y) {
  extern __shared__ float group_sx[];  // [groups][M]
  __shared__ float partial[kMaxWarps][16][M];
  const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int64_t tile = blockIdx.x;
  const int64_t stages = (a.kblocks + B / 2 - 1) / (B / 2);
  const float* xr[M];
#pragma unroll
  for (int i = 0; i < M; ++i) xr[i] = x + (i < m ? i : 0) * a.cols;
  float acc[2][M];
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int i = 0; i < M; ++i) acc[r][i] = 0.0f;

  // The first stage's loads fly while the block sums x per group; then the next stage's loads are in flight
  // while this one decodes.
  uint32_t cur[P][B / 2][4], nxt[P][B / 2][4];
  int64_t s = warp;
  if (s < stages) load_stage<B, P, SEGS>(a, tile, s, lane, cur);
  group_sums<M, SEGS>(a, xr, group_sx, warp, warps, lane);
  __syncthreads();
  for (; s < stages; s += warps) {
    if (s + warps < stages) load_stage<B, P, SEGS>(a, tile, s + warps, lane, nxt);
    if (a.cols % 2 == 0 && (s + 1) * kStageCols <= a.cols) {
      compute_stage<true, B, P, M, SEGS>(a, cur, tile, s, xr, group_sx, g, t, acc);
    } else {
      compute_stage<false, B, P, M, SEGS>(a, cur, tile, s, xr, group_sx, g, t, acc);
    }
#pragma unroll
    for (int p = 0; p < P; ++p)
#pragma unroll
      for (int u = 0; u < B / 2; ++u)
#pragma unroll
        for (int k = 0; k < 4; ++k) cur[p][u][k] = nxt[p][u][k];
  }

  // Lanes 4 g .. 4 g + 3 share rows g, g + 8; then the warps' K shares through shared memory.
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int i = 0; i < M; ++i) {
      float v = acc[r][i];
      v += __shfl_xor_sync(0xFFFFFFFFu, v, 1);
      v += __shfl_xor_sync(0xFFFFFFFFu, v, 2);
      if (t == 0) partial[warp][g + 8 * r][i] = v;
    }
  __syncthreads();
  for (int idx = threadIdx.x; idx < 16 * M; idx += blockDim.x) {
    const int i = idx / 16, rr = idx % 16;
    const int64_t row = tile * 16 + rr;
    if (i >= m || row >= a.rows) continue;
    float v = 0.0f;
    for (int wp = 0; wp < warps; ++wp) v += partial[wp][rr][i];
    y[i * a.rows + row] = v;
  }
}

// MaxBatch: the widest batch compiled (affine runs only batch 1 here, matvec.h says why).
template <int B, int P, int SEGS, int MaxBatch>
void launch_segs(const FmaArgs& a, int64_t row_tiles, const float* x, int m, int batch, float* y, CUstream_st* s) {
  // Enough stages per warp to keep a load in flight behind the decode; short rows take 8 warps.
  const int64_t stages = (a.kblocks + B / 2 - 1) / (B / 2);
  const int warps = stages >= 8 * kMaxWarps / 2 ? kMaxWarps : kMaxWarps / 2;
  const auto blocks = static_cast<unsigned>(row_tiles);
  const size_t smem = static_cast<size_t>(a.groups) * batch * sizeof(float);
  if constexpr (MaxBatch == 1) {
    affine_fma_kernel<B, P, 1, SEGS><<<blocks, warps * 32, smem, s>>>(a, x, m, y);
  } else {
    switch (batch) {
      case 1: return affine_fma_kernel<B, P, 1, SEGS><<<blocks, warps * 32, smem, s>>>(a, x, m, y);
      case 2: return affine_fma_kernel<B, P, 2, SEGS><<<blocks, warps * 32, smem, s>>>(a, x, m, y);
      default: return affine_fma_kernel<B, P, 4, SEGS><<<blocks, warps * 32, smem, s>>>(a, x, m, y);
    }
  }
}

}  // namespace

void launch_affine_fma_kernel(const AffineMmaDevice& w, const float* x, int m, int batch, float* y, CUstream_st* s) {
  const FmaArgs a{{w.codes, nullptr}, w.meta, w.rows, w.cols, w.kblocks,
                  w.kblocks * mma_kblock_cols(w.bits) / w.group, w.meta_f32};
  const int segs = kStageCols / w.group;
  if (w.bits == 2) {
    if (segs == 1) return launch_segs<2, 1, 1, 1>(a, w.row_tiles, x, m, batch, y, s);
    if (segs == 2) return launch_segs<2, 1, 2, 1>(a, w.row_tiles, x, m, batch, y, s);
    return launch_segs<2, 1, 4, 1>(a, w.row_tiles, x, m, batch, y, s);
  }
  if (segs == 1) return launch_segs<4, 1, 1, 1>(a, w.row_tiles, x, m, batch, y, s);
  if (segs == 2) return launch_segs<4, 1, 2, 1>(a, w.row_tiles, x, m, batch, y, s);
  launch_segs<4, 1, 4, 1>(a, w.row_tiles, x, m, batch, y, s);
}

void launch_two_plane_kernel(const TwoPlaneDevice& w, const float* x, int m, int batch, float* y, CUstream_st* s) {
  const FmaArgs a{{w.base, w.residual}, w.meta, w.rows, w.cols, w.kblocks, w.kblocks, w.meta_f32};
  launch_segs<2, 2, 1, kFmaMaxBatch>(a, w.row_tiles, x, m, batch, y, s);
}

}  // namespace lowbit::kernels::cuda
