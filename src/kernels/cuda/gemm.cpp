// Checked entry points of the prefill GEMM kernels (affine_gemm.cu, tile_gemm.cu): the row count and layout checks
// the unchecked launchers rely on.
#include "kernels/cuda/gemm.h"

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
  const int64_t kpad = w.kblocks * mma_kblock_cols(w.bits);
  const bool group_ok = (w.group == 32 || w.group == 64 || w.group == 128) && kpad % w.group == 0;
  if ((w.bits != 2 && w.bits != 4) || !group_ok || w.row_tiles % (kMmaRows / 16) != 0 || w.row_tiles * 16 < w.rows ||
      kpad < w.cols)
    fail(Errc::unsupported, "[cuda affine gemm] {} bits, group {}, padded width {} has no kernel", w.bits, w.group, kpad);
  check_rows(m, w.row_tiles, "cuda affine gemm");
  launch_affine_gemm_kernel(w, x, m, y, s);
  check_last_error("cuda affine gemm");
}

void two_plane_gemm(const TwoPlaneDevice& w, const float* x, int64_t m, float* y, Stream s) {
  if (w.row_tiles % (kMmaRows / 16) != 0 || w.row_tiles * 16 < w.rows || w.kblocks * 128 < w.cols)
    fail(Errc::unsupported, "[cuda two_plane gemm] padded width {} has no kernel", w.kblocks * 128);
  check_rows(m, w.row_tiles, "cuda two_plane gemm");
  launch_two_plane_gemm_kernel(w, x, m, y, s);
  check_last_error("cuda two_plane gemm");
}

void coalesced_gemm(const CoalescedDevice& w, const float* x, int64_t m, float* y, Stream s) {
  const bool bits_ok = w.bits == 8 || (w.bits == 16 && w.group == 0);
  const bool group_ok = w.bits == 16 || (w.group >= 32 && (w.group & (w.group - 1)) == 0 && w.kpad % w.group == 0);
  if (!bits_ok || !group_ok || w.kpad % coalesced_step_cols(w.bits) != 0 || w.kpad < w.cols)
    fail(Errc::unsupported, "[cuda coalesced gemm] {} bits, group {}, padded width {} has no kernel", w.bits, w.group,
         w.kpad);
  check_rows(m, (w.rows + 15) / 16, "cuda coalesced gemm");
  launch_coalesced_gemm_kernel(w, x, m, y, s);
  check_last_error("cuda coalesced gemm");
}

void affine_gemm(const AffineDevice& w, const float* x, int64_t m, float* y, Stream s) {
  const bool bits_ok = w.bits == 3 || w.bits == 5 || w.bits == 6;
  const bool group_ok = w.group >= 32 && (w.group & (w.group - 1)) == 0;
  if (!bits_ok || !group_ok || w.kpad % kChunkWeights != 0 || w.kpad % w.group != 0 || w.kpad < w.cols)
    fail(Errc::unsupported, "[cuda affine gemm] {} bits, group {}, padded width {} has no kernel", w.bits, w.group,
         w.kpad);
  check_rows(m, (w.rows + 15) / 16, "cuda affine gemm");
  launch_affine_tile_gemm_kernel(w, x, m, y, s);
  check_last_error("cuda affine gemm");
}

}  // namespace lowbit::kernels::cuda
