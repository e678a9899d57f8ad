// The decode step's kernels besides the matvecs (lowbit/kernels/cuda_model_ops.h). Each mirrors an op of the CPU
// interpreter (src/model/forward.cpp) in f32; only the order of sums differs, so logits agree to rounding.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>
#include <climits>

#include "lowbit/kernels/cuda_model_ops.h"

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

// v as the cache stores it (rounded to f16 or bf16 there).
__device__ __forceinline__ float stored(ElemType t, float v) {
  switch (t) {
    case ElemType::f16: return __half2float(__float2half_rn(v));
    case ElemType::bf16: return __bfloat162float(__float2bfloat16_rn(v));
    default: return v;
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

__global__ void embed_gather_kernel(const void* table, ElemType type, int64_t first, int64_t rows, int64_t dim,
                                    const int32_t* tokens, float scale, float* x) {
  const int b = blockIdx.x;
  const int64_t row = static_cast<int64_t>(tokens[b]) - first;
  const bool valid = row >= 0 && row < rows;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x)
    x[b * dim + j] = valid ? load_elem(table, type, row * dim + j) * scale : 0.0f;
}

__device__ __forceinline__ float4 add4(float4 a, float4 b) { return {a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w}; }

// One block per row: optional residual add in place, then out = norm(x) (kType: forward.cpp's rmsnorm, Gemma's
// (1 + w) gains, LayerNorm with an optional bias). Thread t holds float4s t, t + blockDim, ... (kVecs of them) in
// registers, so the row is read once, and loads its weights, x and delta together (one memory latency before the
// block sum instead of two). LayerNorm takes a second block sum over the registers for the variance.
template <int kVecs, NormType kType>
__global__ void __launch_bounds__(1024) norm_kernel(float* x, const float* delta, const float* weight,
                                                    const float* bias, float* out, int n4, float eps) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * n4;
  float4 w[kVecs], v[kVecs], bs[kVecs];
#pragma unroll
  for (int r = 0; r < kVecs; ++r) {
    const int j = threadIdx.x + r * blockDim.x;
    w[r] = j < n4 ? reinterpret_cast<const float4*>(weight)[j] : float4{};
    if (kType == NormType::rms_unit_offset) w[r] = add4(w[r], {1.0f, 1.0f, 1.0f, 1.0f});
    bs[r] = kType == NormType::layer && bias && j < n4 ? reinterpret_cast<const float4*>(bias)[j] : float4{};
  }
  float4* xr = reinterpret_cast<float4*>(x) + row;
  float sum = 0.0f;
#pragma unroll
  for (int r = 0; r < kVecs; ++r) {
    const int j = threadIdx.x + r * blockDim.x;
    v[r] = j < n4 ? xr[j] : float4{};
    if (delta && j < n4) v[r] = add4(v[r], reinterpret_cast<const float4*>(delta)[row + j]);
    sum += kType == NormType::layer ? v[r].x + v[r].y + v[r].z + v[r].w
                                    : v[r].x * v[r].x + v[r].y * v[r].y + v[r].z * v[r].z + v[r].w * v[r].w;
  }
  sum = block_sum(sum);
  const float n = static_cast<float>(4 * n4);
  float mean = 0.0f, inv;
  if (kType == NormType::layer) {
    mean = sum / n;
    float ss = 0.0f;
#pragma unroll
    for (int r = 0; r < kVecs; ++r) {
      const int j = threadIdx.x + r * blockDim.x;
      if (j >= n4) continue;
      const float a = v[r].x - mean, b = v[r].y - mean, c = v[r].z - mean, d = v[r].w - mean;
      ss += a * a + b * b + c * c + d * d;
    }
    inv = 1.0f / sqrtf(block_sum(ss) / n + eps);
  } else {
    inv = 1.0f / sqrtf(sum / n + eps);
  }
#pragma unroll
  for (int r = 0; r < kVecs; ++r) {
    const int j = threadIdx.x + r * blockDim.x;
    if (j >= n4) continue;
    if (delta) xr[j] = v[r];
    float4 o;
    if (kType == NormType::layer) {
      o = {(v[r].x - mean) * inv * w[r].x + bs[r].x, (v[r].y - mean) * inv * w[r].y + bs[r].y,
           (v[r].z - mean) * inv * w[r].z + bs[r].z, (v[r].w - mean) * inv * w[r].w + bs[r].w};
    } else {
      o = {w[r].x * (inv * v[r].x), w[r].y * (inv * v[r].y), w[r].z * (inv * v[r].z), w[r].w * (inv * v[r].w)};
    }
    reinterpret_cast<float4*>(out)[row + j] = o;
  }
}

__global__ void add_kernel(float* x, const float* delta, int64_t total) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] += delta[i];
}

__global__ void add_bias_kernel(float* y, const float* bias, int64_t n, int64_t total) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] += bias[i % n];
}

__global__ void softcap_kernel(float* x, int64_t total, float cap) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = cap * tanhf(x[i] / cap);
}

