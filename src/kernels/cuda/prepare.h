// Host-side re-expressions behind prepare_cuda, visible to the tests (they run without a GPU).
#pragma once

#include "lowbit/codec/codec.h"

namespace lowbit::kernels::cuda {

// An offset_scale tensor as the equal affine tensor (same code bits; f32 scales, biases = -offset * scale),
// which the affine kernels run.
codec::EncodedTensor offset_scale_as_affine(const codec::TensorRef& tensor);

}  // namespace lowbit::kernels::cuda
