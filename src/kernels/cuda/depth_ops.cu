// The depth decoder's kernels (lowbit/kernels/cuda_depth_ops.h), each the GPU twin of an operation of
// src/model/depth_decoder.cpp with the same bits. Every product, sum, quotient and square root is an explicit
// IEEE round-to-nearest intrinsic (__fmul_rn, __fadd_rn, __fsub_rn, __fdiv_rn, __fsqrt_rn), which nvcc never
// contracts into an FMA; __fmaf_rn stands exactly where the CPU calls std::fma (a correctly rounded fma on both).
// Sums that the CPU runs in order run in order here too, in one thread: parallelism is only across outputs.
// Rounding to f16 / bf16 is cvt.rn (IEEE round to nearest even, subnormals kept, overflow to inf), as the CPU's
// f32_to_f16 / f32_to_bf16 round every non-NaN value; a NaN stays a NaN (its payload may differ, as it does after
// any GPU arithmetic).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "lowbit/kernels/cuda_depth_ops.h"

namespace lowbit::kernels::cuda {

namespace {

constexpr int kPanel = 32;           // outputs per panel (the CPU's kDepthPanel)
constexpr int kMatmulThreads = 256;  // a block multiplies one panel
constexpr int kChunk = 64;           // inputs per shared-memory chunk
constexpr int kNormThreads = 256;
constexpr int kCodes = 2048;
constexpr int kSampleThreads = 1024;  // two logits per thread

__device__ __forceinline__ float round_to(ElemType t, float v) {
  switch (t) {
    case ElemType::f16: return __half2float(__float2half_rn(v));
    case ElemType::bf16: return __bfloat162float(__float2bfloat16_rn(v));
    default: return v;
  }
}

template <class T>
__device__ __forceinline__ float to_float(T v) {
  if constexpr (sizeof(T) == 4) {
    return v;
  } else if constexpr (std::is_same_v<T, __half>) {
    return __half2float(v);
  } else {
    return __bfloat162float(v);
  }
}

// MLX's CPU exp as depth_decoder.cpp's mlx_exp, operation for operation.
__device__ float mlx_exp(float in) {
  if (isnan(in)) return in;
  if (in > 88.0f) return __int_as_float(0x7f800000);
  if (in < -88.0f) return 0.0f;
  float x = __fmul_rn(in, 1.442695f);
  const float ipart = floorf(__fadd_rn(x, 0.5f));
  const float fpart = __fsub_rn(x, ipart);
  x = 1.535336188319500e-4f;
  x = __fmaf_rn(x, fpart, 1.339887440266574e-3f);
  x = __fmaf_rn(x, fpart, 9.618437357674640e-3f);
  x = __fmaf_rn(x, fpart, 5.550332471162809e-2f);
  x = __fmaf_rn(x, fpart, 2.402264791363012e-1f);
  x = __fmaf_rn(x, fpart, 6.931472028550421e-1f);
  x = __fmaf_rn(x, fpart, 1.000000000000000f);
  const uint32_t epart = (static_cast<uint32_t>(static_cast<int32_t>(ipart)) + 127u) << 23;
  return __fmul_rn(__uint_as_float(epart), x);
}

// MLX's CPU erf as depth_decoder.cpp's mlx_erf.
__device__ float mlx_erf(float v) {
  const float t = __fdiv_rn(1.0f, __fmaf_rn(0.3275911f, fabsf(v), 1.0f));
  float r = __fmaf_rn(1.061405429f, t, -1.453152027f);
  r = __fmaf_rn(r, t, 1.421413741f);
  r = __fmaf_rn(r, t, -0.284496736f);
  r = __fmaf_rn(r, t, 0.254829592f);
  const float e = -mlx_exp(__fmul_rn(-v, v));
  const float result = __fmaf_rn(__fmul_rn(e, t), r, 1.0f);
  return v > 0 ? result : -result;
}

// One block per panel of 32 outputs: the block stages kChunk inputs' weights and activations in shared memory,
// then thread (row, column) adds the chunk's products to its accumulator in input order. Every thread helps load;
// 32 * rows of them accumulate.
template <class T>
__global__ void __launch_bounds__(kMatmulThreads)
    depth_matmul_kernel(const float* x, int rows, const T* panels, int64_t n, int64_t k, ElemType round, float* out) {
  constexpr int kRowsPerPass = kMatmulThreads / kPanel;
  constexpr int kPasses = kDepthMaxRows / kRowsPerPass;
  __shared__ T w[kChunk][kPanel];
  __shared__ float xs[kDepthMaxRows][kChunk];
  const int64_t panel = blockIdx.x;
  const T* p = panels + panel * k * kPanel;
  const int col = threadIdx.x % kPanel;
  float acc[kPasses];
#pragma unroll
  for (int m = 0; m < kPasses; ++m) acc[m] = 0.0f;
  for (int64_t k0 = 0; k0 < k; k0 += kChunk) {
    const int kc = static_cast<int>(k - k0 < kChunk ? k - k0 : kChunk);
    for (int e = threadIdx.x; e < kc * kPanel; e += kMatmulThreads) w[e / kPanel][e % kPanel] = p[k0 * kPanel + e];
    for (int e = threadIdx.x; e < rows * kc; e += kMatmulThreads) xs[e / kc][e % kc] = x[(e / kc) * k + k0 + e % kc];
    __syncthreads();
#pragma unroll
    for (int m = 0; m < kPasses; ++m) {
      const int row = threadIdx.x / kPanel + m * kRowsPerPass;
      if (row < rows)
        for (int j = 0; j < kc; ++j) acc[m] = __fadd_rn(acc[m], __fmul_rn(xs[row][j], to_float(w[j][col])));
    }
    __syncthreads();
  }
  const int64_t c = panel * kPanel + col;
#pragma unroll
  for (int m = 0; m < kPasses; ++m) {
    const int row = threadIdx.x / kPanel + m * kRowsPerPass;
    if (row < rows && c < n) out[row * n + c] = round_to(round, acc[m]);
  }
}

// One block per row; the row in shared memory, its statistics summed in order by thread 0.
__global__ void __launch_bounds__(kNormThreads)
    depth_layer_norm_kernel(const float* x, int64_t d, const float* w, const float* b, float inv, ElemType round,
                            float* out) {
  extern __shared__ float row[];
  __shared__ float stats[2];
  const float* xr = x + blockIdx.x * d;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) row[i] = xr[i];
  __syncthreads();
  if (threadIdx.x == 0) {
    float sum = 0.0f;
    for (int64_t i = 0; i < d; ++i) sum = __fadd_rn(sum, row[i]);
    const float mean = __fmul_rn(sum, inv);
    float sq = 0.0f;
    for (int64_t i = 0; i < d; ++i) {
      const float c = __fsub_rn(row[i], mean);
      sq = __fadd_rn(sq, __fmul_rn(c, c));
    }
    stats[0] = mean;
    stats[1] = __fsqrt_rn(__fadd_rn(__fmul_rn(sq, inv), 1e-5f));
  }
  __syncthreads();
  const float mean = stats[0], denom = stats[1];
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x)
    out[blockIdx.x * d + i] =
        round_to(round, __fadd_rn(__fmul_rn(__fdiv_rn(__fsub_rn(row[i], mean), denom), w[i]), b[i]));
}