// Thread d's element of head `hh` of a q or k row `src` after bias, per-head norm and RoPE at position p
// (forward.cpp's order; the first rope_dims dimensions rotate, the rest pass); threads d >= head_dim get 0. Every
// thread of the block calls it (block sum, barriers); `head` is head_dim floats of shared memory.
__device__ float prepared_element(const QkvArgs& a, const float* src, const float* bias, const float* norm, int hh,
                                  int p, float* head) {
  const int d = threadIdx.x, hd = a.head_dim;
  const bool active = d < hd;
  float v = active ? src[hh * hd + d] + (bias ? bias[hh * hd + d] : 0.0f) : 0.0f;
  if (norm) {
    const float ss = block_sum(v * v);
    const float gain = active ? (a.norm_unit_offset ? 1.0f + norm[d] : norm[d]) : 0.0f;
    if (active) v = gain * ((1.0f / sqrtf(ss / static_cast<float>(hd) + a.eps)) * v);
  }
  if (active) head[d] = v;
  __syncthreads();
  float rotated = v;
  if (active && d < a.rope_dims) {
    const int half = a.rope_dims / 2;
    // RoPE: element d pairs with its partner; `first` is the pair's rotated-by-(c, -s) element.
    const int pair = a.interleaved ? d / 2 : d % half;
    const bool first = a.interleaved ? d % 2 == 0 : d < half;
    const int ia = a.interleaved ? 2 * pair : pair, ib = a.interleaved ? 2 * pair + 1 : pair + half;
    const float angle = static_cast<float>(p) * a.inv_freq[pair];
    const float c = cosf(angle), s = sinf(angle);
    const float x0 = head[ia], x1 = head[ib];
    rotated = first ? x0 * c - x1 * s : x0 * s + x1 * c;
  }
  __syncthreads();  // `head` may be reused
  return rotated;
}

// The attention score of a dot product q.k (QkvArgs: scale, then soft-capping). The attention kernels take
// kSoftcap as a template parameter, so that layers without soft-capping run no tanh code in their inner loops.
template <bool kSoftcap>
__device__ __forceinline__ float attention_score(const QkvArgs& a, float dot) {
  const float s = dot * a.scale;
  return kSoftcap ? a.softcap * tanhf(s / a.softcap) : s;
}

// The first position a query at p sees.
__device__ __forceinline__ int64_t window_start(const QkvArgs& a, int64_t p) {
  return a.window > 0 && p - a.window + 1 > 0 ? p - a.window + 1 : 0;
}

// Thread d's element of kv head `hh`'s value row after bias.
__device__ float value_element(const QkvArgs& a, int b, int hh) {
  const int d = threadIdx.x, hd = a.head_dim;
  return d < hd ? a.v[b * a.v_stride + hh * hd + d] + (a.v_bias ? a.v_bias[hh * hd + d] : 0.0f) : 0.0f;
}

// The cache's element index of (slot[b], position p), kv head hh, element d.
__device__ int64_t cache_index(const QkvArgs& a, const KvLayer& kv, int slot, int p, int hh, int d) {
  const int64_t kv_dim = static_cast<int64_t>(a.n_kv_heads) * a.head_dim;
  return (static_cast<int64_t>(slot) * kv.capacity + p) * kv_dim + hh * a.head_dim + d;
}

// One block per (row, head): q heads first, then kv heads. Thread d owns element d of the head.
__global__ void qkv_prepare_kernel(QkvArgs a, KvLayer kv, const int32_t* pos, const int32_t* slot) {
  extern __shared__ float head[];
  const int b = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
  const bool is_q = h < a.n_heads;
  const int hh = is_q ? h : h - a.n_heads;
  const int p = pos[b];
  const float rotated = is_q ? prepared_element(a, a.q + b * a.q_stride, a.q_bias, a.q_norm, hh, p, head)
                             : prepared_element(a, a.k + b * a.k_stride, a.k_bias, a.k_norm, hh, p, head);
  if (d >= a.head_dim) return;
  if (is_q) {
    a.q[b * a.q_stride + hh * a.head_dim + d] = rotated;
    return;
  }
  const int64_t at = cache_index(a, kv, slot[b], p, hh, d);
  store_elem(kv.keys, kv.type, at, rotated);
  store_elem(kv.values, kv.type, at, value_element(a, b, hh));
}

constexpr int kAttnWarps = 8;
constexpr int kAttnUnroll = 4;       // positions per warp whose keys and values load together
constexpr int kMaxDimsPerLane = 8;  // head_dim <= 256
constexpr int kPositionsPerSplit = kAttnWarps * kAttnUnroll;
// Fewest positions a split takes: below about four rounds per warp, the merge (a fence, an atomic and a second
// pass over the partials) costs more than the rounds it saves.
constexpr int64_t kMinSplitPositions = 4 * kPositionsPerSplit;

