#pragma once

#include <memory>

#include "lowbit/kernels/cpu.h"

namespace lowbit::kernels {
std::unique_ptr<CpuLinear> prepare_dense(const codec::TensorRef& tensor);
}
