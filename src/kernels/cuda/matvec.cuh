// The decode matvec kernel template (batch 1..16), included by the matvec_*.cu files that instantiate it.
// Decode matvec: y [m, rows] = x [m, cols] @ W^T with W read exactly once.
//
// One warp owns R consecutive rows. Its lanes stride over 64-weight chunks of those rows: each lane loads its
// chunk's codes with 16-byte (8-byte for odd bit widths) streaming loads and decodes them in registers; the
// register budget is capped so that enough warps are resident to keep HBM busy. x comes through L1 and is reused
// for the R rows. The warp sums its lanes with shuffles at the end; no shared memory, no atomics.
//
// Affine decoding costs one shift+mask and one FMA per weight: a code q becomes the float 1 + q / 2^b by
// writing it under the exponent of 1.0, so F = sum (1 + q/2^b) x = Sx + Sqx / 2^b, and per group
//   sum (s q + bias) x = s 2^b (F - Sx) + bias Sx,    Sx = sum x over the group.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "grouped.cuh"
#include "matvec.h"

namespace lowbit::kernels::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;

// Streaming loads: the weights are read once, so keep them out of L1 where x lives.
__device__ __forceinline__ void load_stream(const uint32_t* p, uint32_t (&w)[4]) {
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
      : "l"(p));
}
__device__ __forceinline__ void load_stream(const uint32_t* p, uint32_t (&w)[2]) {
  asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(w[0]), "=r"(w[1]) : "l"(p));
}

// Loads `N` consecutive words (16-byte aligned when N % 4 == 0, else 8-byte aligned).
template <int N>
__device__ __forceinline__ void load_words(const uint32_t* p, uint32_t* out) {
  constexpr int kVec = N % 4 == 0 ? 4 : 2;
  static_assert(N % kVec == 0);
#pragma unroll
  for (int i = 0; i < N / kVec; ++i) {
    uint32_t v[kVec];
    load_stream(p + i * kVec, v);
#pragma unroll
    for (int k = 0; k < kVec; ++k) out[i * kVec + k] = v[k];
  }
}

__device__ __forceinline__ float half_to_float(uint32_t bits16, bool is_f16) {
  return is_f16 ? __half2float(__ushort_as_half(static_cast<unsigned short>(bits16))) : __uint_as_float(bits16 << 16);
}

// ---- codecs: how one row's 64-weight chunk is loaded and turned into floats -------------------------------

// Affine, `B` bits, GPC groups per chunk (1 for group >= 64, 2 for group 32, 4 for group 16). The meta type is a
// run-time branch, uniform across the grid: 16-bit (scale, bias) pairs in one word, or f32 pairs in two.
template <int B, int GPC>
struct Affine {
  static constexpr int kWords = 2 * B;  // 64 codes * B bits / 32
  static constexpr int kSegs = GPC;
  struct Args {
    const uint32_t* codes;
    const uint32_t* meta;
    int64_t row_words;
    int64_t row_groups;
    int group_shift;  // log2(group / 64) when GPC == 1
    bool f16;         // 16-bit meta is f16 (else bf16)
    bool f32;         // meta is f32
  };
  struct Chunk {
    uint32_t w[kWords];
    uint32_t meta[2 * GPC];
  };

  __device__ static void load(const Args& a, int64_t row, int c, Chunk& ch) {
    load_words<kWords>(a.codes + row * a.row_words + static_cast<int64_t>(c) * kWords, ch.w);
    const int64_t group = GPC == 1 ? (c >> a.group_shift) : GPC * static_cast<int64_t>(c);
    const int64_t index = row * a.row_groups + group;
    if (a.f32) {
      load_words<2 * GPC>(a.meta + 2 * index, ch.meta);
    } else if constexpr (GPC == 1) {
      ch.meta[0] = __ldg(a.meta + index);
    } else {
      load_words<GPC>(a.meta + index, ch.meta);
    }
  }

  // Weight j (compile-time) of the chunk as 1 + q / 2^B.
  __device__ static __forceinline__ float value(const Chunk& ch, int j) {
    const int bit = j * B, wi = bit / 32, sh = bit % 32;
    constexpr uint32_t kMask = (1u << B) - 1;
    const uint32_t q = sh + B <= 32 ? (ch.w[wi] >> sh) & kMask : __funnelshift_r(ch.w[wi], ch.w[wi + 1], sh) & kMask;
    return __uint_as_float(0x3F800000u | (q << (23 - B)));
  }

  template <int M>
  __device__ static __forceinline__ void finish(const Args& a, const Chunk& ch, int seg, const float (&F)[M],
                                                const float (&sx)[M], float (&acc)[M]) {
    float scale, bias;
    if (a.f32) {
      scale = __uint_as_float(ch.meta[2 * seg]);
      bias = __uint_as_float(ch.meta[2 * seg + 1]);
    } else {
      scale = half_to_float(ch.meta[seg] & 0xFFFFu, a.f16);
      bias = half_to_float(ch.meta[seg] >> 16, a.f16);
    }
    const float scale_b = scale * static_cast<float>(1 << B);
#pragma unroll
    for (int i = 0; i < M; ++i) acc[i] = fmaf(scale_b, F[i] - sx[i], fmaf(bias, sx[i], acc[i]));
  }
};

