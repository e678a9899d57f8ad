// Row stacking of stored tensors for the GPU runtime: q, k and v (or gate and up) in one codec become one
// tensor [sum rows, cols], so that a decode step runs one matmul instead of three (or two).
#pragma once

#include <optional>
#include <span>

#include "lowbit/codec/codec.h"

namespace lowbit::model {

struct StackedTensor {
  codec::EncodedTensor encoded;
  codec::TensorRef ref;  // views `encoded`
};

// The parts' rows one after another, or nullopt where the codec's storage does not stack: different codecs or
// parameters, an array whose leading dimension does not add up across the parts (row tiles with padding,
// per-tensor scales), or decoded sample rows that differ from the parts'.
std::optional<StackedTensor> stack_rows(std::span<const codec::TensorRef* const> parts);

}  // namespace lowbit::model
