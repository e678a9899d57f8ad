// CPU kernels for the offset_scale codec (lowbit/codec/offset_scale.h): the codes are re-laid out at prepare
// time, one row at a time, into 3 or 4 bit planes per group of 64 with the scale as f32 (bitplane_kernels.h).
#pragma once

#include <memory>

#include "lowbit/kernels/cpu.h"

namespace lowbit::kernels {
std::unique_ptr<CpuLinear> prepare_offset_scale(const codec::TensorRef& tensor);
}
