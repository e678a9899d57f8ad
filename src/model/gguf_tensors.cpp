#include "lowbit/model/gguf_tensors.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "lowbit/codec/affine.h"
#include "lowbit/core/checked.h"
#include "lowbit/core/dtype.h"
#include "lowbit/core/error.h"

namespace lowbit::model {
namespace {

constexpr int kGroup = 32;  // elements of a Q4_0 .. Q8_0 block and of a Q4_K / Q5_K sub-block

uint16_t u16_at(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// Q4_0 / Q4_1: element j is the low nibble of qs[j], element j+16 the high nibble.
void nibble_codes(const uint8_t* qs, uint8_t* q) {
  for (int j = 0; j < kGroup / 2; ++j) {
    q[j] = qs[j] & 0x0F;
    q[j + kGroup / 2] = qs[j] >> 4;
  }
}
// Q5_0 / Q5_1: the nibbles plus a fifth bit, bit j of the little-endian u32 qh for element j.
void fifth_bit_codes(const uint8_t* qh_bytes, uint8_t* q) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, 4);
  nibble_codes(qh_bytes + 4, q);
  for (int j = 0; j < kGroup; ++j) q[j] |= static_cast<uint8_t>(((qh >> j) & 1u) << 4);
}

// One ggml block as affine groups: its codes (unsigned, groups * 32) and each group's scale and bias, in f32.
using UnpackFn = void (*)(const uint8_t* block, uint8_t* q, float* scale, float* bias);

// The 32-element types: value (q - o) d, or q d + m for the types with a stored min.
template <int kOffset>
void offset_scale(const uint8_t* b, float* scale, float* bias) {
  *scale = f16_to_f32(u16_at(b));
  *bias = -static_cast<float>(kOffset) * *scale;
}
void min_scale(const uint8_t* b, float* scale, float* bias) {
  *scale = f16_to_f32(u16_at(b));
  *bias = f16_to_f32(u16_at(b + 2));
}
void unpack_q4_0(const uint8_t* b, uint8_t* q, float* s, float* m) {
  offset_scale<8>(b, s, m);
  nibble_codes(b + 2, q);
}
void unpack_q4_1(const uint8_t* b, uint8_t* q, float* s, float* m) {
  min_scale(b, s, m);
  nibble_codes(b + 4, q);
}
void unpack_q5_0(const uint8_t* b, uint8_t* q, float* s, float* m) {
  offset_scale<16>(b, s, m);
  fifth_bit_codes(b + 2, q);
}
void unpack_q5_1(const uint8_t* b, uint8_t* q, float* s, float* m) {
  min_scale(b, s, m);
  fifth_bit_codes(b + 4, q);
}
void unpack_q8_0(const uint8_t* b, uint8_t* q, float* s, float* m) {
  offset_scale<128>(b, s, m);
  for (int j = 0; j < kGroup; ++j) q[j] = static_cast<uint8_t>(static_cast<int8_t>(b[2 + j]) + 128);
}

// Q4_K / Q5_K super-blocks: d, dmin (f16), 12 bytes of eight 6-bit (scale, min) pairs, [Q5_K: qh[32]], qs[128];
// sub-block j of 32 has value d sc_j q - dmin m_j. d sc_j (at most 17 significant bits) and dmin m_j are exact in
// f32, as is d sc_j q (at most 22 bits), so scale d sc_j and bias -dmin m_j give ggml's values bit for bit.
void k_scales(const uint8_t* b, float* scale, float* bias) {
  const float d = f16_to_f32(u16_at(b)), dmin = f16_to_f32(u16_at(b + 2));
  const uint8_t* p = b + 4;
  for (int j = 0; j < 8; ++j) {
    const int sc = j < 4 ? p[j] & 63 : (p[j + 4] & 0x0F) | ((p[j - 4] >> 6) << 4);
    const int m = j < 4 ? p[j + 4] & 63 : (p[j + 4] >> 4) | ((p[j] >> 6) << 4);
    scale[j] = d * static_cast<float>(sc);
    bias[j] = -(dmin * static_cast<float>(m));
  }
}
// Sub-blocks 2i and 2i + 1 are the low and high nibbles of qs[32 i .. 32 i + 31]; Q5_K's fifth bit of sub-block j
// is bit j of qh[l] for element l.
void unpack_q4_k(const uint8_t* b, uint8_t* q, float* s, float* m) {
  k_scales(b, s, m);
  for (int i = 0; i < 4; ++i)
    for (int l = 0; l < 32; ++l) {
      q[64 * i + l] = b[16 + 32 * i + l] & 0x0F;
      q[64 * i + 32 + l] = b[16 + 32 * i + l] >> 4;
    }
}
void unpack_q5_k(const uint8_t* b, uint8_t* q, float* s, float* m) {
  k_scales(b, s, m);
  const uint8_t *qh = b + 16, *qs = b + 48;
  for (int i = 0; i < 4; ++i)
    for (int l = 0; l < 32; ++l) {
      q[64 * i + l] = static_cast<uint8_t>((qs[32 * i + l] & 0x0F) | ((qh[l] >> (2 * i)) & 1) << 4);
      q[64 * i + 32 + l] = static_cast<uint8_t>((qs[32 * i + l] >> 4) | ((qh[l] >> (2 * i + 1)) & 1) << 4);
    }
}

// Q6_K super-blocks: ql[128] (low 4 bits), qh[64] (high 2 bits), 16 int8 scales, d (f16); sub-block j of 16 has
// value d sc_j (q - 32). Element e of half h = e / 128, quarter t = e % 128 / 32, l = e % 32 takes its low bits from
// nibble t / 2 of ql[64 h + 32 (t % 2) + l] and its high bits from bits 2 t of qh[32 h + l]. d sc_j has at most 18
// significant bits, so d sc_j q (24 bits) and the bias -32 d sc_j are exact in f32 and scale d sc_j, bias -32 d sc_j
// give ggml's (d sc_j) (q - 32) bit for bit.
void unpack_q6_k(const uint8_t* b, uint8_t* q, float* s, float* m) {
  const float d = f16_to_f32(u16_at(b + 208));
  for (int j = 0; j < 16; ++j) {
    s[j] = d * static_cast<float>(static_cast<int8_t>(b[192 + j]));
    m[j] = -32.0f * s[j];
  }
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, t = e % 128 / 32, l = e % 32;
    const int low = (b[64 * h + 32 * (t % 2) + l] >> (4 * (t / 2))) & 0x0F;
    const int high = (b[128 + 32 * h + l] >> (2 * t)) & 3;
    q[e] = static_cast<uint8_t>(low | high << 4);
  }
}

