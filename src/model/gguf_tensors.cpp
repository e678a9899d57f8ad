#include "lowbit/model/gguf_tensors.h"

#include <cmath>
#include <cstring>

#include "lowbit/codec/affine.h"
#include "lowbit/core/dtype.h"

namespace lowbit::model {
namespace {

constexpr int kBlock = 32;  // elements of a Q4_0 .. Q8_0 block

// One ggml 32-element block type as affine: where d (and m) sit, the unsigned codes, the offset o of
// value (q - o) * d (0 for the types with a stored min m).
struct BlockAffine {
  io::GgmlType type;
  int bits;
  int offset;       // o: bias = -o * d
  bool has_min;     // Q4_1, Q5_1: bias = m (f16 after d)
  void (*codes)(const uint8_t* block, uint8_t* q);  // the 32 unsigned codes of a block
};

uint16_t u16_at(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// Q4_0 / Q4_1: element j is the low nibble of qs[j], element j+16 the high nibble.
void nibble_codes(const uint8_t* qs, uint8_t* q) {
  for (int j = 0; j < kBlock / 2; ++j) {
    q[j] = qs[j] & 0x0F;
    q[j + kBlock / 2] = qs[j] >> 4;
  }
}
// Q5_0 / Q5_1: the nibbles plus a fifth bit, bit j of the little-endian u32 qh for element j.
void fifth_bit_codes(const uint8_t* qh_bytes, uint8_t* q) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, 4);
  nibble_codes(qh_bytes + 4, q);
  for (int j = 0; j < kBlock; ++j) q[j] |= static_cast<uint8_t>(((qh >> j) & 1u) << 4);
}

void q4_0_codes(const uint8_t* b, uint8_t* q) { nibble_codes(b + 2, q); }
void q4_1_codes(const uint8_t* b, uint8_t* q) { nibble_codes(b + 4, q); }
void q5_0_codes(const uint8_t* b, uint8_t* q) { fifth_bit_codes(b + 2, q); }
void q5_1_codes(const uint8_t* b, uint8_t* q) { fifth_bit_codes(b + 4, q); }
void q8_0_codes(const uint8_t* b, uint8_t* q) {
  for (int j = 0; j < kBlock; ++j) q[j] = static_cast<uint8_t>(static_cast<int8_t>(b[2 + j]) + 128);
}

constexpr BlockAffine kBlockAffine[] = {
    {io::GgmlType::Q4_0, 4, 8, false, q4_0_codes},   {io::GgmlType::Q4_1, 4, 0, true, q4_1_codes},
    {io::GgmlType::Q5_0, 5, 16, false, q5_0_codes},  {io::GgmlType::Q5_1, 5, 0, true, q5_1_codes},
    {io::GgmlType::Q8_0, 8, 128, false, q8_0_codes},
};

const BlockAffine* block_affine(io::GgmlType type) {
  for (const auto& row : kBlockAffine)
    if (row.type == type) return &row;
  return nullptr;
}

// 32 codes of `bits` bits -> `bits` words of the affine LSB-first stream (a block fills whole words).
void pack_block(const uint8_t* q, int bits, uint32_t* words) {
  uint64_t acc = 0;
  int filled = 0;
  for (int j = 0; j < kBlock; ++j) {
    acc |= static_cast<uint64_t>(q[j]) << filled;
    filled += bits;
    if (filled >= 32) {
      *words++ = static_cast<uint32_t>(acc);
      acc >>= 32;
      filled -= 32;
    }
  }
}

PackedGgufTensor affine_from_blocks(const BlockAffine& t, std::span<const std::byte> bytes, const Shape& shape,
                                    uint32_t block_bytes) {
  const int64_t rows = shape[0], cols = shape[1], blocks = rows * (cols / kBlock);
  auto codes = make_buffer(DType::U32, {rows, cols * t.bits / 32});
  std::vector<float> scales(static_cast<size_t>(blocks)), biases(static_cast<size_t>(blocks));
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  uint32_t* words = codes.as<uint32_t>();
  bool f16_exact = true;
  uint8_t q[kBlock];
  for (int64_t i = 0; i < blocks; ++i, p += block_bytes, words += t.bits) {
    t.codes(p, q);
    pack_block(q, t.bits, words);
    const float d = f16_to_f32(u16_at(p));
    scales[i] = d;
    biases[i] = t.has_min ? f16_to_f32(u16_at(p + 2)) : -static_cast<float>(t.offset) * d;
    // -o*d is exact in f32; in f16 only while it does not overflow (NaN/inf compare unequal and are then
    // refused as non-finite by the codec's content check).
    if (!t.has_min && f16_to_f32(f32_to_f16(biases[i])) != biases[i]) f16_exact = false;
  }
  const DType scale_dtype = f16_exact ? DType::F16 : DType::F32;
  auto to_buffer = [&](const std::vector<float>& v) {
    auto buf = make_buffer(scale_dtype, {rows, cols / kBlock});
    for (size_t i = 0; i < v.size(); ++i) store_float(scale_dtype, buf.bytes.data(), i, v[i]);
    return buf;
  };
  PackedGgufTensor out;
  out.codec = &codec::codec_or_throw("affine", "gguf");
  out.tensor.params = {{"bits", t.bits}, {"group_size", kBlock}, {"scale_dtype", f16_exact ? "f16" : "f32"},
                       {"padded_cols", cols}};
  out.tensor.arrays.emplace_back("codes", std::move(codes));
  out.tensor.arrays.emplace_back("scales", to_buffer(scales));
  out.tensor.arrays.emplace_back("biases", to_buffer(biases));
  return out;
}

}  // namespace

std::optional<PackedGgufTensor> gguf_packed_tensor(const io::GgufFile& file, const io::GgufTensorInfo& info) {
  const Shape shape = info.shape();
  const auto bytes = file.tensor_bytes(info);
  if (info.type == io::GgmlType::F32 || info.type == io::GgmlType::F16 || info.type == io::GgmlType::BF16) {
    const DType dtype = info.type == io::GgmlType::F32 ? DType::F32
                        : info.type == io::GgmlType::F16 ? DType::F16
                                                          : DType::BF16;
    auto data = make_buffer(dtype, shape);
    std::memcpy(data.bytes.data(), bytes.data(), bytes.size());
    PackedGgufTensor out;
    out.codec = &codec::codec_or_throw("dense", "gguf");
    out.tensor.params = {{"dtype", dtype == DType::F32 ? "f32" : dtype == DType::F16 ? "f16" : "bf16"}};
    out.tensor.arrays.emplace_back("data", std::move(data));
    return out;
  }
  const BlockAffine* t = block_affine(info.type);
  if (!t || shape.size() != 2) return std::nullopt;
  return affine_from_blocks(*t, bytes, shape, io::ggml_type_info(static_cast<uint32_t>(info.type))->block_bytes);
}

}  // namespace lowbit::model