// Dense bf16/f16/f32 weights.
template <MetaType T>
struct Dense {
  static constexpr int kWords = T == MetaType::f32 ? 64 : 32;
  static constexpr int kSegs = 1;
  struct Args {
    const uint32_t* data;
    int64_t row_words;
  };
  struct Chunk {
    uint32_t w[kWords];
  };
  __device__ static void load(const Args& a, int64_t row, int c, Chunk& ch) {
    load_words<kWords>(a.data + row * a.row_words + static_cast<int64_t>(c) * kWords, ch.w);
  }
  // Grouped expert launches: the block's expert's data.
  __device__ static void point_at(Args& a, const ExpertArrays& e) { a.data = static_cast<const uint32_t*>(e.codes); }
  __device__ static __forceinline__ float value(const Chunk& ch, int j) {
    if constexpr (T == MetaType::f32) {
      return __uint_as_float(ch.w[j]);
    } else if constexpr (T == MetaType::bf16) {
      return j % 2 == 0 ? __uint_as_float(ch.w[j / 2] << 16) : __uint_as_float(ch.w[j / 2] & 0xFFFF0000u);
    } else {
      return half_to_float(j % 2 == 0 ? ch.w[j / 2] & 0xFFFFu : ch.w[j / 2] >> 16, true);
    }
  }
  template <int M>
  __device__ static __forceinline__ void finish(const Args&, const Chunk&, int, const float (&F)[M],
                                                const float (&)[M], float (&acc)[M]) {
#pragma unroll
    for (int i = 0; i < M; ++i) acc[i] += F[i];
  }
};

// Rows per warp: enough to reuse x from L1 several times, few enough to keep two chunk sets in registers.
template <class P, int M>
__host__ __device__ constexpr int rows_per_warp() {
  int r = 32 / P::kWords;
  r = r < 1 ? 1 : (r > 4 ? 4 : r);
  if (M >= 4 && r > 2) r = 2;
  if (M >= 16) r = 1;
  return r;
}

// Blocks per SM the register budget must allow: small batches are latency-bound and want many warps.
template <int M>
__host__ __device__ constexpr int min_blocks() {
  return M <= 2 ? 3 : (M <= 4 ? 2 : 1);
}

// ---- the kernel ------------------------------------------------------------------------------------------

// Four consecutive x values of each batch row starting at column k; zeros past `cols`.
template <int M>
__device__ __forceinline__ void load_x4(const float* const (&xr)[M], int64_t k, int64_t cols, bool vector,
                                        float (&xv)[M][4]) {
#pragma unroll
  for (int i = 0; i < M; ++i) {
    if (vector) {
      const float4 v = __ldg(reinterpret_cast<const float4*>(xr[i] + k));
      xv[i][0] = v.x, xv[i][1] = v.y, xv[i][2] = v.z, xv[i][3] = v.w;
    } else {
#pragma unroll
      for (int t = 0; t < 4; ++t) xv[i][t] = k + t < cols ? __ldg(xr[i] + k + t) : 0.0f;
    }
  }
}