// Q2_K and Q3_K keep their low 2 bits of element e (half h = e / 128, quarter t = e % 128 / 32, l = e % 32) at bits
// 2 t of qs[32 h + l]; Q3_K's third bit is bit 4 h + t of hmask[l].
int low_two_bits(const uint8_t* qs, int e) { return (qs[32 * (e / 128) + e % 32] >> (2 * (e % 128 / 32))) & 3; }

// Q2_K super-blocks: scales[16] (sub-block j of 16: scale in the low nibble, min in the high), qs[64], d and dmin
// (f16); value d sc_j q - dmin m_j. d sc_j q (at most 17 significant bits) and dmin m_j are exact in f32, so scale
// d sc_j and bias -dmin m_j round their sum once, as ggml's d sc_j q - dmin m_j does.
void unpack_q2_k(const uint8_t* b, uint8_t* q, float* s, float* m) {
  const float d = f16_to_f32(u16_at(b + 80)), dmin = f16_to_f32(u16_at(b + 82));
  for (int j = 0; j < 16; ++j) {
    s[j] = d * static_cast<float>(b[j] & 0x0F);
    m[j] = -(dmin * static_cast<float>(b[j] >> 4));
  }
  for (int e = 0; e < 256; ++e) q[e] = static_cast<uint8_t>(low_two_bits(b + 16, e));
}

