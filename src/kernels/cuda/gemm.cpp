// Checked entry points of the prefill GEMM kernels (affine_gemm.cu, tile_gemm.cu): the row count and layout checks
// the unchecked launchers rely on.
#include "gemm.h"

#include "lowbit/core/error.h"
#include "lowbit/kernels/cuda.h"

namespace lowbit::kernels::cuda {

namespace {
// The grid's y dimension counts blocks of 128 rows.
void check_rows(int64_t m, int64_t row_tiles, const char* op) {
  if (m < 1) fail(Errc::limit, "[{}] {} activation rows", op, m);
  if (row_tiles * 16 > (int64_t{65535} << 7)) fail(Errc::limit, "[{}] {} rows exceed the grid", op, row_tiles * 16);
}
}  // namespace

void affine_mma_gemm(const AffineMmaDevice& w, const float* x, int64_t m, float* y, Stream s) {
  check_layout(w, "cuda affine gemm");
  check_rows(m, w.row_tiles, "cuda affine gemm");
  launch_affine_gemm_kernel(w, x, m, y, s);
  check_last_error("cuda affine gemm");
}

void two_plane_gemm(const TwoPlaneDevice& w, const float* x, int64_t m, float* y, Stream s) {
  check_layout(w, "cuda two_plane gemm");
  check_rows(m, w.row_tiles, "cuda two_plane gemm");
  launch_two_plane_gemm_kernel(w, x, m, y, s);
  check_last_error("cuda two_plane gemm");
}

void coalesced_gemm(const CoalescedDevice& w, const float* x, int64_t m, float* y, Stream s) {
  check_layout(w, "cuda coalesced gemm");
  check_rows(m, (w.rows + 15) / 16, "cuda coalesced gemm");
  launch_coalesced_gemm_kernel(w, x, m, y, s);
  check_last_error("cuda coalesced gemm");
}

void affine_gemm(const AffineDevice& w, const float* x, int64_t m, float* y, Stream s) {
  check_layout(w, "cuda affine gemm");
  // A stage of 64 columns holds at most two groups' meta per row (tile_gemm.cu).
  if (w.group < 32) fail(Errc::unsupported, "[cuda affine gemm] group {} has no tile GEMM", w.group);
  check_rows(m, (w.rows + 15) / 16, "cuda affine gemm");
  launch_affine_tile_gemm_kernel(w, x, m, y, s);
  check_last_error("cuda affine gemm");
}

}  // namespace lowbit::kernels::cuda