// Grid (head, row, split), the splits fixed by the cache capacity so that a step's launch shape does not depend
// on the positions (one graph serves every step). Row b's n positions (its window's part of 0..pos[b]) take only as
// many splits as give each at least kMinSplitPositions (a short context thus runs in one block per head with no merge),
// in equal chunks; the other blocks return at once. Warp w takes kAttnUnroll consecutive positions per round, all their
// key and value loads in flight at once: dot products by warp-wide sums, then one online-softmax update (running max m,
// sum l, weighted values acc). The block merges its warps; with several splits it stores (m, l, acc) in the scratch and
// the block that arrives last at the (row, head) counter merges the splits in split order (deterministic) and resets
// it.
template <bool kPrepare, bool kSoftcap>
__global__ void __launch_bounds__(kAttnWarps * kWarp) decode_attention_kernel(QkvArgs a, KvLayer kv, const int32_t* pos,
                                                                              const int32_t* slot, int max_splits,
                                                                              AttentionScratch scratch, float* out) {
  __shared__ float s_m[kAttnWarps], s_l[kAttnWarps];
  __shared__ float s_acc[kAttnWarps][kMaxDimsPerLane * kWarp];
  __shared__ float s_q[kMaxDimsPerLane * kWarp], s_k[kMaxDimsPerLane * kWarp], s_v[kMaxDimsPerLane * kWarp];
  __shared__ bool s_last;
  const int h = blockIdx.x, b = blockIdx.y, split = blockIdx.z;
  const int hd = a.head_dim;
  const int p = pos[b];
  const int64_t first = window_start(a, p), n = p + 1 - first;
  const int64_t wanted = (n + kMinSplitPositions - 1) / kMinSplitPositions;
  const int used = static_cast<int>(wanted < max_splits ? wanted : max_splits);
  if (split >= used) return;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int group = a.n_heads / a.n_kv_heads, kvh = h / group;
  const int64_t kv_dim = static_cast<int64_t>(a.n_kv_heads) * hd;
  const int64_t base = static_cast<int64_t>(slot[b]) * kv.capacity * kv_dim + kvh * hd;
  if (kPrepare) {  // qkv_prepare_kernel's work for this row's q head and kv head, the new k and v kept in s_k, s_v
    const int d = threadIdx.x;
    const float q = prepared_element(a, a.q + b * a.q_stride, a.q_bias, a.q_norm, h, p, s_q);
    const float k = prepared_element(a, a.k + b * a.k_stride, a.k_bias, a.k_norm, kvh, p, s_k);
    const float v = value_element(a, b, kvh);
    if (d < hd) {
      s_q[d] = q;
      s_k[d] = stored(kv.type, k);  // as a later step will read it from the cache
      s_v[d] = stored(kv.type, v);
      if (h % group == 0 && split == used - 1) {
        const int64_t at = cache_index(a, kv, slot[b], p, kvh, d);
        store_elem(kv.keys, kv.type, at, k);
        store_elem(kv.values, kv.type, at, v);
      }
    }
    __syncthreads();
  }
  float qr[kMaxDimsPerLane], acc[kMaxDimsPerLane];
#pragma unroll
  for (int i = 0; i < kMaxDimsPerLane; ++i) {
    const int d = lane + kWarp * i;
    qr[i] = d >= hd ? 0.0f : kPrepare ? s_q[d] : a.q[b * a.q_stride + h * hd + d];
    acc[i] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  const int64_t chunk = (n + used - 1) / used;
  const int64_t begin = first + split * chunk;
  const int64_t end = begin + chunk < p + 1 ? begin + chunk : p + 1;
  for (int64_t t0 = begin + warp * kAttnUnroll; t0 < end; t0 += kAttnWarps * kAttnUnroll) {
    float kr[kAttnUnroll][kMaxDimsPerLane], vr[kAttnUnroll][kMaxDimsPerLane];
#pragma unroll
    for (int u = 0; u < kAttnUnroll; ++u) {
      const int64_t row = base + (t0 + u) * kv_dim;
#pragma unroll
      for (int i = 0; i < kMaxDimsPerLane; ++i) {
        const int d = lane + kWarp * i;
        const bool load = t0 + u < end && d < hd, fresh = kPrepare && t0 + u == p;
        kr[u][i] = !load ? 0.0f : fresh ? s_k[d] : load_elem(kv.keys, kv.type, row + d);
        vr[u][i] = !load ? 0.0f : fresh ? s_v[d] : load_elem(kv.values, kv.type, row + d);
      }
    }
    float score[kAttnUnroll];
    float m_new = m;
#pragma unroll
    for (int u = 0; u < kAttnUnroll; ++u) {
      float dot = 0.0f;
#pragma unroll
      for (int i = 0; i < kMaxDimsPerLane; ++i) dot += qr[i] * kr[u][i];
      score[u] = t0 + u < end ? attention_score<kSoftcap>(a, warp_sum(dot)) : -INFINITY;
      m_new = fmaxf(m_new, score[u]);
    }
    const float corr = expf(m - m_new);  // m_new is finite: position t0 < end
    l *= corr;
#pragma unroll
    for (int i = 0; i < kMaxDimsPerLane; ++i) acc[i] *= corr;
#pragma unroll
    for (int u = 0; u < kAttnUnroll; ++u) {
      const float weight = expf(score[u] - m_new);
      l += weight;
#pragma unroll
      for (int i = 0; i < kMaxDimsPerLane; ++i) acc[i] += weight * vr[u][i];
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
  float* o_row = out + static_cast<int64_t>(b) * a.n_heads * hd + h * hd;
  const int64_t pair = static_cast<int64_t>(b) * a.n_heads + h;
  float* mine = scratch.partials + (pair * kAttentionSplits + split) * (hd + 2);
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float o = 0.0f;
    for (int w = 0; w < kAttnWarps; ++w)
      if (s_l[w] > 0.0f) o += s_acc[w][d] * expf(s_m[w] - m_all);
    if (used == 1) {
      o_row[d] = o / l_all;
    } else {
      mine[2 + d] = o;
    }
  }
  if (used == 1) return;
  if (threadIdx.x == 0) {
    mine[0] = m_all;
    mine[1] = l_all;
  }
  __threadfence();  // this block's partial is visible before it counts itself in
  __syncthreads();
  if (threadIdx.x == 0) s_last = atomicAdd(scratch.counters + pair, 1u) == static_cast<unsigned>(used - 1);
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  const float* parts = scratch.partials + pair * kAttentionSplits * (hd + 2);
  float m_max = -INFINITY;
  for (int s = 0; s < used; ++s)
    if (__ldcg(parts + s * (hd + 2) + 1) > 0.0f) m_max = fmaxf(m_max, __ldcg(parts + s * (hd + 2)));
  float l_sum = 0.0f;
  for (int s = 0; s < used; ++s) {
    const float ls = __ldcg(parts + s * (hd + 2) + 1);
    if (ls > 0.0f) l_sum += ls * expf(__ldcg(parts + s * (hd + 2)) - m_max);
  }
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float o = 0.0f;
    for (int s = 0; s < used; ++s) {
      const float* ps = parts + s * (hd + 2);
      if (__ldcg(ps + 1) > 0.0f) o += __ldcg(ps + 2 + d) * expf(__ldcg(ps) - m_max);
    }
    o_row[d] = o / l_sum;
  }
  if (threadIdx.x == 0) scratch.counters[pair] = 0u;
}

constexpr int kPrefillWarps = 8;
constexpr int kPrefillRowsPerWarp = kPrefillAttentionRows / kPrefillWarps;
constexpr int kKeyTile = kWarp;  // positions staged per round: lane t scores position t

__device__ __forceinline__ float warp_max(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Dynamic shared memory of the prefill attention: q rows [kPrefillAttentionRows][hd], keys [kKeyTile][hd + 2]
// (padded, so that lanes reading a float2 of one key row each hit distinct banks), values [kKeyTile][hd].
size_t prefill_attention_smem(int hd) {
  return sizeof(float) * (static_cast<size_t>(kPrefillAttentionRows) * hd + static_cast<size_t>(kKeyTile) * (hd + 2) +
                          static_cast<size_t>(kKeyTile) * hd);
}

// Grid (head, row tile), the tiles with the longest contexts first. The block stages its rows' q, then walks the
// cache positions (its first row's window start)..(its last row's position) in tiles of kKeyTile keys and values,
// converted to f32 in shared memory. Warp w owns rows w * kPrefillRowsPerWarp..: lane t computes position t's scores
// for all of them (each key element read once for every row, float2 loads: head_dim is even), then per row one
// online-softmax update (running max m, sum l) and the weighted values, lane owning dims lane + 32 i, each staged value
// read once for every row. At least 3 blocks per multiprocessor (80 registers, no spills; 102 uncapped would allow 2).
template <bool kSoftcap>
__global__ void __launch_bounds__(kPrefillWarps * kWarp, 3)
    prefill_attention_kernel(QkvArgs a, KvLayer kv, int32_t slot, int64_t first_pos, int batch, float* out) {
  extern __shared__ float smem[];
  const int hd = a.head_dim, key_stride = hd + 2;
  float* s_q = smem;
  float* s_k = s_q + kPrefillAttentionRows * hd;
  float* s_v = s_k + kKeyTile * key_stride;
  const int h = blockIdx.x;
  const int row0 = (gridDim.y - 1 - blockIdx.y) * kPrefillAttentionRows;
  const int rows = batch - row0 < kPrefillAttentionRows ? batch - row0 : kPrefillAttentionRows;
  const int kvh = h / (a.n_heads / a.n_kv_heads);
  const int64_t kv_dim = static_cast<int64_t>(a.n_kv_heads) * hd;
  const int64_t base = static_cast<int64_t>(slot) * kv.capacity * kv_dim + kvh * hd;
  // the positions the block's last row attends to: up to its own, or (not causal) the pass's last
  const int64_t end = a.causal ? first_pos + row0 + rows : first_pos + batch;
  const int64_t start = window_start(a, first_pos + row0);  // the first position the block's first row sees
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  for (int r = warp; r < kPrefillAttentionRows; r += kPrefillWarps)
    for (int d = lane; d < hd; d += kWarp)
      s_q[r * hd + d] = r < rows ? a.q[static_cast<int64_t>(row0 + r) * a.q_stride + h * hd + d] : 0.0f;
  const int my_row0 = warp * kPrefillRowsPerWarp;
  int64_t last[kPrefillRowsPerWarp];   // the last position row r attends to; -1 for rows past the batch
  int64_t first[kPrefillRowsPerWarp];  // the first one (its window's start)
  float m[kPrefillRowsPerWarp], l[kPrefillRowsPerWarp], acc[kPrefillRowsPerWarp][kMaxDimsPerLane];
#pragma unroll
  for (int r = 0; r < kPrefillRowsPerWarp; ++r) {
    last[r] = my_row0 + r >= rows ? -1 : a.causal ? first_pos + row0 + my_row0 + r : first_pos + batch - 1;
    first[r] = window_start(a, last[r]);
    m[r] = -INFINITY;
    l[r] = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxDimsPerLane; ++i) acc[r][i] = 0.0f;
  }
  for (int64_t t0 = start; t0 < end; t0 += kKeyTile) {
    __syncthreads();  // q staged (first round); the previous tile's keys and values read
    for (int t = warp; t < kKeyTile; t += kPrefillWarps) {
      const bool in = t0 + t < end;
      const int64_t at = base + (t0 + t) * kv_dim;
      for (int d = lane; d < hd; d += kWarp) {
        s_k[t * key_stride + d] = in ? load_elem(kv.keys, kv.type, at + d) : 0.0f;
        s_v[t * hd + d] = in ? load_elem(kv.values, kv.type, at + d) : 0.0f;
      }
    }
    __syncthreads();
    float p[kPrefillRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kPrefillRowsPerWarp; ++r) p[r] = 0.0f;
    const float2* key = reinterpret_cast<const float2*>(s_k + lane * key_stride);
    const float2* q = reinterpret_cast<const float2*>(s_q + my_row0 * hd);
#pragma unroll 4
    for (int d2 = 0; d2 < hd / 2; ++d2) {
      const float2 k = key[d2];
#pragma unroll
      for (int r = 0; r < kPrefillRowsPerWarp; ++r) {
        const float2 qr = q[r * hd / 2 + d2];
        p[r] = fmaf(qr.y, k.y, fmaf(qr.x, k.x, p[r]));
      }
    }
    const int64_t t = t0 + lane;
#pragma unroll
    for (int r = 0; r < kPrefillRowsPerWarp; ++r) {
      const float score = t <= last[r] && t >= first[r] ? attention_score<kSoftcap>(a, p[r]) : -INFINITY;
      const float m_new = fmaxf(m[r], warp_max(score));
      p[r] = score == -INFINITY ? 0.0f : expf(score - m_new);
      const float corr = m[r] == -INFINITY ? 0.0f : expf(m[r] - m_new);
      l[r] = l[r] * corr + warp_sum(p[r]);
#pragma unroll
      for (int i = 0; i < kMaxDimsPerLane; ++i) acc[r][i] *= corr;
      m[r] = m_new;
    }
    const int tile = end - t0 < kKeyTile ? static_cast<int>(end - t0) : kKeyTile;
    for (int u = 0; u < tile; ++u) {
      float weight[kPrefillRowsPerWarp];
#pragma unroll
      for (int r = 0; r < kPrefillRowsPerWarp; ++r) weight[r] = __shfl_sync(0xffffffffu, p[r], u);
#pragma unroll
      for (int i = 0; i < kMaxDimsPerLane; ++i) {
        const int d = lane + kWarp * i;
        if (d >= hd) break;
        const float v = s_v[u * hd + d];
#pragma unroll
        for (int r = 0; r < kPrefillRowsPerWarp; ++r) acc[r][i] += weight[r] * v;
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kPrefillRowsPerWarp; ++r) {
    if (last[r] < 0) continue;
    float* o_row = out + (static_cast<int64_t>(row0) + my_row0 + r) * a.n_heads * hd + h * hd;
#pragma unroll
    for (int i = 0; i < kMaxDimsPerLane; ++i) {
      const int d = lane + kWarp * i;
      if (d < hd) o_row[d] = acc[r][i] / l[r];
    }
  }
}

__device__ __forceinline__ float silu(float g) { return g * (1.0f / (1.0f + expf(-g))); }

// gelu with the tanh approximation (Gemma's gelu_pytorch_tanh).
__device__ __forceinline__ float gelu_tanh(float g) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  return 0.5f * g * (1.0f + tanhf(kSqrt2OverPi * (g + 0.044715f * g * g * g)));
}

__device__ __forceinline__ float gelu_erf(float u) { return 0.5f * u * (1.0f + erff(u * 0.7071067811865476f)); }

template <ActType kType>
__global__ void activation_kernel(const float* gate, const float* up, const float* up_bias, int64_t stride,
                                  float* out, int64_t hidden, int64_t total) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = i / hidden, j = i % hidden;
    const float u = up[b * stride + j] + (up_bias ? up_bias[j] : 0.0f);
    if (kType == ActType::gelu_erf) {
      out[i] = gelu_erf(u);
    } else {
      const float g = gate[b * stride + j];
      out[i] = (kType == ActType::swiglu ? silu(g) : gelu_tanh(g)) * u;
    }
  }
}