__global__ void depth_add_kernel(float* x, const float* y, int64_t d, int64_t y_stride, ElemType round) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= d) return;
  const int64_t r = blockIdx.y;
  x[r * d + i] = round_to(round, __fadd_rn(x[r * d + i], y[r * y_stride + i]));
}

__global__ void depth_gelu_kernel(float* x, int64_t count, ElemType round) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= count) return;
  const float v = x[i];
  x[i] = round_to(round, __fmul_rn(__fmul_rn(v, 0.5f), __fadd_rn(1.0f, mlx_erf(__fmul_rn(v, 0.70710677f)))));
}

// One block per (query, head): the scores by key in parallel (each a sum over the head in order), the max and
// the softmax normaliser in key order by thread 0, the weighted values by head dimension (sums in key order).
__global__ void depth_attend_kernel(const float* q, int64_t q_stride, const float* k, const float* v, int64_t kv_stride,
                                    int queries, int n, int64_t d, int head_dim, float scale, ElemType round,
                                    float* out) {
  extern __shared__ float qs[];  // [head_dim]
  __shared__ float s[kDepthMaxRows];
  __shared__ float norm[2];
  const int qi = blockIdx.x;
  const int64_t h0 = static_cast<int64_t>(blockIdx.y) * head_dim;
  const int keys = n - queries + 1 + qi;
  const float* qr = q + qi * q_stride + h0;
  for (int i = threadIdx.x; i < head_dim; i += blockDim.x) qs[i] = round_to(round, __fmul_rn(scale, qr[i]));
  __syncthreads();
  for (int j = threadIdx.x; j < keys; j += blockDim.x) {
    const float* kr = k + j * kv_stride + h0;
    float acc = 0.0f;
    for (int i = 0; i < head_dim; ++i) acc = __fadd_rn(acc, __fmul_rn(qs[i], kr[i]));
    s[j] = round_to(round, acc);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = __int_as_float(0xff800000);  // -inf; std::max(m, s) keeps m unless m < s
    for (int j = 0; j < keys; ++j) m = m < s[j] ? s[j] : m;
    float sum = 0.0f;
    for (int j = 0; j < keys; ++j) sum = __fadd_rn(sum, mlx_exp(__fsub_rn(s[j], m)));
    norm[0] = m;
    norm[1] = __fdiv_rn(1.0f, sum);
  }
  __syncthreads();
  const float m = norm[0], inv = norm[1];
  for (int j = threadIdx.x; j < keys; j += blockDim.x)
    s[j] = round_to(round, __fmul_rn(mlx_exp(__fsub_rn(s[j], m)), inv));
  __syncthreads();
  for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < keys; ++j) acc = __fadd_rn(acc, __fmul_rn(s[j], v[j * kv_stride + h0 + i]));
    out[qi * d + h0 + i] = round_to(round, acc);
  }
}

