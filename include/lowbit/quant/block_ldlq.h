// BlockLDLQ for the trellis codec (QTIP): columns are coded in blocks of 16, matching the 16 x 16 tiles, each
// tile by the Viterbi encoder, and a block's rounding error is fed forward to the later columns through the
// inverse Hessian's Cholesky factor, all in the rotated domain the codec stores (W' = W R^T, H' = R H R^T). Row
// scales are those of plain trellis coding. The guard keeps plain coding when it comes out better.
#pragma once

#include "lowbit/quant/gptq.h"

namespace lowbit::quant {

// The damping the quantize pipeline gives BlockLDLQ (fraction of mean(diag H), GptqOptions::damp). The feedback
// through a weakly damped calibration Hessian fits the calibration text and misses other text: on SmolLM2's
// first three layers (Debian calibration, 2048 tokens, trellis L 8 k 2), the Hessian-weighted error on WikiText
// relative to plain coding was 0.74 at 0.01, 0.57 at 0.1, 0.53 at 1 (0.64 / 0.54 / 0.52 / 0.53 at 0.01 / 0.1 /
// 0.3 / 1 with 8192 tokens), while on the calibration text it was 0.13 to 0.23.
inline constexpr double kBlockLdlqDamp = 0.3;

RoundingResult block_ldlq_quantize(const codec::Params& params, const Shape& shape, const float* w, const Hessian& h,
                                   const GptqOptions& options);

}  // namespace lowbit::quant