// One block: warp b routes row b (softmax, then top_k rounds of a warp-wide best-of-the-unchosen with the chosen
// set as bit masks in shared memory); then every thread numbers pairs by counting the pairs before them in
// (expert, row) order (at most kMaxBatch * kMoeMaxTopK = 1024 pairs, so O(pairs) per pair is cheap and needs no sort).
constexpr int kMoeRouteThreads = kMoeMaxRows * kWarp;
constexpr int kMoeMaxPairs = kMoeMaxRows * kMoeMaxTopK;

__global__ void __launch_bounds__(kMoeRouteThreads)
    moe_route_kernel(const float* logits, int n_experts, int top_k, bool renormalise, int batch, MoeRoute r) {
  __shared__ uint32_t chosen[kMoeMaxRows][kMoeMaxExperts / 32];
  __shared__ int32_t pair_expert[kMoeMaxPairs];
  __shared__ float pair_weight[kMoeMaxPairs];
  __shared__ uint8_t leader[kMoeMaxPairs];
  __shared__ int groups;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int pairs = batch * top_k, words = (n_experts + 31) / 32;
  if (threadIdx.x == 0) groups = 0;
  if (warp < batch) {
    const float* l = logits + static_cast<int64_t>(warp) * n_experts;
    for (int w = lane; w < words; w += kWarp) chosen[warp][w] = 0;
    float mx = -FLT_MAX;
    for (int e = lane; e < n_experts; e += kWarp) mx = fmaxf(mx, l[e]);
    for (int o = kWarp / 2; o > 0; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0.0f;
    for (int e = lane; e < n_experts; e += kWarp) sum += expf(l[e] - mx);
    sum = warp_sum(sum);
    __syncwarp();
    float chosen_sum = 0.0f;  // in choice order, as the CPU sums it
    for (int j = 0; j < top_k; ++j) {
      float best = -1.0f;
      int best_e = INT_MAX;
      for (int e = lane; e < n_experts; e += kWarp) {
        if (chosen[warp][e / 32] & (1u << (e % 32))) continue;
        float p = expf(l[e] - mx) / sum;
        if (!(p >= 0.0f)) p = -0.5f;  // NaN logits: still a valid expert, after every number
        if (p > best || (p == best && e < best_e)) best = p, best_e = e;
      }
      for (int o = kWarp / 2; o > 0; o /= 2) {
        const float ov = __shfl_xor_sync(0xffffffffu, best, o);
        const int oe = __shfl_xor_sync(0xffffffffu, best_e, o);
        if (ov > best || (ov == best && oe < best_e)) best = ov, best_e = oe;
      }
      if (lane == 0) {
        chosen[warp][best_e / 32] |= 1u << (best_e % 32);
        pair_expert[warp * top_k + j] = best_e;
        pair_weight[warp * top_k + j] = best;
      }
      chosen_sum += best;
      __syncwarp();
    }
    if (renormalise)
      for (int j = lane; j < top_k; j += kWarp) pair_weight[warp * top_k + j] /= chosen_sum;
  }
  __syncthreads();
  // Pair i (row i / top_k): its number in (expert, row) order, its place in its row's expert order, its expert's
  // pair count, and whether it leads its expert's group (no earlier row chose that expert).
  int rank[kMoeMaxPairs / kMoeRouteThreads], count[kMoeMaxPairs / kMoeRouteThreads];
  for (int k = 0, i = threadIdx.x; i < pairs; ++k, i += kMoeRouteThreads) {
    const int e = pair_expert[i], b = i / top_k;
    int before = 0, in_row = 0, same = 0;
    bool leads = true;
    for (int q = 0; q < pairs; ++q) {
      const int eq = pair_expert[q], bq = q / top_k;
      before += eq < e || (eq == e && bq < b);
      in_row += bq == b && eq < e;
      same += eq == e;
      leads = leads && !(eq == e && bq < b);
    }
    rank[k] = before;
    count[k] = same;
    leader[i] = leads ? 1 : 0;
    r.pair_row[before] = b;
    r.slot[b * top_k + in_row] = e >= r.expert_begin && e < r.expert_end ? before : -1;
    r.weight[b * top_k + in_row] = pair_weight[i];
  }
  __syncthreads();
  // A leader's group is the number of distinct experts below its own.
  for (int k = 0, i = threadIdx.x; i < pairs; ++k, i += kMoeRouteThreads) {
    if (!leader[i]) continue;
    const int e = pair_expert[i];
    int group = 0;
    for (int q = 0; q < pairs; ++q) group += leader[q] && pair_expert[q] < e;
    const bool held = e >= r.expert_begin && e < r.expert_end;
    r.group_expert[group] = held ? e - r.expert_begin : 0;
    r.group_start[group] = rank[k];
    r.group_count[group] = held ? count[k] : 0;
    atomicAdd(&groups, 1);
  }
  __syncthreads();
  for (int z = groups + threadIdx.x; z < pairs; z += kMoeRouteThreads) r.group_count[z] = 0;
}

__global__ void moe_combine_kernel(const float* y, int64_t dim, const int32_t* slot, const float* weight, int top_k,
                                   float* out) {
  const int b = blockIdx.x;
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < top_k; ++j)
      if (const int s = slot[b * top_k + j]; s >= 0)
        acc += weight[b * top_k + j] * y[static_cast<int64_t>(s) * dim + d];
    out[static_cast<int64_t>(b) * dim + d] = acc;
  }
}

