// Coalesced decode matvec for affine 8 bits and dense bf16 (as 16 bits), batch
// 1..16. Device layout (prepare.cpp): per row, steps of 128 T columns (T = 32 / bits); in step s lane l owns the
// columns {s 128 T + 128 t + 4 l + u : t < T, u < 4} and their codes are its 16 bytes at offset (s 32 + l) 16,
// weight t 4 + u at bit (t 4 + u) bits. So a warp-wide 16-byte load of codes reads 512 contiguous bytes, and so
// does each float4 load of x; a group's scale and bias are warp-uniform (1-4 addresses).
#include "grouped.cuh"
#include "matvec.cuh"

namespace lowbit::kernels::cuda {
namespace {

template <int B>
__device__ __forceinline__ float code_value(const uint32_t (&w)[4], int j) {
  if constexpr (B == 16) {
    return j % 2 == 0 ? __uint_as_float(w[j / 2] << 16) : __uint_as_float(w[j / 2] & 0xFFFF0000u);
  } else {
    constexpr uint32_t kMask = (1u << B) - 1;
    const int bit = j * B;
    return __uint_as_float(0x3F800000u | (((w[bit / 32] >> (bit % 32)) & kMask) << (23 - B)));
  }
}

struct CoalescedArgs {
  const uint4* codes;
  const uint32_t* meta;  // affine only: (scale, bias) pairs, [rows, row_groups]
  int64_t row_steps;
  int64_t row_groups;
  int group_log2;
  bool f16, f32;
};

template <int M>
__host__ __device__ constexpr int coalesced_rows() {
  return M <= 2 ? 2 : 1;
}

// G: a grouped expert launch (matvec.h: ExpertGroups), block z multiplying its group's rows by its expert.
template <int B, int M, bool G>
__global__ void __launch_bounds__(kThreads, min_blocks<M>())
    coalesced_kernel(CoalescedArgs a, ExpertGroups groups, int64_t rows, int64_t cols, const float* __restrict__ x,
                     int m, float* __restrict__ y) {
  const int32_t* x_rows = nullptr;
  if constexpr (G) {
    const BlockGroup bg = group_of_block(groups);
    if (bg.count == 0) return;
    x_rows = bg.x_rows;
    if (!x_rows) x += bg.start * cols;
    y += bg.start * rows;
    m = bg.count;
    a.codes = static_cast<const uint4*>(bg.w.codes);
    a.meta = bg.w.meta;
  }
  constexpr int R = coalesced_rows<M>();
  constexpr int T = 32 / B;
  constexpr int kStepCols = 128 * T;
  constexpr int kUnroll = 2;
  const int lane = threadIdx.x % 32;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32) * R;
  if (row0 >= rows) return;
  const bool aligned = cols % 4 == 0;
  const float* xr[M];
#pragma unroll
  for (int i = 0; i < M; ++i) xr[i] = group_x_row(x, x_rows, i < m ? i : 0, cols);
  int64_t row[R];
#pragma unroll
  for (int r = 0; r < R; ++r) row[r] = min(row0 + r, rows - 1);

  float acc[R][M];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int i = 0; i < M; ++i) acc[r][i] = 0.0f;

