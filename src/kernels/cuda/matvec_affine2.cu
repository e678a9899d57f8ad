// The 2-bit affine matvec kernels in groups of 16 (all batch widths).
#include "matvec.cuh"

namespace lowbit::kernels::cuda {
template void launch_affine_bits<2>(const AffineDevice&, const float*, int, int, float*, CUstream_st*);
}  // namespace lowbit::kernels::cuda