constexpr int kArgmaxThreads = 256;
constexpr int kArgmaxVecs = 8;  // float4s per thread
constexpr int64_t kArgmaxChunk = int64_t{kArgmaxThreads} * kArgmaxVecs * 4;

// (value, index) pairs: the larger value wins, the lower index on ties; NaN never wins (as the CPU argmax).
__device__ __forceinline__ void keep_best(float& v, int& i, float ov, int oi) {
  if (ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

// Grid (chunk, row): each block finds the best of its kArgmaxChunk logits with all its loads in flight, and the
// block that arrives last at the row's counter merges the chunks' winners and resets the counter. With tokens,
// that block also feeds the winner back for the next greedy step: tokens[b] = next[b], pos[b] += 1.
__global__ void __launch_bounds__(kArgmaxThreads) argmax_kernel(const float* logits, int64_t vocab,
                                                                ArgmaxScratch scratch, int32_t* next,
                                                                int32_t* tokens, int32_t* pos) {
  __shared__ float s_v[kArgmaxThreads / kWarp];
  __shared__ int s_i[kArgmaxThreads / kWarp];
  __shared__ bool s_last;
  const int b = blockIdx.y, chunk = blockIdx.x, chunks = gridDim.x;
  const float* row = logits + b * vocab;
  const int64_t begin = chunk * kArgmaxChunk, end = begin + kArgmaxChunk < vocab ? begin + kArgmaxChunk : vocab;
  float v = -INFINITY;
  int idx = INT_MAX;
  if (vocab % 4 == 0) {  // rows stay 16-byte aligned: float4 loads
    float4 q[kArgmaxVecs];
#pragma unroll
    for (int r = 0; r < kArgmaxVecs; ++r) {
      const int64_t j = begin + 4 * (threadIdx.x + r * kArgmaxThreads);
      q[r] = j < end ? *reinterpret_cast<const float4*>(row + j) : float4{};
    }
#pragma unroll
    for (int r = 0; r < kArgmaxVecs; ++r) {
      const int64_t j = begin + 4 * (threadIdx.x + r * kArgmaxThreads);
      if (j >= end) continue;
      const int base = static_cast<int>(j);
      keep_best(v, idx, q[r].x, base);
      keep_best(v, idx, q[r].y, base + 1);
      keep_best(v, idx, q[r].z, base + 2);
      keep_best(v, idx, q[r].w, base + 3);
    }
  } else {
    for (int64_t j = begin + threadIdx.x; j < end; j += kArgmaxThreads) keep_best(v, idx, row[j], static_cast<int>(j));
  }
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const auto warp_best = [&] {
    for (int o = kWarp / 2; o > 0; o /= 2)
      keep_best(v, idx, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, idx, o));
  };
  warp_best();
  if (lane == 0) {
    s_v[warp] = v;
    s_i[warp] = idx;
  }
  __syncthreads();
  if (warp != 0) return;
  v = lane < kArgmaxThreads / kWarp ? s_v[lane] : -INFINITY;
  idx = lane < kArgmaxThreads / kWarp ? s_i[lane] : INT_MAX;
  warp_best();
  if (chunks > 1) {
    const int64_t at = static_cast<int64_t>(b) * chunks + chunk;
    if (lane == 0) {
      scratch.values[at] = v;
      scratch.indices[at] = idx;
      __threadfence();  // this block's winner is visible before it counts itself in
      s_last = atomicAdd(scratch.counters + b, 1u) == static_cast<unsigned>(chunks - 1);
    }
    __syncwarp();
    if (!s_last) return;
    __threadfence();
    v = -INFINITY;
    idx = INT_MAX;
    for (int c = lane; c < chunks; c += kWarp) {
      const int64_t from = static_cast<int64_t>(b) * chunks + c;
      keep_best(v, idx, __ldcg(scratch.values + from), __ldcg(scratch.indices + from));
    }
    warp_best();
  }
  if (lane == 0) {
    const int32_t winner = idx == INT_MAX ? 0 : idx;
    next[b] = winner;
    if (tokens) {
      tokens[b] = winner;
      pos[b] += 1;
    }
    if (chunks > 1) scratch.counters[b] = 0u;
  }
}

__global__ void conv3x3s2_patches_kernel(const float* in, int64_t h, int64_t w, int64_t ci, float* patches) {
  const int64_t ow = (w + 1) / 2, k = ci * 9, total = (h + 1) / 2 * ow * k;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = idx / k, col = idx % k, i = col / 9, ky = col % 9 / 3, kx = col % 3;
    const int64_t iy = 2 * (row / ow) + ky - 1, ix = 2 * (row % ow) + kx - 1;
    patches[idx] = iy >= 0 && iy < h && ix >= 0 && ix < w ? in[(iy * w + ix) * ci + i] : 0.0f;
  }
}

