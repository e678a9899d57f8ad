// One GGUF tensor as a lowbit tensor without expanding it (seed 001: never expand a packed matrix).
//
// The 32-element block types are the affine codec exactly, re-expressed at load: Q4_1 and Q5_1 (value q*d + m,
// f16 d and m) are affine 4/5 bits, group 32, scale d and bias m, in the same bytes; Q4_0, Q5_0 and Q8_0 (value
// (q - o)*d, o = 8, 16, 128) are affine with bias -o*d, which f16 holds exactly (a power-of-two multiple) unless
// it overflows, in which case the tensor keeps f32 scales and biases. These three cost 2 bytes more per block of
// 32 than the GGUF (the stored bias): 4.5 -> 5, 5.5 -> 6 and 8.5 -> 9 bits per weight. Every product and sum of
// the affine formula is exact in f32 for these codes and f16 values, so the decoded weights are bit-identical to
// ggml's dequantize_row_*. F32, F16 and BF16 stay dense in their own dtype. Other types (K-quants) are returned
// as nullopt: the caller dequantizes them.
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

}  // namespace lowbit::model
