// One GGUF tensor as a lowbit tensor without expanding it (seed 001: never expand a packed matrix).
//
// The block types whose values are affine in their codes are the affine codec exactly, re-expressed at load:
// - Q4_1 and Q5_1 (value q*d + m, f16 d and m) are affine 4/5 bits, group 32, scale d and bias m, in the same
//   bytes; Q4_0, Q5_0 and Q8_0 (value (q - o)*d, o = 8, 16, 128) are affine with bias -o*d, which f16 holds
//   exactly (a power-of-two multiple) unless it overflows. These three cost 2 bytes more per block of 32 than the
//   GGUF (the stored bias): 4.5 -> 5, 5.5 -> 6 and 8.5 -> 9 bits per weight while loading; the CPU kernel, seeing
//   every bias at -o*d, keeps the scale alone and reads the file's 4.5, 5.5 and 8.5.
// - Q4_K and Q5_K (super-blocks of 256: f16 d and dmin, a 6-bit scale sc_j and min m_j per sub-block of 32, value
//   d sc_j q - dmin m_j) are affine 4/5 bits, group 32, scale d sc_j and bias -dmin m_j, which need f32: 4.5 -> 6
//   and 5.5 -> 7 bits per weight, against 32 dequantized.
// - Q2_K, Q3_K and Q6_K (super-blocks of 256 in sub-blocks of 16) are affine 2, 3 and 6 bits in groups of 16 (the
//   affine layouts with groups of 16), metadata in f32: Q2_K (f16 d and dmin, a 4-bit scale sc_j and min m_j per
//   sub-block, value d sc_j q - dmin m_j) with scale d sc_j and bias -dmin m_j, 2.63 -> 6 bits per weight; Q3_K
//   (f16 d, a 6-bit scale sc_j stored + 32, value d (sc_j - 32) (q - 4)) with scale d (sc_j - 32) and bias -4 times
//   it, 3.44 -> 7, 6 in the CPU kernel (the scale alone, with the codes in 4-bit fields); Q6_K (f16 d, an int8
//   scale sc_j, value d sc_j (q - 32)) with scale d sc_j and bias -32 d sc_j, 6.56 -> 10, 8 in the CPU kernel.
// Metadata is f16 where every scale and bias of the tensor is exact in f16, else f32. Every product of the affine
// formula is exact in f32 for these codes and values and the sums round once where ggml's do, so the decoded
// weights are ggml's dequantize_row_* values bit for bit, but for the sign of a zero (ggml's d * 0 is -0 for a
// negative d, scale q + bias is +0). F32, F16 and BF16 stay dense in their own dtype. Other types (the IQ types,
// whose values are not affine in their codes) are returned as nullopt: the caller dequantizes them.
#pragma once

#include <optional>

#include "lowbit/codec/codec.h"
#include "lowbit/io/gguf.h"

namespace lowbit::model {

struct PackedGgufTensor {
  const codec::Codec* codec = nullptr;
  codec::EncodedTensor tensor;  // params and arrays, owned
};

// The tensor in a lowbit codec, or nullopt when its type has no packed form yet. Block types only as rank-2
// matrices; dense types of any rank.
std::optional<PackedGgufTensor> gguf_packed_tensor(const io::GgufFile& file, const io::GgufTensorInfo& info);

// The same for a matrix of `shape` stored as `bytes` of ggml type `type` (one expert of a merged expert tensor).
std::optional<PackedGgufTensor> gguf_packed_matrix(io::GgmlType type, std::span<const std::byte> bytes,
                                                   const Shape& shape);

}  // namespace lowbit::model
