// CPU kernels for the affine codec (lowbit/codec/affine.h): the codes and metadata re-laid out at prepare time
// into row blocks (kernels/cpu/block_kernels.h), with 3, 5 and 6 bits split into a low plane (2, 4, 4 bits) and
// a high plane (1, 1, 2 bits) of whole codes per field, the same number of bytes as stored.
#pragma once

#include <memory>

#include "lowbit/kernels/cpu.h"

namespace lowbit::kernels {

std::unique_ptr<CpuLinear> prepare_affine(const codec::TensorRef& tensor);

}  // namespace lowbit::kernels
