// Non-owning views of typed arrays (usually inside a mapped file) and an owning buffer for produced arrays.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "lowbit/core/dtype.h"

namespace lowbit {

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& shape);  // "[576, 1536]"

struct TensorView {
  DType dtype = DType::F32;
  Shape shape;
  std::span<const std::byte> bytes;

  template <class T>
  const T* as() const { return reinterpret_cast<const T*>(bytes.data()); }
};

struct TensorBuffer {
  DType dtype = DType::F32;
  Shape shape;
  std::vector<std::byte> bytes;

  TensorView view() const { return {dtype, shape, bytes}; }
  template <class T>
  T* as() { return reinterpret_cast<T*>(bytes.data()); }
};

// Allocates a zeroed buffer of the given dtype and shape (size checked for overflow).
TensorBuffer make_buffer(DType dtype, Shape shape);

}  // namespace lowbit
