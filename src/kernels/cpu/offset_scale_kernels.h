// CPU kernels for the offset_scale codec (lowbit/codec/offset_scale.h): the codes are re-laid out at prepare
// time, one row at a time, into the table-lookup layout of lut_kernels.h (3-bit codes stay 3 bits) with the
// group scale as f32.
#pragma once

#include <memory>

#include "lowbit/kernels/cpu.h"

namespace lowbit::kernels {
std::unique_ptr<CpuLinear> prepare_offset_scale(const codec::TensorRef& tensor);
}
