// Overflow-checked size arithmetic: every size that comes from a file goes through these before it is used to
// index or allocate.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "lowbit/core/error.h"

namespace lowbit {

inline uint64_t checked_add(uint64_t a, uint64_t b, std::string_view what) {
  uint64_t r;
  if (__builtin_add_overflow(a, b, &r)) fail(Errc::overflow, "{}: size overflows 64 bits", what);
  return r;
}

inline uint64_t checked_mul(uint64_t a, uint64_t b, std::string_view what) {
  uint64_t r;
  if (__builtin_mul_overflow(a, b, &r)) fail(Errc::overflow, "{}: size overflows 64 bits", what);
  return r;
}

// Product of the dimensions; every dimension must be >= 0.
inline uint64_t checked_numel(std::span<const int64_t> shape, std::string_view what) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) fail(Errc::shape, "{}: negative dimension {}", what, d);
    n = checked_mul(n, static_cast<uint64_t>(d), what);
  }
  return n;
}

}  // namespace lowbit