// Q3_K super-blocks: hmask[32], qs[64], twelve bytes of sixteen 6-bit scales sc_j (stored + 32), d (f16); value
// d (sc_j - 32) (q - 4), q the low bits plus 4 where the hmask bit is set (ggml subtracts 4 where it is clear).
// Scale j takes its low nibble from byte j % 8 (low nibble for j < 8, high for j >= 8) and its top two bits from
// bits 2 (j / 4) of byte 8 + j % 4. d (sc_j - 32) has at most 16 significant bits, so scale d (sc_j - 32) and bias
// -4 d (sc_j - 32) give ggml's products exactly (the bias is -4 scale, which the CPU kernel keeps as the scale alone).
void unpack_q3_k(const uint8_t* b, uint8_t* q, float* s, float* m) {
  const uint8_t *hmask = b, *sc = b + 96;
  const float d = f16_to_f32(u16_at(b + 108));
  for (int j = 0; j < 16; ++j) {
    const int low = j < 8 ? sc[j] & 0x0F : sc[j - 8] >> 4, high = (sc[8 + j % 4] >> (2 * (j / 4))) & 3;
    s[j] = d * static_cast<float>((low | high << 4) - 32);
    m[j] = -4.0f * s[j];
  }
  for (int e = 0; e < 256; ++e) {
    const int high = (hmask[e % 32] >> (4 * (e / 128) + e % 128 / 32)) & 1;
    q[e] = static_cast<uint8_t>(low_two_bits(b + 32, e) | high << 2);
  }
}

struct BlockAffine {
  io::GgmlType type;
  int bits;
  int group;  // elements per scale and bias
  UnpackFn unpack;
};

constexpr BlockAffine kBlockAffine[] = {
    {io::GgmlType::Q4_0, 4, 32, unpack_q4_0}, {io::GgmlType::Q4_1, 4, 32, unpack_q4_1},
    {io::GgmlType::Q5_0, 5, 32, unpack_q5_0}, {io::GgmlType::Q5_1, 5, 32, unpack_q5_1},
    {io::GgmlType::Q8_0, 8, 32, unpack_q8_0}, {io::GgmlType::Q4_K, 4, 32, unpack_q4_k},
    {io::GgmlType::Q5_K, 5, 32, unpack_q5_k}, {io::GgmlType::Q6_K, 6, 16, unpack_q6_k},
    {io::GgmlType::Q2_K, 2, 16, unpack_q2_k}, {io::GgmlType::Q3_K, 3, 16, unpack_q3_k},
};

const BlockAffine* block_affine(io::GgmlType type) {
  for (const auto& row : kBlockAffine)
    if (row.type == type) return &row;
  return nullptr;
}

// n codes of `bits` bits -> n bits / 32 words of the affine LSB-first stream (a ggml block fills whole words; a
// 3-bit group of 16 does not).
void pack_codes(const uint8_t* q, int n, int bits, uint32_t* words) {
  uint64_t acc = 0;
  int filled = 0;
  for (int j = 0; j < n; ++j) {
    acc |= static_cast<uint64_t>(q[j]) << filled;
    filled += bits;
    if (filled >= 32) {
      *words++ = static_cast<uint32_t>(acc);
      acc >>= 32;
      filled -= 32;
    }
  }
}

bool exact_in_f16(float v) { return f16_to_f32(f32_to_f16(v)) == v; }

