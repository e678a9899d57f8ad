// The decode step's kernels besides the matvecs (model_ops.h). Each mirrors a step of the CPU forward pass
// (src/model/forward.cpp) in f32; only the order of sums differs, so logits agree to rounding.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>
#include <climits>

#include "kernels/cuda/model_ops.h"

namespace lowbit::kernels::cuda {

namespace {

constexpr int kWarp = 32;

__device__ __forceinline__ float load_elem(const void* p, ElemType t, int64_t i) {
  switch (t) {
    case ElemType::f16: return __half2float(static_cast<const __half*>(p)[i]);
    case ElemType::bf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

__device__ __forceinline__ void store_elem(void* p, ElemType t, int64_t i, float v) {
  switch (t) {
    case ElemType::f16: static_cast<__half*>(p)[i] = __float2half_rn(v); break;
    case ElemType::bf16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v); break;
    default: static_cast<float*>(p)[i] = v;
  }
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
__device__ float block_sum(float v) {
  __shared__ float partial[kWarp];
  __shared__ float total;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  v = warp_sum(v);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float s = lane < static_cast<int>(blockDim.x / kWarp) ? partial[lane] : 0.0f;
    s = warp_sum(s);
    if (lane == 0) total = s;
  }
  __syncthreads();
  return total;
}

__global__ void embed_gather_kernel(const void* table, ElemType type, int64_t vocab, int64_t dim,
                                    const int32_t* tokens, float* x) {
  const int b = blockIdx.x;
  const int32_t token = tokens[b];
  const bool valid = token >= 0 && token < vocab;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x)
    x[b * dim + j] = valid ? load_elem(table, type, token * dim + j) : 0.0f;
}

// One block per row: optional residual add in place, then out = weight * x / rms(x) (forward.cpp's rmsnorm).
__global__ void rmsnorm_kernel(float* x, const float* delta, const float* weight, float* out, int64_t n, float eps) {
  float* row = x + blockIdx.x * n;
  float ss = 0.0f;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    float v = row[j];
    if (delta) {
      v += delta[blockIdx.x * n + j];
      row[j] = v;
    }
    ss += v * v;
  }
  ss = block_sum(ss);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) out[blockIdx.x * n + j] = weight[j] * (inv * row[j]);
}

// One block per (row, head): q heads first, then kv heads. Thread d owns element d of the head.
__global__ void qkv_prepare_kernel(QkvArgs a, KvLayer kv, const int32_t* pos, const int32_t* slot) {
  extern __shared__ float head[];
  const int b = blockIdx.x, h = blockIdx.y, d = threadIdx.x, hd = a.head_dim;
  const bool is_q = h < a.n_heads;
  const int hh = is_q ? h : h - a.n_heads;
  const float* src = is_q ? a.q + b * a.q_stride : a.k + b * a.k_stride;
  const float* bias = is_q ? a.q_bias : a.k_bias;
  const float* norm = is_q ? a.q_norm : a.k_norm;
  const bool active = d < hd;
  float v = active ? src[hh * hd + d] + (bias ? bias[hh * hd + d] : 0.0f) : 0.0f;
  if (norm) {
    const float ss = block_sum(v * v);
    if (active) v = norm[d] * ((1.0f / sqrtf(ss / static_cast<float>(hd) + a.eps)) * v);
  }
  if (active) head[d] = v;
  __syncthreads();
  if (!active) return;
  const int half = hd / 2;
  // RoPE: element d pairs with its partner; `first` is the pair's rotated-by-(c, -s) element.
  const int pair = a.interleaved ? d / 2 : d % half;
  const bool first = a.interleaved ? d % 2 == 0 : d < half;
  const int ia = a.interleaved ? 2 * pair : pair, ib = a.interleaved ? 2 * pair + 1 : pair + half;
  const int p = pos[b];
  const float angle = static_cast<float>(p) * a.inv_freq[pair];
  const float c = cosf(angle), s = sinf(angle);
  const float x0 = head[ia], x1 = head[ib];
  const float rotated = first ? x0 * c - x1 * s : x0 * s + x1 * c;
  if (is_q) {
    a.q[b * a.q_stride + hh * hd + d] = rotated;
    return;
  }
  const int64_t kv_dim = static_cast<int64_t>(a.n_kv_heads) * hd;
  const int64_t at = (static_cast<int64_t>(slot[b]) * kv.capacity + p) * kv_dim + hh * hd + d;
  store_elem(kv.keys, kv.type, at, rotated);
  store_elem(kv.values, kv.type, at, a.v[b * a.v_stride + hh * hd + d] + (a.v_bias ? a.v_bias[hh * hd + d] : 0.0f));
}

