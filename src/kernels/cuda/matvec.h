// Launchers of the decode matvec kernels (batch 1..kMaxBatch), in device layouts (docs/CUDA.md). Plain C++
// with no lowbit includes, so that nvcc's front end only ever sees this header: matvec.cu implements the
// *_kernel launchers (no checks), matvec.cpp the checked entry points the .cpp adapters call.
#pragma once

#include <cstdint>

struct CUstream_st;

namespace lowbit::kernels::cuda {

// Weights a lane decodes per step; device rows of codes are padded to a multiple of it.
inline constexpr int kChunkWeights = 64;

enum class MetaType : uint8_t { bf16, f16, f32 };

// Affine codes: w = scale * q + bias per group of `group` inputs.
//  codes: [rows, kpad * bits / 32] u32, each row a little-endian LSB-first bit stream (as stored on disk),
//         kpad = cols rounded up to a multiple of kChunkWeights (zero codes beyond the stored padding);
//  meta:  [rows, kpad / group] pairs (scale, bias): one u32 (scale in the low half) for bf16/f16, or two
//         f32 words, so that one load fetches both.
struct AffineDevice {
  const uint32_t* codes = nullptr;
  const uint32_t* meta = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t kpad = 0;
  int bits = 3;    // 3, 5 or 6, or 2 in groups of 16 (other 2/4 bits use AffineMmaDevice, 8 bits CoalescedDevice)
  int group = 64;  // 16, 32, 64, 128, 256, ... (a power of two >= 16)
  MetaType meta_type = MetaType::bf16;
};

// Dense weights [rows, cols] row-major, rows padded to a multiple of kChunkWeights with zeros.
struct DenseDevice {
  const void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t kpad = 0;
  MetaType type = MetaType::bf16;  // element type: bf16, f16 or f32
};

// Coalesced layout (coalesced.cu) for affine 8 bits (bits = the width, group > 0, meta as AffineDevice)
// and dense bf16 (bits = 16, group = 0, no meta). Per row, steps of 128 * (32 / bits) columns; in step s, lane l
// owns columns {s * 128 * T + 128 t + 4 l + u : t < T = 32 / bits, u < 4} and stores their codes in 16 bytes at
// byte (s * 32 + l) * 16 of the row, weight 4 t + u at bit (4 t + u) * bits (LSB-first). kpad = cols rounded up
// to a whole step; codes past cols are zero.
struct CoalescedDevice {
  const void* codes = nullptr;
  const uint32_t* meta = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t kpad = 0;
  int bits = 8;   // 8, or 16 for dense bf16
  int group = 0;  // affine group size (a power of two >= 32), 0 for dense
  MetaType meta_type = MetaType::bf16;
};

// Columns of one coalesced step for a bit width.
inline int64_t coalesced_step_cols(int bits) { return 128 * (32 / bits); }

// Tensor-core layout (affine_mma.cu) for affine 2/4 bits, every batch 1..16: the codes are the A operands of
// mma.sync m16n8k16 (bf16) for 16-row tiles, so a lane's one 16-byte load holds its fragments for 16 / bits
// consecutive k16 steps (a k-block of 256 / bits columns):
//   codes: [row_tiles][kblocks][32 lanes][4 u32]; lane 4 g + t, k16 step j of the k-block, register i of the
//          fragment (rows g + 8 (i % 2), columns 2 t + 8 (i / 2) + e for e = 0, 1 of the step) sit in word
//          j (4 bits) or j / 2 (2 bits), at bits 4 i + 16 e (4 bits) or 2 (4 (j % 2) + i) + 16 e (2 bits);
//          row_tiles = rows rounded up to kMmaRows, kblocks = cols rounded up to a k-block; padding codes 0.
//   meta:  [row_tiles][kpad / group][16 rows] (scale, bias): one u32 (bf16 scale low, bf16 bias high) when
//          meta_f32 is false, else two f32 words; padding zero.
// Activations are split into bf16 hi + lo parts (x = hi + lo within 2^-17 relative), so results match an f32
// kernel's accuracy; each code q enters the product as an exact bf16 with an offset (affine_mma.cu: 2 + q / K) that
// is subtracted per group.
inline constexpr int kMmaRows = 32;  // rows per warp: two 16-row tiles share the activation fragments
struct AffineMmaDevice {
  const uint32_t* codes = nullptr;  // 16-byte aligned
  const uint32_t* meta = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_tiles = 0;  // multiple of kMmaRows / 16
  int64_t kblocks = 0;
  int bits = 4;     // 2 or 4
  int group = 64;   // 32, 64 or 128
  bool meta_f32 = false;
};
inline int64_t mma_kblock_cols(int bits) { return 256 / bits; }

// Affine 2/4 bits run batch 1 in the persistent kernel of affine_fma.cu (reading the tensor-core layout), and at
// 4 bits batches up to kFmaTcMaxBatch too (decoding on the tensor cores with x's B fragments in shared memory,
// every weight byte read once whatever the batch) where affine_fma_serves says they fit and pay off; other batches
// run the split-K kernel of affine_mma.cu. Two-plane has only the persistent kernel's CUDA-core decode: batches of
// up to kFmaMaxBatch rows per launch.
inline constexpr int kFmaMaxBatch = 4;
inline constexpr int kFmaTcMaxBatch = 8;
// The CUDA-core kernel keeps the activations' group sums [groups][batch] in shared memory.
inline bool fma_group_sums_fit(int64_t groups, int batch) { return groups * batch * 4 <= (40 << 10); }
// Whether the persistent kernel serves affine batch width `batch` (1, 2, 4, 8) of w (affine_fma.cu says when).
bool affine_fma_serves(const AffineMmaDevice& w, int batch);

// Two-plane (codec two_plane, group 128): w = s_b q_b + b_b + s_r q_r + b_r, each plane's 2-bit codes in the
// tensor-core layout of AffineMmaDevice (k-blocks of 128 columns = one group);
//   meta: [row_tiles][kblocks][16 rows]: two u32 (base scale | base bias << 16, residual scale | residual
//         bias << 16) of bf16 when meta_f32 is false, else four f32 words (s_b, b_b, s_r, b_r); padding zero.
struct TwoPlaneDevice {
  const uint32_t* base = nullptr;  // 16-byte aligned
  const uint32_t* residual = nullptr;
  const uint32_t* meta = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_tiles = 0;  // multiple of kMmaRows / 16
  int64_t kblocks = 0;
  bool meta_f32 = false;
};

// Grouped expert matmuls (Mixture-of-Experts decode): one launch multiplies several groups of activation rows, each
// by its own expert's weight, where the expert ids and the groups come from device memory (written by the router
// kernel of the same step), so the step needs no host round trip and stays one CUDA graph. Every expert of a role
// has the same layout (shape, bits, group, meta type); only its arrays' addresses differ, which a device table
// holds. Block z of the launch serves group z: rows start .. start + count - 1 of x and y (f32, rows of cols and
// rows elements), multiplied by expert[z]'s weight; a group with count 0 exits at once, so a launch sizes its grid
// for the most groups a step can have (batch x top_k) and reads only the chosen experts' weights.
struct ExpertArrays {
  const void* codes = nullptr;     // the layout's codes (or dense data)
  const uint32_t* meta = nullptr;  // the layout's (scale, bias) words; null for dense
};
struct ExpertGroups {
  const ExpertArrays* experts = nullptr;  // [n_experts], device
  const int32_t* expert = nullptr;        // [max_groups], device: the group's expert
  const int32_t* start = nullptr;         // [max_groups], device: its first row in x and y
  const int32_t* count = nullptr;         // [max_groups], device: its rows, 0..kMaxBatch (0: no group)
  // Null: group rows are rows start.. of x. Else row i of the group reads x row x_rows[start + i] (the launch
  // gathers the rows of its groups itself, so no gathered copy of x is written first).
  const int32_t* x_rows = nullptr;
  int max_groups = 0;
};

// The layout one role's experts share, as the grouped kernels take it (the pointers inside are ignored): dense
// f16/f32 (row-chunk kernel), dense bf16 and affine 8 (coalesced kernel), affine 2/4 (tensor-core kernel).
struct ExpertLayout {
  enum class Kind : uint8_t { dense, coalesced, affine_mma } kind = Kind::dense;
  DenseDevice dense;
  CoalescedDevice coalesced;
  AffineMmaDevice mma;
};

// Errc::unsupported naming `op` unless the layout is one the kernels take (the matmul and gemm entry points check).
void check_layout(const AffineDevice& w, const char* op);
void check_layout(const CoalescedDevice& w, const char* op);
void check_layout(const AffineMmaDevice& w, const char* op);
void check_layout(const TwoPlaneDevice& w, const char* op);

// y [m, rows] = x [m, cols] @ W^T, f32. Checks the batch (1 <= m <= kMaxBatch) and the layout, launches on
// `stream`, and reports a failed launch as Errc::internal.
void affine_matmul(const AffineDevice& w, const float* x, int m, float* y, CUstream_st* stream);
void dense_matmul(const DenseDevice& w, const float* x, int m, float* y, CUstream_st* stream);
void coalesced_matmul(const CoalescedDevice& w, const float* x, int m, float* y, CUstream_st* stream);
void affine_mma_matmul(const AffineMmaDevice& w, const float* x, int m, float* y, CUstream_st* stream);
void two_plane_matmul(const TwoPlaneDevice& w, const float* x, int m, float* y, CUstream_st* stream);

// y [rows of the groups, rows] = each group's x rows @ its expert's W^T; `batch` (checked: 1..kMaxBatch) bounds every
// group's count, which the kernels trust (the router kernel writes at most the step's batch). Checks the layout.
void grouped_matmul(const ExpertLayout& w, const ExpertGroups& g, const float* x, int batch, float* y,
                    CUstream_st* stream);

// Unchecked launches (matvec.cu); `batch` is the compiled batch width >= m (1, 2, 4, 8 or 16).
void launch_affine_kernel(const AffineDevice& w, const float* x, int m, int batch, float* y, CUstream_st* stream);
void launch_dense_kernel(const DenseDevice& w, const float* x, int m, int batch, float* y, CUstream_st* stream);
void launch_coalesced_kernel(const CoalescedDevice& w, const float* x, int m, int batch, float* y, CUstream_st* stream);
void launch_affine_mma_kernel(const AffineMmaDevice& w, const float* x, int m, int batch, float* y, CUstream_st* stream);
void launch_affine_fma_kernel(const AffineMmaDevice& w, const float* x, int m, int batch, float* y, CUstream_st* stream);
void launch_two_plane_kernel(const TwoPlaneDevice& w, const float* x, int m, int batch, float* y, CUstream_st* stream);
// Grouped launches (ExpertGroups above); `batch` is the compiled width >= every group's count.
void launch_grouped_dense_kernel(const DenseDevice& w, const ExpertGroups& g, const float* x, int batch, float* y,
                                 CUstream_st* stream);
void launch_grouped_coalesced_kernel(const CoalescedDevice& w, const ExpertGroups& g, const float* x, int batch,
                                     float* y, CUstream_st* stream);
void launch_grouped_affine_mma_kernel(const AffineMmaDevice& w, const ExpertGroups& g, const float* x, int batch,
                                      float* y, CUstream_st* stream);

}  // namespace lowbit::kernels::cuda
