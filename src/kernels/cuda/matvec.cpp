// Checked entry points of the matvec kernels (affine, dense, trellis): the batch and layout checks the unchecked launchers rely on
// (the layout checks serve the prefill GEMMs of gemm.cpp too).
#include <algorithm>

#include "matvec.h"
#include "trellis.h"

#include "lowbit/core/error.h"
#include "lowbit/kernels/cuda.h"

namespace lowbit::kernels::cuda {

void check_layout(const AffineDevice& w, const char* op) {
  const bool bits_ok = w.bits == 3 || w.bits == 5 || w.bits == 6 || (w.bits == 2 && w.group == 16);
  const bool group_ok = w.group >= 16 && (w.group & (w.group - 1)) == 0;
  if (!bits_ok || !group_ok || w.kpad % kChunkWeights != 0 || w.kpad % w.group != 0 || w.kpad < w.cols)
    fail(Errc::unsupported, "[{}] {} bits, group {}, padded width {} has no kernel", op, w.bits, w.group, w.kpad);
}

void check_layout(const CoalescedDevice& w, const char* op) {
  const bool bits_ok = w.bits == 8 || (w.bits == 16 && w.group == 0);
  const bool group_ok = w.bits == 16 || (w.group >= 32 && (w.group & (w.group - 1)) == 0 && w.kpad % w.group == 0);
  if (!bits_ok || !group_ok || w.kpad % coalesced_step_cols(w.bits) != 0 || w.kpad < w.cols)
    fail(Errc::unsupported, "[{}] {} bits, group {}, padded width {} has no kernel", op, w.bits, w.group, w.kpad);
}

void check_layout(const AffineMmaDevice& w, const char* op) {
  const int64_t kpad = w.kblocks * mma_kblock_cols(w.bits);
  const bool group_ok = (w.group == 32 || w.group == 64 || w.group == 128) && kpad % w.group == 0;
  if ((w.bits != 2 && w.bits != 4) || !group_ok || w.row_tiles % (kMmaRows / 16) != 0 || w.row_tiles * 16 < w.rows ||
      kpad < w.cols)
    fail(Errc::unsupported, "[{}] {} bits, group {}, padded width {} has no kernel", op, w.bits, w.group, kpad);
}

void check_layout(const TwoPlaneDevice& w, const char* op) {
  if (w.row_tiles % (kMmaRows / 16) != 0 || w.row_tiles * 16 < w.rows || w.kblocks * 128 < w.cols)
    fail(Errc::unsupported, "[{}] padded width {} has no kernel", op, w.kblocks * 128);
}

namespace {
// The compiled batch width that serves m rows.
int batch_width(int m, int64_t rows) {
  if (m < 1 || m > kMaxBatch) fail(Errc::limit, "[cuda matmul] batch {} outside [1, {}]", m, kMaxBatch);
  if (rows >= (int64_t{1} << 31)) fail(Errc::limit, "[cuda matmul] {} rows exceed the grid", rows);
  int width = 1;
  while (width < m) width *= 2;
  return width;
}
}  // namespace

void affine_matmul(const AffineDevice& w, const float* x, int m, float* y, Stream s) {
  check_layout(w, "cuda affine");
  launch_affine_kernel(w, x, m, batch_width(m, w.rows), y, s);
  check_last_error("cuda affine matmul");
}

void dense_matmul(const DenseDevice& w, const float* x, int m, float* y, Stream s) {
  if (w.kpad % kChunkWeights != 0 || w.kpad < w.cols)
    fail(Errc::unsupported, "[cuda dense] padded width {} has no kernel", w.kpad);
  launch_dense_kernel(w, x, m, batch_width(m, w.rows), y, s);
  check_last_error("cuda dense matmul");
}

void coalesced_matmul(const CoalescedDevice& w, const float* x, int m, float* y, Stream s) {
  check_layout(w, "cuda coalesced");
  launch_coalesced_kernel(w, x, m, batch_width(m, w.rows), y, s);
  check_last_error("cuda coalesced matmul");
}

void affine_mma_matmul(const AffineMmaDevice& w, const float* x, int m, float* y, Stream s) {
  check_layout(w, "cuda affine mma");
  const int batch = batch_width(m, w.row_tiles * 16);
  if (affine_fma_serves(w, batch)) {
    launch_affine_fma_kernel(w, x, m, batch, y, s);
  } else {
    launch_affine_mma_kernel(w, x, m, batch, y, s);
  }
  check_last_error("cuda affine mma matmul");
}

void grouped_matmul(const ExpertLayout& w, const ExpertGroups& g, const float* x, int batch, float* y, Stream s) {
  if (g.max_groups < 1 || g.max_groups > 65535)
    fail(Errc::limit, "[cuda grouped matmul] {} groups outside [1, 65535]", g.max_groups);
  switch (w.kind) {
    case ExpertLayout::Kind::dense:
      if (w.dense.kpad % kChunkWeights != 0 || w.dense.kpad < w.dense.cols)
        fail(Errc::unsupported, "[cuda grouped dense] padded width {} has no kernel", w.dense.kpad);
      launch_grouped_dense_kernel(w.dense, g, x, batch_width(batch, w.dense.rows), y, s);
      break;
    case ExpertLayout::Kind::coalesced:
      check_layout(w.coalesced, "cuda grouped coalesced");
      launch_grouped_coalesced_kernel(w.coalesced, g, x, batch_width(batch, w.coalesced.rows), y, s);
      break;
    case ExpertLayout::Kind::affine_mma:
      check_layout(w.mma, "cuda grouped affine mma");
      launch_grouped_affine_mma_kernel(w.mma, g, x, batch_width(batch, w.mma.row_tiles * 16), y, s);
      break;
  }
  check_last_error("cuda grouped matmul");
}

// Batches wider than the CUDA-core kernel's run in slices of kFmaMaxBatch rows (each reads the weights again).
void two_plane_matmul(const TwoPlaneDevice& w, const float* x, int m, float* y, Stream s) {
  check_layout(w, "cuda two_plane");
  if (!fma_group_sums_fit(w.kblocks, kFmaMaxBatch))
    fail(Errc::unsupported, "[cuda two_plane] padded width {} has no kernel", w.kblocks * 128);
  batch_width(m, w.row_tiles * 16);
  for (int i0 = 0; i0 < m; i0 += kFmaMaxBatch) {
    const int part = std::min(m - i0, kFmaMaxBatch);
    launch_two_plane_kernel(w, x + i0 * w.cols, part, batch_width(part, 1), y + i0 * w.rows, s);
  }
  check_last_error("cuda two_plane matmul");
}

namespace {
void check_trellis(const TrellisDevice& w) {
  if (w.k < 2 || w.k > 4 || w.L < 8 || w.L > 16 || w.padded_rows % 16 != 0 || w.chunks * 64 < w.cols)
    fail(Errc::unsupported, "[cuda trellis] k {}, L {} has no kernel", w.k, w.L);
}
}  // namespace

void trellis_matmul(const TrellisDevice& w, const float* x, int m, float* y, Stream s) {
  check_trellis(w);
  launch_trellis_kernel(w, x, m, batch_width(m, w.padded_rows), y, s);
  check_last_error("cuda trellis matmul");
}

void trellis_gemm(const TrellisDevice& w, const float* x, int64_t m, float* y, Stream s) {
  if (m < 1) fail(Errc::limit, "[cuda trellis gemm] {} rows", m);
  if (m <= kMaxBatch) return trellis_matmul(w, x, static_cast<int>(m), y, s);
  check_trellis(w);
  if (m > (int64_t{65535} << 6) || w.padded_rows >= (int64_t{1} << 31))  // grid.y of 64 rows, grid.x of 256 rows
    fail(Errc::limit, "[cuda trellis gemm] {} rows of [{}, {}] exceed the grid", m, w.rows, w.cols);
  launch_trellis_gemm_kernel(w, x, m, y, s);
  check_last_error("cuda trellis gemm");
}

void rotate(const RotationDevice& r, bool inverse, const float* in, int64_t in_len, int m, float* out, int64_t out_len,
            Stream s) {
  const int64_t chunks = r.small > 0 ? r.n / r.small : 0;
  const bool shape_ok = r.small >= 1 && r.n % r.small == 0 && (chunks & (chunks - 1)) == 0 && r.n <= kMaxRotation;
  if (!shape_ok || in_len < 1 || in_len > r.n || out_len < 1 || out_len > r.n || (inverse && in_len != r.n) ||
      (!inverse && out_len != r.n))
    fail(Errc::unsupported, "[cuda rotate] size {} (small factor {}), in {}, out {} has no kernel", r.n, r.small,
         in_len, out_len);
  if (m < 1) fail(Errc::limit, "[cuda rotate] {} rows", m);
  launch_rotate_kernel(r, inverse, in, in_len, m, out, out_len, s);
  check_last_error("cuda rotate");
}

}  // namespace lowbit::kernels::cuda
