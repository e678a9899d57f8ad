// The 5-bit affine matvec kernels (all batch widths and group sizes).
#include "matvec.cuh"

namespace lowbit::kernels::cuda {
template void launch_affine_bits<5>(const AffineDevice&, const float*, int, int, float*, CUstream_st*);
}  // namespace lowbit::kernels::cuda