constexpr int kAttnWarps = 8;
constexpr int kAttnUnroll = 4;       // positions per warp whose keys and values load together
constexpr int kMaxDimsPerLane = 8;  // head_dim <= 256
constexpr int kPositionsPerSplit = kAttnWarps * kAttnUnroll;

// Grid (head, row, split): split s covers positions [s chunk, (s + 1) chunk) of 0..pos[b], chunk = the cache
// capacity / splits, so a step's launch shape does not depend on the positions (one graph serves every step).
// Warp w takes kAttnUnroll consecutive positions per round, all their key and value loads in flight at once:
// dot products by warp-wide sums, then one online-softmax update (running max m, sum l, weighted values acc).
// The block merges its warps; with several splits it stores (m, l, acc) in the scratch and the block that
// arrives last at the (row, head) counter merges the splits in split order (deterministic) and resets it.
__global__ void __launch_bounds__(kAttnWarps * kWarp) decode_attention_kernel(const float* q, int64_t q_stride,
                                                                              KvLayer kv, const int32_t* pos,
                                                                              const int32_t* slot, int n_heads,
                                                                              int n_kv_heads, int hd, int splits,
                                                                              AttentionScratch scratch, float* out) {
  __shared__ float s_m[kAttnWarps], s_l[kAttnWarps];
  __shared__ float s_acc[kAttnWarps][kMaxDimsPerLane * kWarp];
  __shared__ bool s_last;
  const int h = blockIdx.x, b = blockIdx.y, split = blockIdx.z;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int kvh = h / (n_heads / n_kv_heads);
  const int64_t kv_dim = static_cast<int64_t>(n_kv_heads) * hd;
  const int64_t base = static_cast<int64_t>(slot[b]) * kv.capacity * kv_dim + kvh * hd;
  const float scale = sqrtf(static_cast<float>(hd));
  float qr[kMaxDimsPerLane], acc[kMaxDimsPerLane];
#pragma unroll
  for (int i = 0; i < kMaxDimsPerLane; ++i) {
    const int d = lane + kWarp * i;
    qr[i] = d < hd ? q[b * q_stride + h * hd + d] : 0.0f;
    acc[i] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  const int64_t chunk = (kv.capacity + splits - 1) / splits;
  const int64_t begin = split * chunk;
  const int64_t end = begin + chunk < pos[b] + 1 ? begin + chunk : pos[b] + 1;
  for (int64_t t0 = begin + warp * kAttnUnroll; t0 < end; t0 += kAttnWarps * kAttnUnroll) {
    float kr[kAttnUnroll][kMaxDimsPerLane], vr[kAttnUnroll][kMaxDimsPerLane];
#pragma unroll
    for (int u = 0; u < kAttnUnroll; ++u) {
      const int64_t row = base + (t0 + u) * kv_dim;
#pragma unroll
      for (int i = 0; i < kMaxDimsPerLane; ++i) {
        const int d = lane + kWarp * i;
        const bool load = t0 + u < end && d < hd;
        kr[u][i] = load ? load_elem(kv.keys, kv.type, row + d) : 0.0f;
        vr[u][i] = load ? load_elem(kv.values, kv.type, row + d) : 0.0f;
      }
    }
    float score[kAttnUnroll];
    float m_new = m;
#pragma unroll
    for (int u = 0; u < kAttnUnroll; ++u) {
      float dot = 0.0f;
#pragma unroll
      for (int i = 0; i < kMaxDimsPerLane; ++i) dot += qr[i] * kr[u][i];
      score[u] = t0 + u < end ? warp_sum(dot) / scale : -INFINITY;
      m_new = fmaxf(m_new, score[u]);
    }
    const float corr = expf(m - m_new);  // m_new is finite: position t0 < end
    l *= corr;
#pragma unroll
    for (int i = 0; i < kMaxDimsPerLane; ++i) acc[i] *= corr;
#pragma unroll
    for (int u = 0; u < kAttnUnroll; ++u) {
      const float p = expf(score[u] - m_new);
      l += p;
#pragma unroll
      for (int i = 0; i < kMaxDimsPerLane; ++i) acc[i] += p * vr[u][i];
    }
    m = m_new;
  }
  if (lane == 0) {
    s_m[warp] = m;
    s_l[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < kMaxDimsPerLane; ++i) s_acc[warp][lane + kWarp * i] = acc[i];
  __syncthreads();
  float m_all = -INFINITY;
  for (int w = 0; w < kAttnWarps; ++w) m_all = fmaxf(m_all, s_m[w]);
  float l_all = 0.0f;
  for (int w = 0; w < kAttnWarps; ++w)
    if (s_l[w] > 0.0f) l_all += s_l[w] * expf(s_m[w] - m_all);
  float* o_row = out + static_cast<int64_t>(b) * n_heads * hd + h * hd;
  const int64_t pair = static_cast<int64_t>(b) * n_heads + h;
  float* mine = scratch.partials + (pair * splits + split) * (hd + 2);
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float o = 0.0f;
    for (int w = 0; w < kAttnWarps; ++w)
      if (s_l[w] > 0.0f) o += s_acc[w][d] * expf(s_m[w] - m_all);
    if (splits == 1) {
      o_row[d] = o / l_all;
    } else {
      mine[2 + d] = o;
    }
  }
  if (splits == 1) return;
  if (threadIdx.x == 0) {
    mine[0] = m_all;
    mine[1] = l_all;
  }
  __threadfence();  // this block's partial is visible before it counts itself in
  __syncthreads();
  if (threadIdx.x == 0) s_last = atomicAdd(scratch.counters + pair, 1u) == static_cast<unsigned>(splits - 1);
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  const float* parts = scratch.partials + pair * splits * (hd + 2);
  float m_max = -INFINITY;
  for (int s = 0; s < splits; ++s)
    if (__ldcg(parts + s * (hd + 2) + 1) > 0.0f) m_max = fmaxf(m_max, __ldcg(parts + s * (hd + 2)));
  float l_sum = 0.0f;
  for (int s = 0; s < splits; ++s) {
    const float ls = __ldcg(parts + s * (hd + 2) + 1);
    if (ls > 0.0f) l_sum += ls * expf(__ldcg(parts + s * (hd + 2)) - m_max);
  }
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float o = 0.0f;
    for (int s = 0; s < splits; ++s) {
      const float* ps = parts + s * (hd + 2);
      if (__ldcg(ps + 1) > 0.0f) o += __ldcg(ps + 2 + d) * expf(__ldcg(ps) - m_max);
    }
    o_row[d] = o / l_sum;
  }
  if (threadIdx.x == 0) scratch.counters[pair] = 0u;
}

