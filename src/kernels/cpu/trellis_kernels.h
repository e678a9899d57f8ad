// CPU kernels for the trellis codec (lowbit/codec/trellis.h): activations are rotated into the stored domain
// (x' = R_in x, zero-padded), each 16 x 16 tile is decoded from its bit stream through the code table into
// scratch and reused across the batch, and the outputs are rotated back (y = R_out^T y').
#pragma once

#include <memory>

#include "lowbit/kernels/cpu.h"

namespace lowbit::kernels {
std::unique_ptr<CpuLinear> prepare_trellis(const codec::TensorRef& tensor);
}
