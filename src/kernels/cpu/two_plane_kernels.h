// CPU kernels for the two_plane codec (lowbit/codec/two_plane.h): whatever the storage (planes, quint5, trit3)
// and metadata (full, slim), prepare decodes one row at a time into the row-block layout of block_kernels.h:
// the base and residual 2-bit planes side by side and f32 {base scale, residual scale, base bias + residual
// bias} per group of 128, so one kernel pass computes base + residual.
#pragma once

#include <memory>

#include "lowbit/kernels/cpu.h"

namespace lowbit::kernels {
std::unique_ptr<CpuLinear> prepare_two_plane(const codec::TensorRef& tensor);
}
