// ggml block formats to f32, element for element and operation for operation as ggml's dequantize_row_*
// (ggml-quants.c), so that the floats are bit-identical. Blocks are read through memcpy: GGUF data is only
// aligned to the file's alignment, not to the blocks' fields.
#include <cstring>

#include "lowbit/core/dtype.h"
#include "lowbit/core/error.h"
#include "lowbit/io/gguf.h"
#include "ggml_iq_tables.h"

namespace lowbit::io {
namespace {

constexpr int kQK = 32;    // elements of a Q4_0 .. Q8_0 block
constexpr int kQKK = 256;  // elements of a K-quant super-block

float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// Q4_0: d (f16), qs[16]; element j is low nibble of qs[j], element j+16 the high nibble; value (q - 8) * d.
void block_q4_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < kQK / 2; ++j) {
    y[j] = static_cast<float>((qs[j] & 0x0F) - 8) * d;
    y[j + kQK / 2] = static_cast<float>((qs[j] >> 4) - 8) * d;
  }
}

// Q4_1: d, m (f16), qs[16]; value q * d + m.
void block_q4_1(const uint8_t* b, float* y) {
  const float d = half_at(b), m = half_at(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < kQK / 2; ++j) {
    y[j] = static_cast<float>(qs[j] & 0x0F) * d + m;
    y[j + kQK / 2] = static_cast<float>(qs[j] >> 4) * d + m;
  }
}

// The fifth bits of a Q5 block: bit j of qh (little-endian u32) belongs to element j.
uint32_t fifth_bits(const uint8_t* p) {
  uint32_t qh;
  std::memcpy(&qh, p, 4);
  return qh;
}

// Q5_0: d (f16), qh[4], qs[16]; value (q5 - 16) * d.
void block_q5_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const uint32_t qh = fifth_bits(b + 2);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < kQK / 2; ++j) {
    const int x0 = (qs[j] & 0x0F) | static_cast<int>(((qh >> j) << 4) & 0x10);
    const int x1 = (qs[j] >> 4) | static_cast<int>((qh >> (j + 12)) & 0x10);
    y[j] = static_cast<float>(x0 - 16) * d;
    y[j + kQK / 2] = static_cast<float>(x1 - 16) * d;
  }
}

// Q5_1: d, m (f16), qh[4], qs[16]; value q5 * d + m.
void block_q5_1(const uint8_t* b, float* y) {
  const float d = half_at(b), m = half_at(b + 2);
  const uint32_t qh = fifth_bits(b + 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < kQK / 2; ++j) {
    const int x0 = (qs[j] & 0x0F) | static_cast<int>(((qh >> j) << 4) & 0x10);
    const int x1 = (qs[j] >> 4) | static_cast<int>((qh >> (j + 12)) & 0x10);
    y[j] = static_cast<float>(x0) * d + m;
    y[j + kQK / 2] = static_cast<float>(x1) * d + m;
  }
}

// Q8_0: d (f16), qs[32] (i8); value q * d.
void block_q8_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
  for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
}

// Q2_K: scales[16] (low nibble scale, high nibble min), qs[64] (2-bit), d, dmin (f16).
void block_q2_k(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* q = b + 16;
  const float d = half_at(b + 80), min = half_at(b + 82);
  int is = 0;
  for (int n = 0; n < kQKK; n += 128, q += 32) {
    for (int shift = 0; shift < 8; shift += 2) {
      for (int half = 0; half < 2; ++half) {
        const uint8_t sc = scales[is++];
        const float dl = d * static_cast<float>(sc & 0x0F), ml = min * static_cast<float>(sc >> 4);
        for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<float>((q[l + 16 * half] >> shift) & 3) - ml;
      }
    }
  }
}

// Q3_K: hmask[32], qs[64] (low 2 bits), scales[12] (16 six-bit scales), d (f16).
void block_q3_k(const uint8_t* b, float* y) {
  const uint8_t* hm = b;
  const uint8_t* q = b + 32;
  const uint8_t* packed = b + 96;
  const float d_all = half_at(b + 108);
  // Scale i: low 4 bits from packed[i % 8] (low nibble for i < 8, high for i >= 8), high 2 bits from
  // packed[8 + i % 4] at bit 2 * (i / 4); stored with an offset of 32.
  int scales[16];
  for (int i = 0; i < 16; ++i) {
    const int low = i < 8 ? packed[i] & 0x0F : packed[i - 8] >> 4;
    const int high = (packed[8 + i % 4] >> (2 * (i / 4))) & 3;
    scales[i] = (low | (high << 4)) - 32;
  }
  int is = 0;
  uint8_t m = 1;
  for (int n = 0; n < kQKK; n += 128, q += 32) {
    for (int shift = 0; shift < 8; shift += 2, m <<= 1) {
      for (int half = 0; half < 2; ++half) {
        const float dl = d_all * static_cast<float>(scales[is++]);
        for (int l = 0; l < 16; ++l) {
          const int k = l + 16 * half;
          const int v = ((q[k] >> shift) & 3) - ((hm[k] & m) ? 0 : 4);
          *y++ = dl * static_cast<float>(v);
        }
      }
    }
  }
}

