// BlockLDLQ for the trellis codec (QTIP): columns are coded in blocks of 16, matching the 16 x 16 tiles, each
// tile by the Viterbi encoder, and a block's rounding error is fed forward to the later columns through the
// inverse Hessian's Cholesky factor, all in the rotated domain the codec stores (W' = W R^T, H' = R H R^T). Row
// scales are those of plain trellis coding. The guard keeps plain coding when it comes out better.
#pragma once

#include "lowbit/quant/gptq.h"

namespace lowbit::quant {

RoundingResult block_ldlq_quantize(const codec::Params& params, const Shape& shape, const float* w, const Hessian& h,
                                   const GptqOptions& options);

}  // namespace lowbit::quant
