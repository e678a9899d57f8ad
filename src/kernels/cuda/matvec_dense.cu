// The dense matvec kernels and the launchers' dispatch by element type and bit width.
#include "matvec.cuh"

namespace lowbit::kernels::cuda {

extern template void launch_affine_bits<2>(const AffineDevice&, const float*, int, int, float*, CUstream_st*);
extern template void launch_affine_bits<3>(const AffineDevice&, const float*, int, int, float*, CUstream_st*);
extern template void launch_affine_bits<5>(const AffineDevice&, const float*, int, int, float*, CUstream_st*);
extern template void launch_affine_bits<6>(const AffineDevice&, const float*, int, int, float*, CUstream_st*);

// The row-chunk kernel serves 3, 5 and 6 bits and 2 bits in groups of 16 (other 2/4 bits run on tensor cores, 8
// bits in the coalesced layout).
void launch_affine_kernel(const AffineDevice& w, const float* x, int m, int batch, float* y, CUstream_st* s) {
  switch (w.bits) {
    case 2: return launch_affine_bits<2>(w, x, m, batch, y, s);
    case 5: return launch_affine_bits<5>(w, x, m, batch, y, s);
    case 6: return launch_affine_bits<6>(w, x, m, batch, y, s);
    default: return launch_affine_bits<3>(w, x, m, batch, y, s);
  }
}

namespace {
template <bool G>
void launch_dense(const DenseDevice& w, const float* x, int m, int batch, float* y, CUstream_st* s,
                  const ExpertGroups& g) {
  const auto* data = static_cast<const uint32_t*>(w.data);
  switch (w.type) {
    case MetaType::bf16:
      return launch<Dense<MetaType::bf16>, G>({data, w.kpad / 2}, w.rows, w.cols, x, m, batch, y, s, g);
    case MetaType::f16:
      return launch<Dense<MetaType::f16>, G>({data, w.kpad / 2}, w.rows, w.cols, x, m, batch, y, s, g);
    case MetaType::f32: return launch<Dense<MetaType::f32>, G>({data, w.kpad}, w.rows, w.cols, x, m, batch, y, s, g);
  }
}
}  // namespace

void launch_dense_kernel(const DenseDevice& w, const float* x, int m, int batch, float* y, CUstream_st* s) {
  launch_dense<false>(w, x, m, batch, y, s, {});
}

// Dense f16/f32 experts (bf16 ones run the coalesced kernel).
void launch_grouped_dense_kernel(const DenseDevice& w, const ExpertGroups& g, const float* x, int batch, float* y,
                                 CUstream_st* s) {
  launch_dense<true>(w, x, batch, batch, y, s, g);
}

}  // namespace lowbit::kernels::cuda
