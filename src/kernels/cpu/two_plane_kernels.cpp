#include "two_plane_kernels.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "block_kernels.h"
#include "lowbit/codec/two_plane.h"
#include "lowbit/core/thread_pool.h"

namespace lowbit::kernels {

std::unique_ptr<CpuLinear> prepare_two_plane(const codec::TensorRef& tensor) {
  namespace tp = codec::two_plane;
  const tp::Layout l = tp::layout(tensor.params, tensor.shape);
  BlockMatrix m(2, 2, BlockMeta::two_scales, DType::F32, l.rows, l.cols, l.padded_cols, 128);
  const auto padded = static_cast<size_t>(l.padded_cols), groups = static_cast<size_t>(l.groups_per_row());
  default_pool().parallel_for(static_cast<size_t>(m.blocks()), 16, [&](size_t b0, size_t b1) {
    // One row of plane codes and metadata: the bounded scratch.
    std::vector<uint8_t> base(padded), residual(padded);
    std::vector<float> meta(4 * groups);
    float *bs = meta.data(), *bb = bs + groups, *rs = bb + groups, *rb = rs + groups;
    const int64_t r1 = std::min(l.rows, static_cast<int64_t>(b1) * kBlockRows);
    for (int64_t r = static_cast<int64_t>(b0) * kBlockRows; r < r1; ++r) {
      tp::row_plane_codes(l, tensor.arrays, r, base.data(), residual.data());
      m.set_row_codes(r, base.data(), residual.data());
      tp::row_metadata(l, tensor.arrays, r, {bs, bb, rs, rb});
      for (size_t g = 0; g < groups; ++g) {
        const float values[3] = {bs[g], rs[g], bb[g] + rb[g]};
        for (int slot = 0; slot < 3; ++slot)
          m.set_meta(r, static_cast<int64_t>(g), slot, reinterpret_cast<const std::byte*>(values + slot));
      }
    }
  });
  const uint64_t bytes = m.bytes();  // what the kernel reads (quint5 and trit3 are decoded to planes here)
  return make_block_linear(std::move(m), bytes);
}

}  // namespace lowbit::kernels