__global__ void swiglu_kernel(const float* gate, const float* up, int64_t stride, float* out, int64_t hidden,
                              int64_t total) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = i / hidden, j = i % hidden;
    const float g = gate[b * stride + j];
    out[i] = g * (1.0f / (1.0f + expf(-g))) * up[b * stride + j];
  }
}

// (value, index) pairs: the larger value wins, the lower index on ties; NaN never wins (as the CPU argmax).
__device__ __forceinline__ void keep_best(float& v, int& i, float ov, int oi) {
  if (ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

__global__ void argmax_kernel(const float* logits, int64_t vocab, int32_t* next) {
  __shared__ float s_v[kWarp];
  __shared__ int s_i[kWarp];
  const float* row = logits + blockIdx.x * vocab;
  float v = -INFINITY;
  int idx = INT_MAX;
  // 16-byte loads, several in flight per thread, when rows stay 16-byte aligned (vocab a multiple of 4).
  const int64_t vec = vocab % 4 == 0 ? vocab / 4 : 0;
#pragma unroll 4
  for (int64_t j = threadIdx.x; j < vec; j += blockDim.x) {
    const float4 q = reinterpret_cast<const float4*>(row)[j];
    const int base = static_cast<int>(4 * j);
    keep_best(v, idx, q.x, base);
    keep_best(v, idx, q.y, base + 1);
    keep_best(v, idx, q.z, base + 2);
    keep_best(v, idx, q.w, base + 3);
  }
  for (int64_t j = 4 * vec + threadIdx.x; j < vocab; j += blockDim.x) keep_best(v, idx, row[j], static_cast<int>(j));
  for (int o = kWarp / 2; o > 0; o /= 2)
    keep_best(v, idx, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, idx, o));
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (lane == 0) {
    s_v[warp] = v;
    s_i[warp] = idx;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < static_cast<int>(blockDim.x / kWarp); ++w) keep_best(v, idx, s_v[w], s_i[w]);
    next[blockIdx.x] = idx == INT_MAX ? 0 : idx;
  }
}