  for (int64_t s0 = 0; s0 < a.row_steps; s0 += kUnroll) {
    uint32_t w[kUnroll][R][4];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (s0 + u < a.row_steps) {
          load_stream(reinterpret_cast<const uint32_t*>(a.codes + (row[r] * a.row_steps + s0 + u) * 32 + lane), w[u][r]);
        } else {
#pragma unroll
          for (int k = 0; k < 4; ++k) w[u][r][k] = 0;
        }
      }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (s0 + u >= a.row_steps) break;
#pragma unroll
      for (int t = 0; t < T; ++t) {
        const int64_t col = (s0 + u) * kStepCols + 128 * t + 4 * lane;
        float xv[M][4];
        load_x4<M>(xr, col, cols, aligned && col + 4 <= cols, xv);
        float scale_b[R], bias_b[R];
        if constexpr (B != 16) {
#pragma unroll
          for (int r = 0; r < R; ++r) {
            const int64_t index = row[r] * a.row_groups + (col >> a.group_log2);
            float scale, bias;
            if (a.f32) {
              scale = __uint_as_float(__ldg(a.meta + 2 * index));
              bias = __uint_as_float(__ldg(a.meta + 2 * index + 1));
            } else {
              const uint32_t pair = __ldg(a.meta + index);
              scale = half_to_float(pair & 0xFFFFu, a.f16);
              bias = half_to_float(pair >> 16, a.f16);
            }
            // w = scale q + bias = scale_b (1 + q / 2^B) + (bias - scale_b)
            scale_b[r] = scale * static_cast<float>(1 << B);
            bias_b[r] = bias - scale_b[r];
          }
        }
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const float f = code_value<B>(w[u][r], 4 * t + q);
            const float wv = B == 16 ? f : fmaf(scale_b[r], f, bias_b[r]);
#pragma unroll
            for (int i = 0; i < M; ++i) acc[r][i] = fmaf(wv, xv[i][q], acc[r][i]);
          }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int i = 0; i < M; ++i) {
      float v = acc[r][i];
#pragma unroll
      for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, off);
      if (lane == (r * M + i) % 32 && row0 + r < rows && i < m) y[i * rows + row0 + r] = v;
    }
}

template <int B, int M, bool G>
void launch_cm(const CoalescedArgs& a, const ExpertGroups& g, int64_t rows, int64_t cols, const float* x, int m,
               float* y, CUstream_st* s) {
  constexpr int R = coalesced_rows<M>();
  const int64_t blocks = (rows + kWarps * R - 1) / (kWarps * R);
  const dim3 grid(static_cast<unsigned>(blocks), 1, G ? static_cast<unsigned>(g.max_groups) : 1);
  coalesced_kernel<B, M, G><<<grid, kThreads, 0, s>>>(a, g, rows, cols, x, m, y);
}

template <int B, bool G>
void launch_c(const CoalescedArgs& a, const ExpertGroups& g, int64_t rows, int64_t cols, const float* x, int m,
              int batch, float* y, CUstream_st* s) {
  switch (batch) {
    case 1: return launch_cm<B, 1, G>(a, g, rows, cols, x, m, y, s);
    case 2: return launch_cm<B, 2, G>(a, g, rows, cols, x, m, y, s);
    case 4: return launch_cm<B, 4, G>(a, g, rows, cols, x, m, y, s);
    case 8: return launch_cm<B, 8, G>(a, g, rows, cols, x, m, y, s);
    default: return launch_cm<B, 16, G>(a, g, rows, cols, x, m, y, s);
  }
}

CoalescedArgs coalesced_args(const CoalescedDevice& w) {
  int log2 = 0;
  while ((1 << log2) < w.group) ++log2;
  return {static_cast<const uint4*>(w.codes), w.meta, w.kpad / (128 * (32 / w.bits)),
          w.group > 0 ? w.kpad / w.group : 0, log2, w.meta_type == MetaType::f16, w.meta_type == MetaType::f32};
}

}  // namespace

void launch_coalesced_kernel(const CoalescedDevice& w, const float* x, int m, int batch, float* y, CUstream_st* s) {
  const CoalescedArgs a = coalesced_args(w);
  switch (w.bits) {
    case 8: return launch_c<8, false>(a, {}, w.rows, w.cols, x, m, batch, y, s);
    default: return launch_c<16, false>(a, {}, w.rows, w.cols, x, m, batch, y, s);
  }
}

void launch_grouped_coalesced_kernel(const CoalescedDevice& w, const ExpertGroups& g, const float* x, int batch,
                                     float* y, CUstream_st* s) {
  const CoalescedArgs a = coalesced_args(w);
  switch (w.bits) {
    case 8: return launch_c<8, true>(a, g, w.rows, w.cols, x, batch, batch, y, s);
    default: return launch_c<16, true>(a, g, w.rows, w.cols, x, batch, batch, y, s);
  }
}

}  // namespace lowbit::kernels::cuda