__global__ void conv_time_rows_kernel(const float* in, int64_t f, int64_t w, int64_t ch, int64_t n, float* rows) {
  const int64_t total = n * ch * f;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = idx / (ch * f), c = idx / f % ch, q = idx % f;
    rows[idx] = in[(q * w + t) * ch + c];
  }
}

// Blocks of 256 threads for `total` elements of a grid-stride loop, at most 4096.
unsigned elementwise_blocks(int64_t total) {
  const int64_t blocks = (total + 255) / 256;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks < 4096 ? blocks : 4096);
}

int block_for(int64_t n) {
  int threads = kWarp;
  while (threads < n && threads < 1024) threads *= 2;
  return threads;
}

}  // namespace

void launch_embed_gather(const void* table, ElemType type, int64_t first, int64_t rows, int64_t dim,
                         const int32_t* tokens, float scale, int batch, float* x, CUstream_st* stream) {
  const int threads = block_for(dim) > 256 ? 256 : block_for(dim);
  embed_gather_kernel<<<batch, threads, 0, stream>>>(table, type, first, rows, dim, tokens, scale, x);
}

bool norm_supports(int64_t n) { return n > 0 && n % 4 == 0 && n <= 4 * 4 * 1024; }

namespace {

template <NormType kType>
void launch_norm_as(float* x, const float* delta, const float* weight, const float* bias, float* out, int batch,
                    int n4, float eps, CUstream_st* stream) {
  const int threads = block_for(n4), vecs = (n4 + threads - 1) / threads;
  const auto kernel = vecs == 1 ? norm_kernel<1, kType> : vecs == 2 ? norm_kernel<2, kType> : norm_kernel<4, kType>;
  kernel<<<batch, threads, 0, stream>>>(x, delta, weight, bias, out, n4, eps);
}

}  // namespace