// The 6-bit scale and min of sub-block j of a Q4_K / Q5_K super-block (12 packed bytes).
void scale_min_k4(int j, const uint8_t* q, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Q4_K: d, dmin (f16), scales[12], qs[128]; 8 sub-blocks of 32, value d*sc * q - dmin*m.
void block_q4_k(const uint8_t* b, float* y) {
  const float d = half_at(b), min = half_at(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* q = b + 16;
  for (int is = 0; is < 8; is += 2, q += 32) {
    uint8_t sc, m;
    scale_min_k4(is, scales, sc, m);
    const float d1 = d * sc, m1 = min * m;
    scale_min_k4(is + 1, scales, sc, m);
    const float d2 = d * sc, m2 = min * m;
    for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0x0F) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
  }
}

// Q5_K: d, dmin (f16), scales[12], qh[32], qs[128]; like Q4_K with a fifth bit from qh.
void block_q5_k(const uint8_t* b, float* y) {
  const float d = half_at(b), min = half_at(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* ql = b + 48;
  uint8_t u1 = 1, u2 = 2;
  for (int is = 0; is < 8; is += 2, ql += 32, u1 <<= 2, u2 <<= 2) {
    uint8_t sc, m;
    scale_min_k4(is, scales, sc, m);
    const float d1 = d * sc, m1 = min * m;
    scale_min_k4(is + 1, scales, sc, m);
    const float d2 = d * sc, m2 = min * m;
    for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>((ql[l] & 0x0F) + (qh[l] & u1 ? 16 : 0)) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
  }
}

// Q6_K: ql[128] (low 4 bits), qh[64] (high 2 bits), scales[16] (i8), d (f16); value d * scale * (q6 - 32).
void block_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = half_at(b + 208);
  for (int n = 0; n < kQKK; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
      y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
      y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
      y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
    }
  }
}

// IQ4_NL: d (f16), qs[16]; element j is level kValuesIq4Nl[low nibble of qs[j]], j+16 the high nibble's; times d.
void block_iq4_nl(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < kQK / 2; ++j) {
    y[j] = d * static_cast<float>(kValuesIq4Nl[qs[j] & 0x0F]);
    y[j + kQK / 2] = d * static_cast<float>(kValuesIq4Nl[qs[j] >> 4]);
  }
}

// IQ4_XS: d (f16), scales_h (u16), scales_l[4], qs[128]; 8 sub-blocks of 32 as IQ4_NL, each with the 6-bit scale
// (low 4 bits from scales_l, high 2 from scales_h) minus 32 times d.
void block_iq4_xs(const uint8_t* b, float* y) {
  const float d = half_at(b);
  uint16_t scales_h;
  std::memcpy(&scales_h, b + 2, 2);
  const uint8_t* scales_l = b + 4;
  const uint8_t* qs = b + 8;
  for (int ib = 0; ib < kQKK / 32; ++ib, y += 32, qs += 16) {
    const int ls = ((scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0F) | (((scales_h >> (2 * ib)) & 3) << 4);
    const float dl = d * static_cast<float>(ls - 32);
    for (int j = 0; j < 16; ++j) {
      y[j] = dl * static_cast<float>(kValuesIq4Nl[qs[j] & 0x0F]);
      y[j + 16] = dl * static_cast<float>(kValuesIq4Nl[qs[j] >> 4]);
    }
  }
}

using BlockFn = void (*)(const uint8_t*, float*);

BlockFn block_function(GgmlType type) {
  switch (type) {
    case GgmlType::Q4_0: return block_q4_0;
    case GgmlType::Q4_1: return block_q4_1;
    case GgmlType::Q5_0: return block_q5_0;
    case GgmlType::Q5_1: return block_q5_1;
    case GgmlType::Q8_0: return block_q8_0;
    case GgmlType::Q2_K: return block_q2_k;
    case GgmlType::Q3_K: return block_q3_k;
    case GgmlType::Q4_K: return block_q4_k;
    case GgmlType::Q5_K: return block_q5_k;
    case GgmlType::Q6_K: return block_q6_k;
    case GgmlType::IQ4_NL: return block_iq4_nl;
    case GgmlType::IQ4_XS: return block_iq4_xs;
    default: return nullptr;
  }
}

}  // namespace

void dequantize_ggml(GgmlType type, std::span<const std::byte> src, std::span<float> dst) {
  const GgmlTypeInfo* info = ggml_type_info(static_cast<uint32_t>(type));
  if (!info) fail(Errc::unsupported, "[gguf] dequantize: ggml type {}", static_cast<uint32_t>(type));
  const uint64_t blocks = dst.size() / info->block_elems;
  if (dst.size() % info->block_elems != 0 || src.size() != blocks * info->block_bytes)
    fail(Errc::size_mismatch, "[gguf] dequantize {}: {} bytes for {} elements", info->name, src.size(), dst.size());
  const auto* p = reinterpret_cast<const uint8_t*>(src.data());
  switch (type) {
    case GgmlType::F32: std::memcpy(dst.data(), p, src.size()); return;
    case GgmlType::F16:
      for (size_t i = 0; i < dst.size(); ++i) dst[i] = load_float(DType::F16, p, i);
      return;
    case GgmlType::BF16:
      for (size_t i = 0; i < dst.size(); ++i) dst[i] = load_float(DType::BF16, p, i);
      return;
    default: break;
  }
  const BlockFn fn = block_function(type);
  for (uint64_t i = 0; i < blocks; ++i) fn(p + i * info->block_bytes, dst.data() + i * info->block_elems);
}

}  // namespace lowbit::io
