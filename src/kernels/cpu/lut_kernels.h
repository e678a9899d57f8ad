// Kernel layouts shared by the offset_scale and two_plane kernels: whatever the stored format, prepare
// re-lays each row out, one row at a time (nothing is expanded to dense), into records of one group each: the
// group's codes followed by its f32 metadata. The kernel builds each group's table of values,
// lut[code] = s0 * c0(code) + s1 * c1(code) + bias, and turns N codes into N weights (N = f32 lanes of the
// dispatched SIMD target) with one table lookup (vpermps on AVX-512), then one FMA with the activations:
//   offset_scale q3, q3_full8 (8 entries):  c0 = code, bias = -offset * scale      metadata {scale}
//   offset_scale q4 (16 entries):           c0 = code, bias = -offset * scale      metadata {scale}
//   two_plane (16 entries, code = base | residual << 2):
//                                           c0 = base, c1 = residual,              metadata {sb, sr, bias}
//                                           bias = base bias + residual bias
// so a two-plane weight costs one pass and one lookup for both planes. Code arrangement per group:
//   4-bit codes ("nibbles"): blocks of 2N weights in N bytes, byte j = code j | code (j + N) << 4.
//   3-bit codes ("crumbs", kept at 3 bits per weight): blocks of 4N weights in N bytes holding the low two bits
//   (weight j + kN in bits 2k, 2k + 1 of byte j), then a plane of the high bits (weight j in bit j % 8 of
//   byte j / 8), which lanes read as a mask.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "lowbit/kernels/cpu.h"

namespace lowbit::kernels {

enum class LutKind {
  offset_scale3,  // crumbs, groups of 64
  offset_scale4,  // nibbles, groups of 64
  two_plane,      // nibbles, groups of 128
};

struct LutMatrix {
  LutKind kind = LutKind::two_plane;
  int64_t lanes = 0;    // N the nibble layout was built for (simd::float_lanes())
  int code_bytes = 0;   // per group
  int meta_floats = 0;  // 1 (scale) or 3 (sb, sr, bias)
  float bias_per_scale = 0.0f;  // offset_scale: -offset
  int64_t group_size = 0;
  int64_t rows = 0, cols = 0, padded_cols = 0;
  std::vector<uint8_t> records;  // [rows, groups, record_bytes()]

  LutMatrix(LutKind kind, int64_t rows, int64_t cols, int64_t padded_cols, float bias_per_scale);
  int64_t groups() const { return padded_cols / group_size; }
  bool nibbles() const { return kind != LutKind::offset_scale3; }
  int64_t record_bytes() const { return code_bytes + 4 * meta_floats; }
  uint8_t* record(int64_t r, int64_t g) { return records.data() + (r * groups() + g) * record_bytes(); }

  // Sets the codes of row r from one code per padded column.
  void set_codes(int64_t r, const uint8_t* codes);
  void set_meta(int64_t r, int64_t g, int i, float v) { std::memcpy(record(r, g) + code_bytes + 4 * i, &v, 4); }
};

// The CPU linear over a table-lookup matrix (matvec, batched matmul, gather).
std::unique_ptr<CpuLinear> make_lut_linear(LutMatrix matrix);

}  // namespace lowbit::kernels