// The sampler's order on (score, index): a higher score first, then the lower index; NaN scores last. With score 0
// not NaN this picks what the CPU's scan (`i == 0 || score > best`) picks: the first index of the largest non-NaN
// score; a NaN score 0 makes the scan keep index 0, which the kernel checks separately.
__device__ __forceinline__ bool beats(float sa, int ia, float sb, int ib) {
  if (isnan(sb)) return !isnan(sa) || ia < ib;
  if (isnan(sa)) return false;
  return sa > sb || (sa == sb && ia < ib);
}

// One block per level: x = logits * inv_temp, a bitonic sort (descending) of a copy for the top_k-th largest
// value (the value nth_element finds: any order of equal values gives it), then the argmax of the masked scores.
__global__ void __launch_bounds__(kSampleThreads)
    depth_sample_kernel(const float* logits, const float* noise, float inv_temp, int top_k, int level, int32_t* codes) {
  __shared__ float xs[kCodes], sorted[kCodes];
  __shared__ float best_score[kSampleThreads / 32];
  __shared__ int best_index[kSampleThreads / 32];
  for (int i = threadIdx.x; i < kCodes; i += kSampleThreads) {
    xs[i] = __fmul_rn(logits[i], inv_temp);
    sorted[i] = xs[i];
  }
  __syncthreads();
  for (int size = 2; size <= kCodes; size <<= 1)
    for (int stride = size / 2; stride > 0; stride >>= 1) {
      const int t = threadIdx.x;
      const int i = 2 * t - (t & (stride - 1)), j = i + stride;
      const float a = sorted[i], b = sorted[j];
      if ((i & size) == 0 ? a < b : a > b) {
        sorted[i] = b;
        sorted[j] = a;
      }
      __syncthreads();
    }
  const float kth = sorted[top_k - 1];
  float score = 0.0f;
  int index = -1;
  for (int i = threadIdx.x; i < kCodes; i += kSampleThreads) {
    const float xm = xs[i] >= kth ? xs[i] : __int_as_float(0xff800000);
    const float si = __fsub_rn(xm, noise[i]);
    if (index < 0 || beats(si, i, score, index)) {
      score = si;
      index = i;
    }
  }
  for (int o = 16; o > 0; o /= 2) {
    const float so = __shfl_xor_sync(0xffffffffu, score, o);
    const int io = __shfl_xor_sync(0xffffffffu, index, o);
    if (beats(so, io, score, index)) {
      score = so;
      index = io;
    }
  }
  if (threadIdx.x % 32 == 0) {
    best_score[threadIdx.x / 32] = score;
    best_index[threadIdx.x / 32] = index;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kSampleThreads / 32; ++w)
      if (beats(best_score[w], best_index[w], score, index)) {
        score = best_score[w];
        index = best_index[w];
      }
    codes[level] = isnan(__fsub_rn(xs[0] >= kth ? xs[0] : __int_as_float(0xff800000), noise[0])) ? 0 : index;
  }
}

template <class T>
__global__ void depth_embed_kernel(int level, const int32_t* codes, const int32_t* force, const T* lo_table,
                                   int64_t rank, const float* up_t, const float* level_emb, int64_t d, ElemType round,
                                   float* out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= d) return;
  const int32_t code = level > 0 && force[level] >= 0 ? force[level] : codes[level];
  const T* lo = lo_table + (static_cast<int64_t>(level) * kCodes + code) * rank;
  float acc = 0.0f;
  for (int64_t j = 0; j < rank; ++j) acc = __fadd_rn(acc, __fmul_rn(to_float(lo[j]), up_t[j * d + i]));
  out[i] = round_to(round, __fadd_rn(round_to(round, acc), level_emb[(level + 1) * d + i]));
}

