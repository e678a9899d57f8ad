// ggml block formats to f32, element for element and operation for operation as ggml's dequantize_row_*
// (ggml-quants.c), so that the floats are bit-identical. Blocks are read through memcpy: GGUF data is only
// aligned to the file's alignment, not to the blocks' fields.
#include <cstring>

#include "ggml_iq_tables.h"
#include "lowbit/core/dtype.h"
#include "lowbit/core/error.h"
#include "lowbit/io/gguf.h"

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

// Byte j of a grid point: the grids hold one integer per point whose little-endian byte j is element j.
template <class Entry>
uint8_t grid_byte(Entry entry, int j) {
  return static_cast<uint8_t>(entry >> (8 * j));
}

// ggml's sign rule (kmask_iq2xs): bit j of a sign byte negates element j.
float sign_of(uint8_t signs, int j) { return (signs >> j) & 1 ? -1.f : 1.f; }

uint16_t u16_at(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

uint32_t u32_at(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// IQ2_XXS: d (f16), qs[32] (u16). Each sub-block of 32 is two u32: four 8-bit grid indices (kGridIq2xxs), then
// four 7-bit sign indices (kSignsIq2xs) and a 4-bit scale s in the top bits; value d * (0.5 + s) * 0.25 * grid * sign.
void block_iq2_xxs(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const uint8_t* qs = b + 2;
  for (int ib = 0; ib < kQKK / 32; ++ib, qs += 8) {
    const uint32_t signs_and_scale = u32_at(qs + 4);
    const float db = d * (0.5f + static_cast<float>(signs_and_scale >> 28)) * 0.25f;
    for (int l = 0; l < 4; ++l, y += 8) {
      const uint64_t grid = kGridIq2xxs[qs[l]];
      const uint8_t signs = kSignsIq2xs[(signs_and_scale >> (7 * l)) & 127];
      for (int j = 0; j < 8; ++j) y[j] = db * static_cast<float>(grid_byte(grid, j)) * sign_of(signs, j);
    }
  }
}

// IQ2_XS: d (f16), qs[32] (u16: 9-bit grid index into kGridIq2xs, 7-bit sign index), scales[8] (two 4-bit scales
// per sub-block of 32, one per half); value d * (0.5 + s) * 0.25 * grid * sign.
void block_iq2_xs(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const uint8_t* qs = b + 2;
  const uint8_t* scales = b + 66;
  for (int ib = 0; ib < kQKK / 32; ++ib) {
    const float db[2] = {d * (0.5f + static_cast<float>(scales[ib] & 0x0F)) * 0.25f,
                         d * (0.5f + static_cast<float>(scales[ib] >> 4)) * 0.25f};
    for (int l = 0; l < 4; ++l, y += 8) {
      const uint16_t q = u16_at(qs + 2 * (4 * ib + l));
      const uint64_t grid = kGridIq2xs[q & 511];
      const uint8_t signs = kSignsIq2xs[q >> 9];
      for (int j = 0; j < 8; ++j) y[j] = db[l / 2] * static_cast<float>(grid_byte(grid, j)) * sign_of(signs, j);
    }
  }
}

// IQ2_S: d (f16), qs[64] (32 low bytes of 10-bit grid indices into kGridIq2s, then 32 explicit sign bytes),
// qh[8] (the indices' high 2 bits), scales[8] (as IQ2_XS).
void block_iq2_s(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const uint8_t* qs = b + 2;
  const uint8_t* signs = qs + kQKK / 8;
  const uint8_t* qh = b + 66;
  const uint8_t* scales = b + 74;
  for (int ib = 0; ib < kQKK / 32; ++ib, qs += 4, signs += 4) {
    const float db[2] = {d * (0.5f + static_cast<float>(scales[ib] & 0x0F)) * 0.25f,
                         d * (0.5f + static_cast<float>(scales[ib] >> 4)) * 0.25f};
    for (int l = 0; l < 4; ++l, y += 8) {
      const uint64_t grid = kGridIq2s[qs[l] | ((qh[ib] << (8 - 2 * l)) & 0x300)];
      for (int j = 0; j < 8; ++j) y[j] = db[l / 2] * static_cast<float>(grid_byte(grid, j)) * sign_of(signs[l], j);
    }
  }
}

// IQ3_XXS: d (f16), qs[64] (8-bit indices into kGridIq3xxs, 4 elements each), then per sub-block of 32 a u32 of four
// 7-bit sign indices and a 4-bit scale s in the top bits; value d * (0.5 + s) * 0.5 * grid * sign.
void block_iq3_xxs(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const uint8_t* qs = b + 2;
  const uint8_t* scales_and_signs = qs + kQKK / 4;
  for (int ib = 0; ib < kQKK / 32; ++ib, qs += 8) {
    const uint32_t aux = u32_at(scales_and_signs + 4 * ib);
    const float db = d * (0.5f + static_cast<float>(aux >> 28)) * 0.5f;
    for (int l = 0; l < 4; ++l, y += 8) {
      const uint8_t signs = kSignsIq2xs[(aux >> (7 * l)) & 127];
      const uint32_t grid1 = kGridIq3xxs[qs[2 * l]], grid2 = kGridIq3xxs[qs[2 * l + 1]];
      for (int j = 0; j < 4; ++j) {
        y[j] = db * static_cast<float>(grid_byte(grid1, j)) * sign_of(signs, j);
        y[j + 4] = db * static_cast<float>(grid_byte(grid2, j)) * sign_of(signs, j + 4);
      }
    }
  }
}

// IQ3_S: d (f16), qs[64] (low bytes of 9-bit indices into kGridIq3s, 4 elements each), qh[8] (their ninth bits),
// signs[32] (explicit), scales[4] (a 4-bit scale s per sub-block of 32); value d * (1 + 2s) * grid * sign.
void block_iq3_s(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const uint8_t* qs = b + 2;
  const uint8_t* qh = b + 66;
  const uint8_t* signs = b + 74;
  const uint8_t* scales = b + 106;
  for (int ib = 0; ib < kQKK / 32; ++ib, qs += 8, signs += 4) {
    const int s = ib % 2 ? scales[ib / 2] >> 4 : scales[ib / 2] & 0x0F;
    const float db = d * static_cast<float>(1 + 2 * s);
    for (int l = 0; l < 4; ++l, y += 8) {
      const uint32_t grid1 = kGridIq3s[qs[2 * l] | ((qh[ib] << (8 - 2 * l)) & 256)];
      const uint32_t grid2 = kGridIq3s[qs[2 * l + 1] | ((qh[ib] << (7 - 2 * l)) & 256)];
      for (int j = 0; j < 4; ++j) {
        y[j] = db * static_cast<float>(grid_byte(grid1, j)) * sign_of(signs[l], j);
        y[j + 4] = db * static_cast<float>(grid_byte(grid2, j)) * sign_of(signs[l], j + 4);
      }
    }
  }
}

// IQ1_S and IQ1_M shift every grid value by +-1/8 (IQ1S_DELTA).
constexpr float kIq1Delta = 0.125f;

// IQ1_S: d (f16), qs[32] (low bytes of 11-bit indices into kGridIq1s), qh[8] (u16 per sub-block of 32: the
// indices' high 3 bits, a 3-bit scale s in bits 12-14, the delta's sign in bit 15); value d * (2s + 1) *
// (grid + delta).
void block_iq1_s(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const uint8_t* qs = b + 2;
  const uint8_t* qh = b + 34;
  for (int ib = 0; ib < kQKK / 32; ++ib, qs += 4) {
    const uint16_t h = u16_at(qh + 2 * ib);
    const float dl = d * static_cast<float>(2 * ((h >> 12) & 7) + 1);
    const float delta = h & 0x8000 ? -kIq1Delta : kIq1Delta;
    for (int l = 0; l < 4; ++l, y += 8) {
      const uint64_t grid = kGridIq1s[qs[l] | (((h >> (3 * l)) & 7) << 8)];
      for (int j = 0; j < 8; ++j) y[j] = dl * (static_cast<float>(static_cast<int8_t>(grid_byte(grid, j))) + delta);
    }
  }
}

// IQ1_M: qs[32] (low bytes of 11-bit indices into kGridIq1s), qh[16] (a nibble per group of 8: the index's high 3
// bits and the delta's sign), scales[8] (four u16: a 3-bit scale per half sub-block, and the f16 super-block scale
// d spread over their top nibbles); value d * (2s + 1) * (grid + delta).
void block_iq1_m(const uint8_t* b, float* y) {
  const uint8_t* qs = b;
  const uint8_t* qh = b + 32;
  uint16_t sc[4];
  std::memcpy(sc, b + 48, 8);
  const uint16_t d_bits =
      static_cast<uint16_t>((sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000));
  const float d = f16_to_f32(d_bits);
  for (int ib = 0; ib < kQKK / 32; ++ib, qs += 4, qh += 2) {
    const float dl[2] = {d * static_cast<float>(2 * ((sc[ib / 2] >> (6 * (ib % 2))) & 7) + 1),
                         d * static_cast<float>(2 * ((sc[ib / 2] >> (6 * (ib % 2) + 3)) & 7) + 1)};
    for (int l = 0; l < 4; ++l, y += 8) {
      const uint8_t nibble = l % 2 ? qh[l / 2] >> 4 : qh[l / 2] & 0x0F;
      const uint64_t grid = kGridIq1s[qs[l] | ((nibble & 7) << 8)];
      const float delta = nibble & 8 ? -kIq1Delta : kIq1Delta;
      for (int j = 0; j < 8; ++j)
        y[j] = dl[l / 2] * (static_cast<float>(static_cast<int8_t>(grid_byte(grid, j))) + delta);
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
    case GgmlType::IQ2_XXS: return block_iq2_xxs;
    case GgmlType::IQ2_XS: return block_iq2_xs;
    case GgmlType::IQ2_S: return block_iq2_s;
    case GgmlType::IQ3_XXS: return block_iq3_xxs;
    case GgmlType::IQ3_S: return block_iq3_s;
    case GgmlType::IQ1_S: return block_iq1_s;
    case GgmlType::IQ1_M: return block_iq1_m;
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