PackedGgufTensor affine_from_blocks(const BlockAffine& t, std::span<const std::byte> bytes, const Shape& shape,
                                    const io::GgmlTypeInfo& info) {
  const int64_t rows = shape[0], cols = shape[1], groups = rows * (cols / t.group);
  const int block_elems = static_cast<int>(info.block_elems), per_block = block_elems / t.group;
  auto codes = make_buffer(DType::U32, {rows, cols * t.bits / 32});
  std::vector<float> scales(static_cast<size_t>(groups)), biases(static_cast<size_t>(groups));
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  uint32_t* words = codes.as<uint32_t>();
  uint8_t q[256];
  for (int64_t g = 0; g < groups; g += per_block, p += info.block_bytes, words += block_elems * t.bits / 32) {
    t.unpack(p, q, scales.data() + g, biases.data() + g);
    pack_codes(q, block_elems, t.bits, words);
  }
  // f16 metadata where every scale and bias is exact in it (the 32-element types: -o d is a power-of-two multiple
  // of an f16 unless it overflows), else f32 (the K types' products d sc_j, dmin m_j). NaN/inf compare unequal and
  // are then refused as non-finite by the codec's content check.
  const bool f16_exact = std::all_of(scales.begin(), scales.end(), exact_in_f16) &&
                         std::all_of(biases.begin(), biases.end(), exact_in_f16);
  const DType scale_dtype = f16_exact ? DType::F16 : DType::F32;
  auto to_buffer = [&](const std::vector<float>& v) {
    auto buf = make_buffer(scale_dtype, {rows, cols / t.group});
    for (size_t i = 0; i < v.size(); ++i) store_float(scale_dtype, buf.bytes.data(), i, v[i]);
    return buf;
  };
  PackedGgufTensor out;
  out.codec = &codec::codec_or_throw("affine", "gguf");
  out.tensor.params = {
      {"bits", t.bits}, {"group_size", t.group}, {"scale_dtype", f16_exact ? "f16" : "f32"}, {"padded_cols", cols}};
  out.tensor.arrays.emplace_back("codes", std::move(codes));
  out.tensor.arrays.emplace_back("scales", to_buffer(scales));
  out.tensor.arrays.emplace_back("biases", to_buffer(biases));
  return out;
}

}  // namespace

std::optional<PackedGgufTensor> gguf_packed_matrix(io::GgmlType type, std::span<const std::byte> bytes,
                                                   const Shape& shape) {
  const io::GgmlTypeInfo* info = io::ggml_type_info(static_cast<uint32_t>(type));
  const uint64_t n = checked_numel(shape, "[gguf]");
  // Rows of whole blocks (as the GGUF reader checks for a file's tensors) filling the bytes exactly.
  if (!info || shape.empty() || shape.back() % info->block_elems != 0 ||
      bytes.size() != n / info->block_elems * info->block_bytes)
    fail(Errc::internal, "[gguf] {} bytes do not hold a {} tensor of shape {}", bytes.size(),
         info ? info->name : "unknown", shape_str(shape));
  if (type == io::GgmlType::F32 || type == io::GgmlType::F16 || type == io::GgmlType::BF16) {
    const DType dtype = type == io::GgmlType::F32 ? DType::F32 : type == io::GgmlType::F16 ? DType::F16 : DType::BF16;
    auto data = make_buffer(dtype, shape);
    std::memcpy(data.bytes.data(), bytes.data(), bytes.size());
    PackedGgufTensor out;
    out.codec = &codec::codec_or_throw("dense", "gguf");
    out.tensor.params = {{"dtype", dtype == DType::F32 ? "f32" : dtype == DType::F16 ? "f16" : "bf16"}};
    out.tensor.arrays.emplace_back("data", std::move(data));
    return out;
  }
  const BlockAffine* t = block_affine(type);
  if (!t || shape.size() != 2) return std::nullopt;
  return affine_from_blocks(*t, bytes, shape, *info);
}

std::optional<PackedGgufTensor> gguf_packed_tensor(const io::GgufFile& file, const io::GgufTensorInfo& info) {
  return gguf_packed_matrix(info.type, file.tensor_bytes(info), info.shape());
}

}  // namespace lowbit::model