unsigned blocks_for(int64_t count, int threads) { return static_cast<unsigned>((count + threads - 1) / threads); }

}  // namespace

void launch_depth_matmul(const float* x, int rows, const DepthPanels& w, ElemType round, float* out,
                         CUstream_st* stream) {
  const dim3 grid(blocks_for(w.n, kPanel));
  switch (w.type) {
    case ElemType::f16:
      depth_matmul_kernel<<<grid, kMatmulThreads, 0, stream>>>(x, rows, static_cast<const __half*>(w.values), w.n, w.k,
                                                               round, out);
      break;
    case ElemType::bf16:
      depth_matmul_kernel<<<grid, kMatmulThreads, 0, stream>>>(x, rows, static_cast<const __nv_bfloat16*>(w.values),
                                                               w.n, w.k, round, out);
      break;
    default:
      depth_matmul_kernel<<<grid, kMatmulThreads, 0, stream>>>(x, rows, static_cast<const float*>(w.values), w.n, w.k,
                                                               round, out);
  }
}

void launch_depth_layer_norm(const float* x, int rows, int64_t d, const float* w, const float* b, ElemType round,
                             float* out, CUstream_st* stream) {
  // MLX: mean = sum x fp32(1 / n)
  const auto inv = static_cast<float>(1.0 / static_cast<double>(d));
  const size_t smem = static_cast<size_t>(d) * sizeof(float);
  const unsigned grid = rows;  // a block per row
  depth_layer_norm_kernel<<<grid, kNormThreads, smem, stream>>>(x, d, w, b, inv, round, out);
}

void launch_depth_add(float* x, const float* y, int rows, int64_t d, int64_t y_stride, ElemType round,
                      CUstream_st* stream) {
  constexpr int kThreads = 256;
  const dim3 grid(blocks_for(d, kThreads), rows);
  depth_add_kernel<<<grid, kThreads, 0, stream>>>(x, y, d, y_stride, round);
}

void launch_depth_gelu(float* x, int64_t count, ElemType round, CUstream_st* stream) {
  constexpr int kThreads = 256;
  const unsigned grid = blocks_for(count, kThreads);
  depth_gelu_kernel<<<grid, kThreads, 0, stream>>>(x, count, round);
}

void launch_depth_attend(const float* q, int64_t q_stride, const float* k, const float* v, int64_t kv_stride,
                         int queries, int n, int64_t d, int head_dim, float scale, ElemType round, float* out,
                         CUstream_st* stream) {
  constexpr int kThreads = 64;
  const dim3 grid(queries, static_cast<unsigned>(d / head_dim));
  const size_t smem = static_cast<size_t>(head_dim) * sizeof(float);
  depth_attend_kernel<<<grid, kThreads, smem, stream>>>(q, q_stride, k, v, kv_stride, queries, n, d, head_dim, scale,
                                                        round, out);
}

void launch_depth_sample(const float* logits, const float* noise, float inv_temp, int top_k, int level, int32_t* codes,
                         CUstream_st* stream) {
  constexpr int kOneBlock = 1;  // one level's 2048 logits
  depth_sample_kernel<<<kOneBlock, kSampleThreads, 0, stream>>>(logits, noise, inv_temp, top_k, level, codes);
}

void launch_depth_embed(int level, const int32_t* codes, const int32_t* force, const void* lo_table, ElemType lo_type,
                        int64_t rank, const float* up_t, const float* level_emb, int64_t d, ElemType round, float* out,
                        CUstream_st* stream) {
  constexpr int kThreads = 128;
  const unsigned grid = blocks_for(d, kThreads);
  switch (lo_type) {
    case ElemType::f16:
      depth_embed_kernel<<<grid, kThreads, 0, stream>>>(level, codes, force, static_cast<const __half*>(lo_table), rank,
                                                        up_t, level_emb, d, round, out);
      break;
    case ElemType::bf16:
      depth_embed_kernel<<<grid, kThreads, 0, stream>>>(
          level, codes, force, static_cast<const __nv_bfloat16*>(lo_table), rank, up_t, level_emb, d, round, out);
      break;
    default:
      depth_embed_kernel<<<grid, kThreads, 0, stream>>>(level, codes, force, static_cast<const float*>(lo_table), rank,
                                                        up_t, level_emb, d, round, out);
  }
}

}  // namespace lowbit::kernels::cuda
