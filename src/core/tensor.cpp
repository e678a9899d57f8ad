#include "lowbit/core/tensor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "lowbit/core/checked.h"

namespace lowbit {

std::string shape_str(const Shape& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

TensorBuffer make_buffer(DType dtype, Shape shape) {
  const uint64_t n = checked_numel(shape, "[make_buffer]");
  const uint64_t bytes = checked_mul(n, dtype_size(dtype), "[make_buffer]");
  TensorBuffer b;
  b.dtype = dtype;
  b.shape = std::move(shape);
  b.bytes.resize(bytes);
  return b;
}

}  // namespace lowbit
