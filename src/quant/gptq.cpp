#include "lowbit/quant/gptq.h"

#include <algorithm>
#include <cmath>

#include "lowbit/core/error.h"
#include "lowbit/core/thread_pool.h"
#include "linalg.h"

namespace lowbit::quant {

namespace {

// Group width of a codec whose per-group parameters GPTQ may choose itself (normalized params with a
// "group_size", and a width it divides or pads to a whole number of groups, "padded_cols"); 0 keeps the grid
// encode() chose for the whole tensor.
int64_t regrid_width(const codec::Params& stored, int64_t cols) {
  if (!stored.is_object() || !stored.contains("group_size") || !stored["group_size"].is_number_integer()) return 0;
  const int64_t g = stored["group_size"].get<int64_t>();
  if (!(g > 0)) return 0;
  if (cols % g == 0) return g;
  const bool padded = stored.contains("padded_cols") && stored["padded_cols"].is_number_integer() &&
                      stored["padded_cols"].get<int64_t>() == (cols + g - 1) / g * g;
  return padded ? g : 0;
}

// Chooses the grid of the group at columns [c0, c0 + width) (the last group of a padded width may be narrower
// than `group`) from the current, error-fed weights, as GPTQ does when it reaches a group: the slice is encoded on
// its own (with a search weighted by diag(H) where the codec has one) and its per-group arrays (shape [rows, 1]:
// scales, biases) are copied into the tensor's [rows, groups] arrays. Codes are left to quantize_column.
void regrid(const codec::Codec& codec, const codec::Params& params, codec::EncodedTensor& tensor,
            const std::vector<float>& w, int64_t rows, int64_t cols, int64_t c0, int64_t group,
            const std::vector<float>& diag, const codec::EncodeOptions& base) {
  const int64_t width = std::min(group, cols - c0), groups = (cols + group - 1) / group;
  std::vector<float> slice(static_cast<size_t>(rows * width));
  for (int64_t r = 0; r < rows; ++r) std::copy_n(w.data() + r * cols + c0, width, slice.data() + r * width);
  codec::EncodeOptions eo = base;
  eo.column_importance = std::span(diag).subspan(static_cast<size_t>(c0), static_cast<size_t>(width));
  eo.search = true;
  eo.pool = &default_pool();
  const codec::EncodedTensor part = codec.encode(params, Shape{rows, width}, slice.data(), eo);
  const int64_t index = c0 / group;
  for (const auto& [role, sub] : part.arrays) {
    if (sub.shape != Shape{rows, 1}) continue;
    auto it = std::find_if(tensor.arrays.begin(), tensor.arrays.end(), [&](const auto& a) { return a.first == role; });
    if (it == tensor.arrays.end() || it->second.dtype != sub.dtype || it->second.shape.size() != 2 ||
        it->second.shape[0] != rows || it->second.shape[1] != groups)
      fail(Errc::internal, "[gptq] codec '{}': array '{}' is not one entry per row and group", codec.id, role);
    const size_t elem = dtype_size(sub.dtype);
    for (int64_t r = 0; r < rows; ++r)
      std::copy_n(sub.bytes.data() + r * elem, elem, it->second.bytes.data() + (r * groups + index) * elem);
  }
}

}  // namespace

std::vector<double> damped_inverse_factor(std::vector<double> hd, int64_t n, double damp) {
  // Inputs no calibration token reached carry no information: pin them so H stays definite.
  double mean_diag = 0;
  for (int64_t i = 0; i < n; ++i) mean_diag += hd[i * n + i];
  mean_diag /= static_cast<double>(n);
  if (!(mean_diag > 0)) mean_diag = 1.0;
  for (int64_t i = 0; i < n; ++i) {
    if (hd[i * n + i] == 0) hd[i * n + i] = mean_diag;
    hd[i * n + i] += damp * mean_diag;
  }
  // With J the order reversal, J H J = L L^T gives H = V V^T for the upper V = J L J, so H^-1 = V^-T V^-1 and
  // U = V^-1 = J L^-1 J is the upper factor with U^T U = H^-1: one Cholesky and one triangular inverse.
  std::vector<double> rev(static_cast<size_t>(n * n));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) rev[i * n + j] = hd[(n - 1 - i) * n + (n - 1 - j)];
  if (!cholesky_lower(rev, n)) fail(Errc::internal, "[gptq] damped Hessian is not positive definite");
  invert_lower(rev, n);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) hd[i * n + j] = rev[(n - 1 - i) * n + (n - 1 - j)];
  return hd;
}