__global__ void advance_kernel(const int32_t* next, int32_t* tokens, int32_t* pos, int batch) {
  const int b = threadIdx.x;
  if (b < batch) {
    tokens[b] = next[b];
    pos[b] += 1;
  }
}

int block_for(int64_t n) {
  int threads = kWarp;
  while (threads < n && threads < 1024) threads *= 2;
  return threads;
}

}  // namespace

void launch_embed_gather(const void* table, ElemType type, int64_t vocab, int64_t dim, const int32_t* tokens,
                         int batch, float* x, CUstream_st* stream) {
  embed_gather_kernel<<<batch, block_for(dim) > 256 ? 256 : block_for(dim), 0, stream>>>(table, type, vocab, dim,
                                                                                         tokens, x);
}

void launch_rmsnorm(float* x, const float* delta, const float* weight, float* out, int batch, int64_t n, float eps,
                    CUstream_st* stream) {
  rmsnorm_kernel<<<batch, block_for(n / 4), 0, stream>>>(x, delta, weight, out, n, eps);
}

void launch_qkv_prepare(const QkvArgs& a, const KvLayer& kv, const int32_t* pos, const int32_t* slot, int batch,
                        CUstream_st* stream) {
  const dim3 grid(static_cast<unsigned>(batch), static_cast<unsigned>(a.n_heads + a.n_kv_heads));
  const int threads = (a.head_dim + kWarp - 1) / kWarp * kWarp;
  qkv_prepare_kernel<<<grid, threads, a.head_dim * sizeof(float), stream>>>(a, kv, pos, slot);
}

int attention_splits(int64_t capacity) {
  const int64_t splits = (capacity + kPositionsPerSplit - 1) / kPositionsPerSplit;
  return static_cast<int>(splits < 1 ? 1 : (splits > kAttentionSplits ? kAttentionSplits : splits));
}

void launch_decode_attention(const float* q, int64_t q_stride, const KvLayer& kv, const int32_t* pos,
                             const int32_t* slot, int n_heads, int n_kv_heads, int head_dim, int batch,
                             const AttentionScratch& scratch, float* out, CUstream_st* stream) {
  const int splits = attention_splits(kv.capacity);
  const dim3 grid(static_cast<unsigned>(n_heads), static_cast<unsigned>(batch), static_cast<unsigned>(splits));
  decode_attention_kernel<<<grid, kAttnWarps * kWarp, 0, stream>>>(q, q_stride, kv, pos, slot, n_heads, n_kv_heads,
                                                                   head_dim, splits, scratch, out);
}

void launch_swiglu(const float* gate, const float* up, int64_t stride, float* out, int batch, int64_t hidden,
                   CUstream_st* stream) {
  const int64_t total = batch * hidden;
  const int64_t blocks = (total + 255) / 256;
  swiglu_kernel<<<static_cast<unsigned>(blocks < 4096 ? blocks : 4096), 256, 0, stream>>>(gate, up, stride, out,
                                                                                          hidden, total);
}

void launch_argmax(const float* logits, int64_t vocab, int batch, int32_t* next, CUstream_st* stream) {
  argmax_kernel<<<batch, 1024, 0, stream>>>(logits, vocab, next);
}

void launch_advance(const int32_t* next, int32_t* tokens, int32_t* pos, int batch, CUstream_st* stream) {
  advance_kernel<<<1, kWarp, 0, stream>>>(next, tokens, pos, batch);
}

}  // namespace lowbit::kernels::cuda
