#include "kernels/cpu/two_plane_kernels.h"

#include <vector>

#include "kernels/cpu/lut_kernels.h"
#include "lowbit/codec/two_plane.h"
#include "lowbit/core/thread_pool.h"

namespace lowbit::kernels {

std::unique_ptr<CpuLinear> prepare_two_plane(const codec::TensorRef& tensor) {
  namespace tp = codec::two_plane;
  const tp::Layout l = tp::layout(tensor.params, tensor.shape);
  LutMatrix m(LutKind::two_plane, l.rows, l.cols, l.padded_cols, 0.0f);
  const auto padded = static_cast<size_t>(l.padded_cols), groups = static_cast<size_t>(l.groups_per_row());
  default_pool().parallel_for(static_cast<size_t>(l.rows), 64, [&](size_t r0, size_t r1) {
    // One row of plane codes and metadata: the bounded scratch.
    std::vector<uint8_t> base(padded), residual(padded), codes(padded);
    std::vector<float> meta(4 * groups);
    float *bs = meta.data(), *bb = bs + groups, *rs = bb + groups, *rb = rs + groups;
    for (auto r = static_cast<int64_t>(r0); r < static_cast<int64_t>(r1); ++r) {
      tp::row_plane_codes(l, tensor.arrays, r, base.data(), residual.data());
      for (size_t c = 0; c < padded; ++c) codes[c] = static_cast<uint8_t>(base[c] | residual[c] << 2);
      m.set_codes(r, codes.data());
      tp::row_metadata(l, tensor.arrays, r, {bs, bb, rs, rb});
      for (size_t g = 0; g < groups; ++g) {
        m.set_meta(r, static_cast<int64_t>(g), 0, bs[g]);
        m.set_meta(r, static_cast<int64_t>(g), 1, rs[g]);
        m.set_meta(r, static_cast<int64_t>(g), 2, bb[g] + rb[g]);
      }
    }
  });
  return make_lut_linear(std::move(m));
}

}  // namespace lowbit::kernels
