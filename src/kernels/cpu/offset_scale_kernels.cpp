#include "offset_scale_kernels.h"

#include <algorithm>
#include <vector>

#include "block_kernels.h"
#include "lowbit/codec/offset_scale.h"
#include "lowbit/core/thread_pool.h"

namespace lowbit::kernels {

std::unique_ptr<CpuLinear> prepare_offset_scale(const codec::TensorRef& tensor) {
  namespace os = codec::offset_scale;
  const os::Layout l = os::layout(tensor.params, tensor.shape);
  const int lo_bits = l.grid.bits == 3 ? 2 : 4;
  BlockMatrix m(lo_bits, l.grid.bits - lo_bits, BlockMeta::scale_offset, DType::F16, l.rows, l.cols, l.padded_cols,
                os::kGroupSize);
  m.offset = static_cast<float>(l.grid.offset);
  const TensorView &codes = tensor.arrays.at("codes"), &scales = tensor.arrays.at("scales");
  const uint32_t lo_mask = (1u << lo_bits) - 1u;
  default_pool().parallel_for(static_cast<size_t>(m.blocks()), 16, [&](size_t b0, size_t b1) {
    std::vector<uint8_t> lo(static_cast<size_t>(l.padded_cols)), hi(lo.size());  // one row: the bounded scratch
    const int64_t r1 = std::min(l.rows, static_cast<int64_t>(b1) * kBlockRows);
    for (int64_t r = static_cast<int64_t>(b0) * kBlockRows; r < r1; ++r) {
      const uint8_t* row = codes.as<uint8_t>() + r * l.row_bytes();
      for (int64_t c = 0; c < l.padded_cols; ++c) {
        const uint32_t q = os::read_code(row, c, l.grid.bits);
        lo[static_cast<size_t>(c)] = static_cast<uint8_t>(q & lo_mask);
        hi[static_cast<size_t>(c)] = static_cast<uint8_t>(q >> lo_bits);
      }
      m.set_row_codes(r, lo.data(), hi.data());
      for (int64_t g = 0; g < l.groups_per_row(); ++g)
        m.set_meta(r, g, 0, scales.bytes.data() + static_cast<size_t>(r * l.groups_per_row() + g) * 2);
    }
  });
  return make_block_linear(std::move(m), codes.bytes.size() + scales.bytes.size());
}

}  // namespace lowbit::kernels
