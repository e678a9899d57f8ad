// Kernel layouts shared by the offset_scale and two_plane kernels: whatever the stored format, prepare
// re-lays each row out, one row at a time (nothing is expanded to dense), into records of one group each: the
// group's codes followed by its f32 metadata.
//
// "nibbles" (4-bit codes: offset_scale q4, two_plane with code = base | residual << 2): blocks of 2N weights
// (N = f32 lanes of the dispatched SIMD target) in N bytes, byte j = code j | code (j + N) << 4. The kernel
// builds each group's 16-entry table of values, lut[code] = s0 * c0[code] + s1 * c1[code] + bias, and
// turns codes into weights with one table lookup per N lanes:
//   offset_scale q4: c0 = code, no s1, bias = -offset * scale              metadata {scale}
//   two_plane:       c0 = base, c1 = residual, bias = base + residual bias   metadata {sb, sr, bias}
// so a two-plane weight costs one pass and one lookup for both planes.
// "planes" (3-bit codes: offset_scale q3, q3_full8, kept at 3 bits per weight): 3 bit planes of G bits
// (plane p holds bit p of every code, weight j in bit j % 8 of byte j / 8) and {scale}; lanes turn plane bits
// into masks and add x * 2^p under them: y = sum_g scale_g (sum_p 2^p sum_{bit set} x - offset xsum_g).
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "lowbit/kernels/cpu.h"

namespace lowbit::kernels {

enum class BitplaneKind {
  offset_scale3,  // planes, groups of 64
  offset_scale4,  // nibbles, groups of 64
  two_plane,      // nibbles, groups of 128
};

struct BitplaneMatrix {
  BitplaneKind kind = BitplaneKind::two_plane;
  int64_t lanes = 0;    // N the nibble layout was built for (simd::float_lanes())
  int code_bytes = 0;   // per group
  int meta_floats = 0;  // 1 (scale) or 3 (sb, sr, bias)
  float bias_per_scale = 0.0f;  // offset_scale: -offset
  int64_t group_size = 0;
  int64_t rows = 0, cols = 0, padded_cols = 0;
  std::vector<uint8_t> records;  // [rows, groups, record_bytes()]

  BitplaneMatrix(BitplaneKind kind, int64_t rows, int64_t cols, int64_t padded_cols, float bias_per_scale);
  int64_t groups() const { return padded_cols / group_size; }
  bool nibbles() const { return kind != BitplaneKind::offset_scale3; }
  int64_t record_bytes() const { return code_bytes + 4 * meta_floats; }
  uint8_t* record(int64_t r, int64_t g) { return records.data() + (r * groups() + g) * record_bytes(); }

  // Sets the codes of row r from one code per padded column.
  void set_codes(int64_t r, const uint8_t* codes);
  void set_meta(int64_t r, int64_t g, int i, float v) { std::memcpy(record(r, g) + code_bytes + 4 * i, &v, 4); }
};

// What one matvec call precomputes from the activations: x * 2^k for each power the planes use (zero-padded to
// padded_cols, one row per k; nibbles use k = 0 only) and the sums of x over each group.
struct BitplaneActivations {
  const float* multiples;  // [powers, padded_cols]
  int64_t padded_cols;
  const float* group_sums;  // [groups]
};

// The CPU linear over a bit-plane matrix (matvec, batched matmul, gather).
std::unique_ptr<CpuLinear> make_bitplane_linear(BitplaneMatrix matrix);

}  // namespace lowbit::kernels
