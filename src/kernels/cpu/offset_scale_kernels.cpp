#include "kernels/cpu/offset_scale_kernels.h"

#include <vector>

#include "kernels/cpu/lut_kernels.h"
#include "lowbit/codec/offset_scale.h"
#include "lowbit/core/thread_pool.h"

namespace lowbit::kernels {

std::unique_ptr<CpuLinear> prepare_offset_scale(const codec::TensorRef& tensor) {
  namespace os = codec::offset_scale;
  const os::Layout l = os::layout(tensor.params, tensor.shape);
  LutMatrix m(l.grid.bits == 3 ? LutKind::offset_scale3 : LutKind::offset_scale4, l.rows, l.cols,
                   l.padded_cols, -static_cast<float>(l.grid.offset));
  const auto* codes = tensor.arrays.at("codes").as<uint8_t>();
  const auto* scales = tensor.arrays.at("scales").as<uint16_t>();
  default_pool().parallel_for(static_cast<size_t>(l.rows), 64, [&](size_t r0, size_t r1) {
    std::vector<uint8_t> row(static_cast<size_t>(l.padded_cols));  // one row of codes: the bounded scratch
    for (auto r = static_cast<int64_t>(r0); r < static_cast<int64_t>(r1); ++r) {
      for (int64_t c = 0; c < l.padded_cols; ++c)
        row[c] = static_cast<uint8_t>(os::read_code(codes + r * l.row_bytes(), c, l.grid.bits));
      m.set_codes(r, row.data());
      for (int64_t g = 0; g < l.groups_per_row(); ++g)
        m.set_meta(r, g, 0, f16_to_f32(scales[r * l.groups_per_row() + g]));
    }
  });
  return make_lut_linear(std::move(m));
}

}  // namespace lowbit::kernels
