// The trellis 3INST decode on AVX-512 with VBMI and FP16 (Sapphire Rapids and later; Highway 1.0 has no target
// with FP16 arithmetic): 32 states per step from one byte permutation and one multishift of the stream, the LCG
// in 16-bit lanes and the code's f16 addition as one vaddph, where the portable path (trellis_kernels.cpp) spends
// about three times the instructions on 16 states. Same results bit for bit: the code values are exact.
#pragma once

#include <cstddef>

#include "lowbit/codec/trellis.h"

namespace lowbit::kernels::trellis_avx512 {

// True when this path may run: the code is 3INST, the CPU has AVX-512 FP16 and VBMI, and Highway's dispatch is
// on its AVX3_DL target (so that tests pinning another target with hwy::SetSupportedTargetsForTest also leave
// this path).
bool usable(codec::trellis::Code code);

// As trellis_kernels.cpp's DecodeTile and MatvecTileRows for 3INST: out [16, 16 tiles] (row stride `stride`) =
// the code values of `tiles` consecutive tiles of one tile row, row r times scales[r]; y [16 (tr1 - tr0)] = the
// rows of tile rows [tr0, tr1) @ x (padded_cols), times their scales.
void decode_tiles(const std::byte* codes, size_t tiles, int k, int L, const float* scales, float* out, size_t stride);
void matvec_tile_rows(const std::byte* codes, size_t col_tiles, int k, int L, const float* scales, const float* x,
                      size_t tr0, size_t tr1, float* y);

}  // namespace lowbit::kernels::trellis_avx512
