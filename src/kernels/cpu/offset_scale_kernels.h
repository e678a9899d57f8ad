// CPU kernels for the offset_scale codec (lowbit/codec/offset_scale.h): the codes and f16 group scales are
// re-laid out at prepare time, one block of rows at a time, into the row-block layout of block_kernels.h (3-bit
// codes stay 3 bits: a 2-bit and a 1-bit plane), the bias implied by the zero point.
#pragma once

#include <memory>

#include "lowbit/kernels/cpu.h"

namespace lowbit::kernels {
std::unique_ptr<CpuLinear> prepare_offset_scale(const codec::TensorRef& tensor);
}