template <class P, int M, int R>
__device__ __forceinline__ void accumulate_chunk(const typename P::Args& a, const typename P::Chunk (&ch)[R], int c,
                                                 const float* const (&xr)[M], int64_t cols, bool aligned,
                                                 float (&acc)[R][M]) {
  constexpr int kSegLen = kChunkWeights / P::kSegs;
  const int64_t k0 = static_cast<int64_t>(c) * kChunkWeights;
  const bool vector = aligned && k0 + kChunkWeights <= cols;
#pragma unroll
  for (int seg = 0; seg < P::kSegs; ++seg) {
    float F[R][M], sx[M];
#pragma unroll
    for (int i = 0; i < M; ++i) {
      sx[i] = 0.0f;
#pragma unroll
      for (int r = 0; r < R; ++r) F[r][i] = 0.0f;
    }
#pragma unroll
    for (int j4 = seg * kSegLen / 4; j4 < (seg + 1) * kSegLen / 4; ++j4) {
      float xv[M][4];
      load_x4<M>(xr, k0 + 4 * j4, cols, vector, xv);
#pragma unroll
      for (int i = 0; i < M; ++i) sx[i] += (xv[i][0] + xv[i][1]) + (xv[i][2] + xv[i][3]);
#pragma unroll
      for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          const float f = P::value(ch[r], 4 * j4 + t);
#pragma unroll
          for (int i = 0; i < M; ++i) F[r][i] = fmaf(f, xv[i][t], F[r][i]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) P::template finish<M>(a, ch[r], seg, F[r], sx, acc[r]);
  }
}

template <class P, int M, int R>
__device__ __forceinline__ void load_rows(const typename P::Args& a, int64_t row0, int64_t rows, int c,
                                          typename P::Chunk (&ch)[R]) {
#pragma unroll
  for (int r = 0; r < R; ++r) P::load(a, min(row0 + r, rows - 1), c, ch[r]);
}

// G: a grouped expert launch (matvec.h: ExpertGroups), block z multiplying its group's rows by its expert
// (codecs with P::point_at).
template <class P, int M, bool G = false>
__global__ void __launch_bounds__(kThreads, min_blocks<M>())
    matvec_kernel(typename P::Args a, ExpertGroups groups, int64_t rows, int64_t cols, const float* __restrict__ x,
                  int m, float* __restrict__ y) {
  constexpr int R = rows_per_warp<P, M>();
  const int32_t* x_rows = nullptr;
  if constexpr (G) {
    const BlockGroup bg = group_of_block(groups);
    if (bg.count == 0) return;
    x_rows = bg.x_rows;
    if (!x_rows) x += bg.start * cols;
    y += bg.start * rows;
    m = bg.count;
    P::point_at(a, bg.w);
  }
  const int lane = threadIdx.x % 32;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32) * R;
  if (row0 >= rows) return;
  const int nchunks = static_cast<int>((cols + kChunkWeights - 1) / kChunkWeights);
  const bool aligned = cols % 4 == 0;
  const float* xr[M];
#pragma unroll
  for (int i = 0; i < M; ++i) xr[i] = group_x_row(x, x_rows, i < m ? i : 0, cols);

  float acc[R][M];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int i = 0; i < M; ++i) acc[r][i] = 0.0f;

  // One chunk per lane in flight; the other warps of a well-occupied SM hide the latency.
  typename P::Chunk ch[R];
  for (int c = lane; c < nchunks; c += 32) {
    load_rows<P, M, R>(a, row0, rows, c, ch);
    accumulate_chunk<P, M, R>(a, ch, c, xr, cols, aligned, acc);
  }

#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int i = 0; i < M; ++i) {
      float v = acc[r][i];
#pragma unroll
      for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, off);
      if (lane == (r * M + i) % 32 && row0 + r < rows && i < m) y[i * rows + row0 + r] = v;
    }
  }
}

template <class P, int M, bool G>
void launch_m(const typename P::Args& a, const ExpertGroups& g, int64_t rows, int64_t cols, const float* x, int m,
              float* y, CUstream_st* s) {
  constexpr int R = rows_per_warp<P, M>();
  const int64_t blocks = (rows + kWarps * R - 1) / (kWarps * R);
  const dim3 grid(static_cast<unsigned>(blocks), 1, G ? static_cast<unsigned>(g.max_groups) : 1);
  matvec_kernel<P, M, G><<<grid, kThreads, 0, s>>>(a, g, rows, cols, x, m, y);
}

// A plain launch (G false), or a grouped one whose groups `g` hold at most `batch` rows each (m unused).
template <class P, bool G = false>
void launch(const typename P::Args& a, int64_t rows, int64_t cols, const float* x, int m, int batch, float* y,
            CUstream_st* s, const ExpertGroups& g = {}) {
  switch (batch) {
    case 1: return launch_m<P, 1, G>(a, g, rows, cols, x, m, y, s);
    case 2: return launch_m<P, 2, G>(a, g, rows, cols, x, m, y, s);
    case 4: return launch_m<P, 4, G>(a, g, rows, cols, x, m, y, s);
    case 8: return launch_m<P, 8, G>(a, g, rows, cols, x, m, y, s);
    default: return launch_m<P, 16, G>(a, g, rows, cols, x, m, y, s);
  }
}

template <int B, int GPC>
void launch_affine(const AffineDevice& w, const float* x, int m, int batch, float* y, CUstream_st* s) {
  using P = Affine<B, GPC>;
  int shift = 0;
  while ((kChunkWeights << shift) < w.group) ++shift;
  const typename P::Args a{w.codes, w.meta, w.kpad * B / 32, w.kpad / w.group, shift,
                           w.meta_type == MetaType::f16, w.meta_type == MetaType::f32};
  launch<P>(a, w.rows, w.cols, x, m, batch, y, s);
}

}  // namespace

// One instantiation per file (matvec_affine<B>.cu), so that the kernels compile in parallel.
// 2 bits come here in groups of 16 only (GGUF's Q2_K; larger groups run on tensor cores), so only those compile.
template <int B>
void launch_affine_bits(const AffineDevice& w, const float* x, int m, int batch, float* y, CUstream_st* s) {
  if (w.group == 16) return launch_affine<B, 4>(w, x, m, batch, y, s);
  if constexpr (B != 2) {
    if (w.group == 32) return launch_affine<B, 2>(w, x, m, batch, y, s);
    launch_affine<B, 1>(w, x, m, batch, y, s);
  }
}


}  // namespace lowbit::kernels::cuda