void launch_norm(NormType type, float* x, const float* delta, const float* weight, const float* bias, float* out,
                 int batch, int64_t n, float eps, CUstream_st* stream) {
  const int n4 = static_cast<int>(n / 4);
  switch (type) {
    case NormType::rms: return launch_norm_as<NormType::rms>(x, delta, weight, bias, out, batch, n4, eps, stream);
    case NormType::rms_unit_offset:
      return launch_norm_as<NormType::rms_unit_offset>(x, delta, weight, bias, out, batch, n4, eps, stream);
    case NormType::layer: return launch_norm_as<NormType::layer>(x, delta, weight, bias, out, batch, n4, eps, stream);
  }
}

void launch_add(float* x, const float* delta, int batch, int64_t n, CUstream_st* stream) {
  add_kernel<<<elementwise_blocks(batch * n), 256, 0, stream>>>(x, delta, batch * n);
}

void launch_add_bias(float* y, const float* bias, int batch, int64_t n, CUstream_st* stream) {
  add_bias_kernel<<<elementwise_blocks(batch * n), 256, 0, stream>>>(y, bias, n, batch * n);
}

void launch_softcap(float* x, int64_t count, float cap, CUstream_st* stream) {
  softcap_kernel<<<elementwise_blocks(count), 256, 0, stream>>>(x, count, cap);
}

