// The "row block" kernel layout shared by the affine, offset_scale and two_plane CPU kernels, and the kernels
// over it (batch-1 matvec on integer dot products, batched matmul on decoded tiles, row gather).
//
// Layout: rows in blocks of kBlockRows = 16 (the last block padded with zero rows), and per block and weight
// group g one record holding the 16 rows' codes of the group, then the group's metadata for the 16 rows:
//   for each 32-column chunk of the group, for each plane (lo, then hi), for each of the plane's `width` words
//   per row and chunk: 16 uint32 words, one per row of the block (64 bytes);
//   then the metadata slots, each 16 values of meta_dtype (one per row).
// A group of 16 columns (GGUF's Q2_K, Q3_K and Q6_K) holds half a chunk: the first width / 2 words of each plane,
// which hold extractions 0..3 (columns 0..15) for widths 2, 4 and 8; so groups of 16 need planes of those widths.
// So a thread that owns a range of blocks reads one sequential stream (codes and metadata interleaved), and a
// 64-byte load holds one word of each of 16 rows. Within a plane of width p (1, 2, 4 or 8 bits), field f of byte
// b of word j of a chunk holds column 4 (j 8/p + f) + b: "extraction" k = j 8/p + f (a shift and a mask) gives
// each row's codes of columns 4k .. 4k + 3 of the chunk in its four bytes, in column order.
//
// Batch-1 matvec multiplies those bytes with the activations as integers (AVX-512 VNNI vpdpbusd: 64 weights per
// instruction, no int-to-float conversion per weight). The activations are quantized per group to 16-bit
// integers X = round(x / f), f = (the group's largest |x|) / kLargestX, as two signed 8-bit digits
// X = d1 2^8 + d0; per group and row the two integer dot products are combined in f32 and scaled by the
// group's scale times f.
// The bias term uses the same X, so the result is W x' (accumulated in f32) for x' = X f: each activation moved
// by at most f / 2 = 2^-16 (1 + 2e-4) of its group's largest |x|, far finer than bf16 activations (2^-9 of |x|).
// The batched path multiplies in f32 without that rounding.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>

#include <hwy/aligned_allocator.h>

#include "lowbit/core/dtype.h"
#include "lowbit/kernels/cpu.h"

namespace lowbit::kernels {

inline constexpr int64_t kBlockRows = 16;

// What a group's metadata slots hold, and how a weight follows from its code q = lo | hi << lo_bits:
enum class BlockMeta {
  scale_bias,    // {scale, bias}:          w = scale q + bias                        (affine)
  scale_offset,  // {scale}:                w = scale (q - offset)                    (offset_scale)
  two_scales,    // {scale0, scale1, bias}: w = scale0 lo + scale1 hi + bias, planes apart (two_plane)
};

struct BlockMatrix {
  int lo_bits = 0;  // 1, 2, 4 or 8
  int hi_bits = 0;  // 0, 1, 2 (code = lo | hi << lo_bits), or the second plane's width for two_scales
  BlockMeta meta = BlockMeta::scale_bias;
  DType meta_dtype = DType::F32;  // F32, F16 or BF16
  float offset = 0.0f;            // scale_offset
  int64_t rows = 0, cols = 0, padded_cols = 0, group_size = 0;  // group_size: 16, 32, 64 or 128
  hwy::AlignedFreeUniquePtr<uint8_t[]> records;                // [blocks, groups, record_bytes()], 64-aligned

  // Allocates zeroed records; throws Errc::internal on an unsupported shape.
  BlockMatrix(int lo_bits, int hi_bits, BlockMeta meta, DType meta_dtype, int64_t rows, int64_t cols,
              int64_t padded_cols, int64_t group_size);

  int64_t blocks() const { return (rows + kBlockRows - 1) / kBlockRows; }
  int64_t groups() const { return padded_cols / group_size; }
  int meta_slots() const { return meta == BlockMeta::scale_offset ? 1 : meta == BlockMeta::scale_bias ? 2 : 3; }
  int64_t chunk_cols() const { return std::min<int64_t>(group_size, 32); }  // columns of one chunk's words
  int64_t chunk_bytes() const { return chunk_cols() * (lo_bits + hi_bits) * 2; }
  int64_t code_bytes() const { return group_size * (lo_bits + hi_bits) * 2; }
  int64_t record_bytes() const { return code_bytes() + meta_slots() * kBlockRows * int64_t(dtype_size(meta_dtype)); }
  uint64_t bytes() const { return uint64_t(blocks()) * uint64_t(groups()) * uint64_t(record_bytes()); }
  uint8_t* record(int64_t block, int64_t g) { return records.get() + (block * groups() + g) * record_bytes(); }
  const uint8_t* record(int64_t block, int64_t g) const {
    return records.get() + (block * groups() + g) * record_bytes();
  }

  // Sets the codes of row r from one low-plane and one high-plane code per padded column (hi unused when
  // hi_bits == 0). Records start zeroed; each row is set once.
  void set_row_codes(int64_t r, const uint8_t* lo, const uint8_t* hi);
  // Sets metadata slot `slot` of row r, group g from one value of meta_dtype.
  void set_meta(int64_t r, int64_t g, int slot, const std::byte* value);
  // Weight (r, c) as f32, the way the batched path decodes it.
  float weight(int64_t r, int64_t c) const;
};

// Batch-1 activation quantization: two signed digits hold |X| <= 32639; the margin of 2 absorbs f32 rounding
// of x / f. Groups whose largest |x| is below kSmallestScaled use that as their largest (their activations
// round to multiples of kSmallestScaled / kLargestX, about 2^-115).
inline constexpr int kDigits = 2;
inline constexpr float kLargestX = 32637.0f;
inline constexpr float kSmallestScaled = 0x1p-100f;

// The activations of one matvec call, quantized per group (internal to the kernels).
struct BlockActivations {
  int8_t* digits;  // [kDigits, padded_cols]: digit t of column c at t padded_cols + c
  float* factor;   // [groups] f
  float* bias_x;   // [groups] what the bias slot multiplies: sum of x' (times -offset for scale_offset)
};

// Name of the Highway target the block kernels dispatch to ("AVX3_DL", "AVX2", ...).
const char* block_target_name();

// The CPU linear over a block matrix; weight_bytes() reports `stored_bytes` (the artifact's bytes for the
// weight, which the records mirror apart from the padding rows).
std::unique_ptr<CpuLinear> make_block_linear(BlockMatrix matrix, uint64_t stored_bytes);

}  // namespace lowbit::kernels
