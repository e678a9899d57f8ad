// CPU kernels for the affine codec (lowbit/codec/affine.h).
//
// Kernel layout: the codes are read as one or two planes of power-of-two width, each a row-major stream of
// uint32 words holding 32/width whole codes LSB-first. For 2, 4 and 8 bits that is the stored array itself
// (nothing is copied); 3, 5 and 6 bits are split at prepare time into a low plane (2, 4, 4 bits) and a high
// plane (1, 1, 2 bits), the same number of bytes as stored. A SIMD lane then owns a whole 32-bit word of the low
// plane and decodes it with shifts and masks only; the activations are permuted once per call into the matching
// order. (Byte lanes zero-extended on load measured slower on AVX-512: smaller blocks, more overhead.)
#pragma once

#include <memory>

#include "lowbit/kernels/cpu.h"

namespace lowbit::kernels {

// The planes and metadata one matvec reads; shared with the per-target SIMD code.
struct AffinePlanes {
  int lo_bits = 0;  // 2, 4 or 8
  int hi_bits = 0;  // 0, 1 or 2
  int64_t rows = 0;
  int64_t group_size = 0;
  int64_t groups = 0;    // per row
  const uint32_t* lo = nullptr;
  int64_t lo_words = 0;  // per row
  const uint32_t* hi = nullptr;
  int64_t hi_words = 0;  // per row
  DType scale_dtype = DType::BF16;
  const std::byte* scales = nullptr;  // [rows, groups]
  const std::byte* biases = nullptr;  // [rows, groups]
};

std::unique_ptr<CpuLinear> prepare_affine(const codec::TensorRef& tensor);

}  // namespace lowbit::kernels
