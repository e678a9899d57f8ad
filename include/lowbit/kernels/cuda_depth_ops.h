// Launchers of the depth decoder's kernels (src/kernels/cuda/depth_ops.cu) for its GPU runtime
// (src/model/cuda/depth_cuda.cpp): each reproduces one operation of the CPU path (src/model/depth_decoder.cpp) bit
// for bit: the same fp32 operations in the same order, products and sums as separate IEEE operations (never
// contracted into FMA), FMA only where the CPU calls std::fma, and the same roundings to the compute dtype.
// Plain C++ with no lowbit includes, so that nvcc's front end only sees this header. Launches are unchecked and
// asynchronous on `stream` (capturable in a CUDA graph); callers check with check_last_error().
#pragma once

#include <cstdint>

#include "lowbit/kernels/cuda_model_ops.h"

namespace lowbit::kernels::cuda {

// Most activation rows (positions) a depth kernel takes.
inline constexpr int kDepthMaxRows = 32;

// A linear layer [n, k] in the CPU's panel layout: [ceil(n / 32), k, 32] values of `type`, zeros past n.
struct DepthPanels {
  const void* values = nullptr;
  ElemType type = ElemType::f32;
  int64_t n = 0, k = 0;
};

// out [rows, n] = round(x [rows, k] @ W.T): each output summed over k in order in fp32 from 0, then rounded to
// `round` (f32: not rounded). rows <= kDepthMaxRows.
void launch_depth_matmul(const float* x, int rows, const DepthPanels& w, ElemType round, float* out,
                         CUstream_st* stream);

// out [rows, d] = round((x - mean) / sqrt(var + 1e-5) * w + b): mean and biased variance summed in order in fp32
// and scaled by fp32(1 / d).
void launch_depth_layer_norm(const float* x, int rows, int64_t d, const float* w, const float* b, ElemType round,
                             float* out, CUstream_st* stream);

// x [rows, d] = round(x + y), row r of y at y + r * y_stride (0: one row for all).
void launch_depth_add(float* x, const float* y, int rows, int64_t d, int64_t y_stride, ElemType round,
                      CUstream_st* stream);

// x [count] = round(x / 2 (1 + erf(x / sqrt 2))) with MLX's CPU erf and exp.
void launch_depth_gelu(float* x, int64_t count, ElemType round, CUstream_st* stream);

// Attention of `queries` rows over heads of head_dim (d / head_dim of them): query i (at q + i * q_stride) sees keys
// 0 .. n - queries + i (key j at k + j * kv_stride, its value at v + j * kv_stride); out [queries, d]. `scale` is
// already rounded to `round`. n <= kDepthMaxRows.
void launch_depth_attend(const float* q, int64_t q_stride, const float* k, const float* v, int64_t kv_stride,
                         int queries, int n, int64_t d, int head_dim, float scale, ElemType round, float* out,
                         CUstream_st* stream);

// codes[level] = the top-k Gumbel sample from logits [2048]: argmax over i of (x_i >= the top_k-th largest x ? x_i
// : -inf) - noise[i], x = logits * inv_temp, first index on ties. `noise` [2048] is log(-log u), from the host.
void launch_depth_sample(const float* logits, const float* noise, float inv_temp, int top_k, int level, int32_t* codes,
                         CUstream_st* stream);

// out [d] = round(round(lo @ up.T) + level_emb[level + 1]) where lo [rank] is row level * 2048 + c of `lo_table`
// (values of `lo_type`, already rounded as the CPU's code_row gives them), c = force[level] when level > 0 and
// force[level] >= 0, else codes[level]; up_t is code_up transposed, [rank, d].
void launch_depth_embed(int level, const int32_t* codes, const int32_t* force, const void* lo_table, ElemType lo_type,
                        int64_t rank, const float* up_t, const float* level_emb, int64_t d, ElemType round, float* out,
                        CUstream_st* stream);

}  // namespace lowbit::kernels::cuda
