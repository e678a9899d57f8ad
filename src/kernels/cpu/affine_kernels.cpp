// Affine weights (w = scale q + bias per group) prepared into the row-block layout, one block of rows at a
// time in parallel; the stored arrays are read once here and never again (the records replace them).
#include "affine_kernels.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "block_kernels.h"
#include "lowbit/codec/affine.h"
#include "lowbit/core/thread_pool.h"

namespace lowbit::kernels {

namespace {

// Whether every group's bias is -offset scale (finite): then w = scale (q - offset) exactly, and the records
// need not hold the biases. GGUF Q4_0, Q5_0, Q8_0, Q3_K and Q6_K load as affine this way (offset 2^(bits-1)), so
// their kernels read 4.5, 5.5, 8.5, 6 and 8 bits per weight instead of 5, 6, 9, 8 and 10.
bool biases_are_offset(const TensorView& scales, const TensorView& biases, DType dtype, float offset) {
  const size_t n = scales.bytes.size() / dtype_size(dtype);
  for (size_t i = 0; i < n; ++i) {
    const float scale = load_float(dtype, scales.bytes.data(), i);
    if (!std::isfinite(scale) || load_float(dtype, biases.bytes.data(), i) != -offset * scale) return false;
  }
  return true;
}

}  // namespace

std::unique_ptr<CpuLinear> prepare_affine(const codec::TensorRef& tensor) {
  namespace af = codec::affine;
  const af::Layout l = af::layout(tensor.params, tensor.shape);
  // Planes of 2, 4 or 8 bits, plus a high plane of 1 or 2. Groups of 16 fill half a chunk, which a 1-bit plane
  // cannot (block_kernels.h): 3 bits there take a 4-bit plane, one bit of it always zero.
  const int lo_bits = l.bits == 3 ? (l.group_size == 16 ? 4 : 2) : l.bits == 5 || l.bits == 6 ? 4 : l.bits;
  const TensorView &codes = tensor.arrays.at("codes"), &scales = tensor.arrays.at("scales"),
                   &biases = tensor.arrays.at("biases");
  const auto offset = static_cast<float>(1u << (l.bits - 1));
  const bool scale_only = biases_are_offset(scales, biases, l.scale_dtype, offset);
  BlockMatrix m(lo_bits, std::max(l.bits - lo_bits, 0), scale_only ? BlockMeta::scale_offset : BlockMeta::scale_bias,
                l.scale_dtype, l.rows, l.cols, l.padded_cols, l.group_size);
  m.offset = scale_only ? offset : 0.0f;
  const size_t meta_size = dtype_size(l.scale_dtype);
  const uint32_t lo_mask = (1u << lo_bits) - 1u;
  default_pool().parallel_for(static_cast<size_t>(m.blocks()), 16, [&](size_t b0, size_t b1) {
    std::vector<uint8_t> lo(static_cast<size_t>(l.padded_cols)), hi(lo.size());  // one row: the bounded scratch
    const int64_t r1 = std::min(l.rows, static_cast<int64_t>(b1) * kBlockRows);
    for (int64_t r = static_cast<int64_t>(b0) * kBlockRows; r < r1; ++r) {
      const uint32_t* words = codes.as<uint32_t>() + r * l.words_per_row();
      for (int64_t c = 0; c < l.padded_cols; ++c) {
        const uint32_t q = af::read_code(words, c, l.bits);
        lo[static_cast<size_t>(c)] = static_cast<uint8_t>(q & lo_mask);
        hi[static_cast<size_t>(c)] = static_cast<uint8_t>(q >> lo_bits);
      }
      m.set_row_codes(r, lo.data(), hi.data());
      for (int64_t g = 0; g < l.groups_per_row(); ++g) {
        const size_t at = static_cast<size_t>(r * l.groups_per_row() + g) * meta_size;
        m.set_meta(r, g, 0, scales.bytes.data() + at);
        if (!scale_only) m.set_meta(r, g, 1, biases.bytes.data() + at);
      }
    }
  });
  return make_block_linear(std::move(m),
                           codes.bytes.size() + scales.bytes.size() + (scale_only ? 0 : biases.bytes.size()));
}

}  // namespace lowbit::kernels