void Hessian::add(const float* x, int64_t tokens, int64_t stride) {
  if (h.empty()) h.assign(static_cast<size_t>(dim * dim), 0.0);
  // H += X^T X, one chunk of tokens at a time: an f32 product, folded into the f64 total per chunk so that
  // rounding error does not grow with the calibration length.
  constexpr int64_t kChunk = 512;
  std::vector<float> g;
  for (int64_t t0 = 0; t0 < tokens; t0 += kChunk)
    add_gram(x + t0 * stride, std::min(kChunk, tokens - t0), dim, stride, g, h);
  samples += static_cast<uint64_t>(tokens);
}

double hessian_loss(const std::vector<float>& w, const std::vector<float>& q, int64_t rows, const Hessian& h) {
  // sum over rows r of e_r^T H e_r = <H, E^T E>: the Gram matrix of the error (one symmetric product, half the
  // work of E H), then its lower triangle against H's.
  std::vector<float> e(w.size());
  for (size_t i = 0; i < e.size(); ++i) e[i] = w[i] - q[i];
  return gram_inner(e.data(), rows, h.dim, h.h);
}

RoundingResult gptq_quantize(const codec::Codec& codec, const codec::Params& params, const Shape& shape,
                             const float* w_in, const Hessian& h, const GptqOptions& options) {
  if (!codec.quantize_column) fail(Errc::internal, "[gptq] codec '{}' has no column quantizer", codec.id);
  // Plain variables, not a structured binding: the lambdas below capture them (clang 14 cannot).
  const int64_t rows = codec::matrix_dims(shape).first, cols = codec::matrix_dims(shape).second;
  if (h.dim != cols) fail(Errc::shape, "[gptq] Hessian is {} wide, weight has {} columns", h.dim, cols);

  std::vector<float> w(w_in, w_in + rows * cols);
  const std::vector<double> u = damped_inverse_factor(h.h, cols, options.damp);

  RoundingResult result;
  codec::EncodedTensor rtn = codec.encode(params, shape, w_in, options.encode);
  const std::vector<float> rtn_q = codec::decode_all({&codec, rtn.params, shape, rtn.views()});
  result.tensor = rtn;

  // Groups get their grid when the column sweep reaches them; blocks then hold whole groups so that a group's
  // columns have seen every earlier column's feedback when it is chosen.
  const int64_t group = options.regrid ? regrid_width(result.tensor.params, cols) : 0;
  const int64_t block = group ? std::max(group, options.block / group * group) : options.block;
  std::vector<float> diag(static_cast<size_t>(cols));
  for (int64_t i = 0; i < cols; ++i) diag[i] = static_cast<float>(h.h[i * cols + i]);

  std::vector<float> q(static_cast<size_t>(rows * cols));
  std::vector<float> col(rows), qcol(rows);
  std::vector<float> err(static_cast<size_t>(rows * block));  // [rows, block] scaled errors of the block
  ThreadPool& pool = default_pool();
  for (int64_t b0 = 0; b0 < cols; b0 += block) {
    const int64_t b1 = std::min(cols, b0 + block), bw = b1 - b0;
    for (int64_t i = b0; i < b1; ++i) {
      if (group && i % group == 0) regrid(codec, params, result.tensor, w, rows, cols, i, group, diag, options.encode);
      for (int64_t r = 0; r < rows; ++r) col[r] = w[r * cols + i];
      codec.quantize_column(result.tensor.params, shape, result.tensor, i, col.data(), qcol.data());
      const double d = u[i * cols + i];
      pool.parallel_for(static_cast<size_t>(rows), 64, [&](size_t r0, size_t r1) {
        for (size_t r = r0; r < r1; ++r) {
          q[r * cols + i] = qcol[r];
          const double e = (static_cast<double>(col[r]) - qcol[r]) / d;
          err[r * bw + (i - b0)] = static_cast<float>(e);
          float* wr = w.data() + r * cols;
          for (int64_t j = i + 1; j < b1; ++j) wr[j] -= static_cast<float>(e * u[i * cols + j]);
        }
      });
    }
    if (b1 == cols) break;
    // Lazy update of the columns right of the block: W[:, b1:] -= Err [rows, bw] @ U[b0:b1, b1:], one product.
    const int64_t later = cols - b1;
    std::vector<float> ub(static_cast<size_t>(bw * later));  // U[b0:b1, b1:] in f32
    for (int64_t k = 0; k < bw; ++k) std::copy_n(u.begin() + (b0 + k) * cols + b1, later, ub.begin() + k * later);
    gemm(rows, later, bw, -1.0f, err.data(), bw, ub.data(), later, false, 1.0f, w.data() + b1, cols);
  }

  const std::vector<float> original(w_in, w_in + rows * cols);
  result.loss = hessian_loss(original, q, rows, h);
  result.rtn_loss = hessian_loss(original, rtn_q, rows, h);
  if (!(result.loss <= result.rtn_loss)) {
    result.guard_tripped = true;
    result.loss = result.rtn_loss;
    result.tensor = std::move(rtn);
  }
  return result;
}

}  // namespace lowbit::quant