void launch_qkv_prepare(const QkvArgs& a, const KvLayer& kv, const int32_t* pos, const int32_t* slot, int batch,
                        CUstream_st* stream) {
  const dim3 grid(static_cast<unsigned>(batch), static_cast<unsigned>(a.n_heads + a.n_kv_heads));
  const int threads = (a.head_dim + kWarp - 1) / kWarp * kWarp;
  qkv_prepare_kernel<<<grid, threads, a.head_dim * sizeof(float), stream>>>(a, kv, pos, slot);
}

int attention_splits(int64_t capacity) {
  const int64_t splits = (capacity + kMinSplitPositions - 1) / kMinSplitPositions;
  return static_cast<int>(splits < 1 ? 1 : (splits > kAttentionSplits ? kAttentionSplits : splits));
}

void launch_decode_attention(const QkvArgs& a, const KvLayer& kv, const int32_t* pos, const int32_t* slot, int batch,
                             bool prepare, const AttentionScratch& scratch, float* out, CUstream_st* stream) {
  const int splits = attention_splits(kv.capacity);
  const dim3 grid(static_cast<unsigned>(a.n_heads), static_cast<unsigned>(batch), static_cast<unsigned>(splits));
  const bool softcap = a.softcap > 0.0f;
  const auto kernel = prepare ? (softcap ? decode_attention_kernel<true, true> : decode_attention_kernel<true, false>)
                              : (softcap ? decode_attention_kernel<false, true> : decode_attention_kernel<false, false>);
  kernel<<<grid, kAttnWarps * kWarp, 0, stream>>>(a, kv, pos, slot, splits, scratch, out);
}

void launch_prefill_attention(const QkvArgs& a, const KvLayer& kv, int32_t slot, int64_t first_pos, int batch,
                              float* out, CUstream_st* stream) {
  // Above 48 KiB (head_dim > 124) a kernel must opt in to more dynamic shared memory (a host-side call; a
  // failure shows in the caller's check_last_error, as the launch's would).
  const size_t smem = prefill_attention_smem(a.head_dim);
  const auto kernel = a.softcap > 0.0f ? prefill_attention_kernel<true> : prefill_attention_kernel<false>;
  if (smem > 48 * 1024)
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  const dim3 grid(static_cast<unsigned>(a.n_heads),
                  static_cast<unsigned>((batch + kPrefillAttentionRows - 1) / kPrefillAttentionRows));
  kernel<<<grid, kPrefillWarps * kWarp, smem, stream>>>(a, kv, slot, first_pos, batch, out);
}

void launch_conv3x3s2_patches(const float* in, int64_t h, int64_t w, int64_t ci, float* patches, CUstream_st* stream) {
  const int64_t total = (h + 1) / 2 * ((w + 1) / 2) * ci * 9;
  conv3x3s2_patches_kernel<<<elementwise_blocks(total), 256, 0, stream>>>(in, h, w, ci, patches);
}

void launch_conv_time_rows(const float* in, int64_t f, int64_t w, int64_t ch, int64_t n, float* rows,
                           CUstream_st* stream) {
  conv_time_rows_kernel<<<elementwise_blocks(n * ch * f), 256, 0, stream>>>(in, f, w, ch, n, rows);
}

void launch_activation(ActType type, const float* gate, const float* up, const float* up_bias, int64_t stride,
                       float* out, int batch, int64_t hidden, CUstream_st* stream) {
  const int64_t total = batch * hidden;
  const auto kernel = type == ActType::swiglu       ? activation_kernel<ActType::swiglu>
                      : type == ActType::geglu_tanh ? activation_kernel<ActType::geglu_tanh>
                                                    : activation_kernel<ActType::gelu_erf>;
  kernel<<<elementwise_blocks(total), 256, 0, stream>>>(gate, up, up_bias, stride, out, hidden, total);
}

void launch_moe_route(const float* logits, int n_experts, int top_k, bool renormalise, int batch,
                      const MoeRoute& route, CUstream_st* stream) {
  moe_route_kernel<<<1, kMoeRouteThreads, 0, stream>>>(logits, n_experts, top_k, renormalise, batch, route);
}

void launch_moe_combine(const float* y, int64_t dim, const MoeRoute& route, int batch, int top_k, float* out,
                        CUstream_st* stream) {
  moe_combine_kernel<<<batch, block_for(dim) > 256 ? 256 : block_for(dim), 0, stream>>>(y, dim, route.slot,
                                                                                       route.weight, top_k, out);
}

int argmax_blocks(int64_t vocab) { return static_cast<int>((vocab + kArgmaxChunk - 1) / kArgmaxChunk); }

void launch_argmax(const float* logits, int64_t vocab, int batch, const ArgmaxScratch& scratch, int32_t* next,
                   int32_t* tokens, int32_t* pos, CUstream_st* stream) {
  const dim3 grid(static_cast<unsigned>(argmax_blocks(vocab)), static_cast<unsigned>(batch));
  argmax_kernel<<<grid, kArgmaxThreads, 0, stream>>>(logits, vocab, scratch, next, tokens, pos);
}

}  // namespace lowbit::kernels::cuda
