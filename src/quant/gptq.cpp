#include "lowbit/quant/gptq.h"

#include <algorithm>
#include <cmath>

#include "lowbit/core/error.h"
#include "lowbit/core/thread_pool.h"

namespace lowbit::quant {

namespace {

// In-place lower Cholesky factor of a symmetric positive definite matrix A (n x n): A = L L^T.
bool cholesky_lower(std::vector<double>& a, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    double d = a[j * n + j];
    for (int64_t k = 0; k < j; ++k) d -= a[j * n + k] * a[j * n + k];
    if (!(d > 0)) return false;
    const double ljj = std::sqrt(d);
    a[j * n + j] = ljj;
    for (int64_t i = j + 1; i < n; ++i) {
      double s = a[i * n + j];
      for (int64_t k = 0; k < j; ++k) s -= a[i * n + k] * a[j * n + k];
      a[i * n + j] = s / ljj;
    }
    for (int64_t k = j + 1; k < n; ++k) a[j * n + k] = 0;
  }
  return true;
}

// The upper Cholesky factor U of H^-1 (H^-1 = U^T U), which GPTQ's error feedback uses row by row.
std::vector<double> inverse_hessian_factor(std::vector<double> h, int64_t n) {
  if (!cholesky_lower(h, n)) fail(Errc::internal, "[gptq] damped Hessian is not positive definite");
  // Linv = L^-1 (lower), by forward substitution column by column.
  std::vector<double> linv(n * n, 0.0);
  for (int64_t c = 0; c < n; ++c) {
    linv[c * n + c] = 1.0 / h[c * n + c];
    for (int64_t i = c + 1; i < n; ++i) {
      double s = 0;
      for (int64_t k = c; k < i; ++k) s += h[i * n + k] * linv[k * n + c];
      linv[i * n + c] = -s / h[i * n + i];
    }
  }
  // H^-1 = Linv^T Linv; its upper Cholesky factor U satisfies U^T U = H^-1. Compute M = H^-1, then factor.
  std::vector<double> hinv(n * n, 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j <= i; ++j) {
      double s = 0;
      for (int64_t k = i; k < n; ++k) s += linv[k * n + i] * linv[k * n + j];
      hinv[i * n + j] = hinv[j * n + i] = s;
    }
  if (!cholesky_lower(hinv, n)) fail(Errc::internal, "[gptq] inverse Hessian is not positive definite");
  std::vector<double> u(n * n, 0.0);  // U = L'^T
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j <= i; ++j) u[j * n + i] = hinv[i * n + j];
  return u;
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
  return inverse_hessian_factor(std::move(hd), n);
}

void Hessian::add(const float* x, int64_t tokens, int64_t stride) {
  if (h.empty()) h.assign(static_cast<size_t>(dim * dim), 0.0);
  // Partial sums over chunks of tokens in f32 (a vectorizable inner loop), folded into the f64 total per chunk
  // so that rounding error does not grow with the calibration length.
  constexpr int64_t kChunk = 64;
  default_pool().parallel_for(static_cast<size_t>(dim), 8, [&](size_t i0, size_t i1) {
    std::vector<float> acc(static_cast<size_t>(dim));
    for (size_t i = i0; i < i1; ++i) {
      double* hi = h.data() + i * dim;
      for (int64_t t0 = 0; t0 < tokens; t0 += kChunk) {
        std::fill(acc.begin(), acc.end(), 0.0f);
        const int64_t t1 = std::min(tokens, t0 + kChunk);
        for (int64_t t = t0; t < t1; ++t) {
          const float* row = x + t * stride;
          const float xi = row[i];
          if (xi == 0) continue;
          for (int64_t j = 0; j < dim; ++j) acc[j] += xi * row[j];
        }
        for (int64_t j = 0; j < dim; ++j) hi[j] += acc[j];
      }
    }
  });
  samples += static_cast<uint64_t>(tokens);
}

double hessian_loss(const std::vector<float>& w, const std::vector<float>& q, int64_t rows, const Hessian& h) {
  // sum over rows r of e_r^T H e_r with e_r = w_r - q_r.
  const int64_t n = h.dim;
  std::vector<double> partial(static_cast<size_t>(rows), 0.0);
  default_pool().parallel_for(static_cast<size_t>(rows), 4, [&](size_t r0, size_t r1) {
    std::vector<double> e(n);
    for (size_t r = r0; r < r1; ++r) {
      for (int64_t j = 0; j < n; ++j) e[j] = static_cast<double>(w[r * n + j]) - q[r * n + j];
      double total = 0;
      for (int64_t i = 0; i < n; ++i) {
        if (e[i] == 0) continue;
        const double* hi = h.h.data() + i * n;
        double s = 0;
        for (int64_t j = 0; j < n; ++j) s += hi[j] * e[j];
        total += e[i] * s;
      }
      partial[r] = total;
    }
  });
  double total = 0;
  for (double p : partial) total += p;
  return total;
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
  result.tensor = codec.encode(params, shape, w_in, options.encode);

  std::vector<float> q(static_cast<size_t>(rows * cols));
  std::vector<float> col(rows), qcol(rows);
  std::vector<double> err(static_cast<size_t>(rows * options.block));
  ThreadPool& pool = default_pool();
  for (int64_t b0 = 0; b0 < cols; b0 += options.block) {
    const int64_t b1 = std::min(cols, b0 + options.block);
    for (int64_t i = b0; i < b1; ++i) {
      for (int64_t r = 0; r < rows; ++r) col[r] = w[r * cols + i];
      codec.quantize_column(result.tensor.params, shape, result.tensor, i, col.data(), qcol.data());
      const double d = u[i * cols + i];
      pool.parallel_for(static_cast<size_t>(rows), 64, [&](size_t r0, size_t r1) {
        for (size_t r = r0; r < r1; ++r) {
          q[r * cols + i] = qcol[r];
          const double e = (static_cast<double>(col[r]) - qcol[r]) / d;
          err[r * options.block + (i - b0)] = e;
          float* wr = w.data() + r * cols;
          for (int64_t j = i + 1; j < b1; ++j) wr[j] -= static_cast<float>(e * u[i * cols + j]);
        }
      });
    }
    // Lazy update of the columns right of the block: W[:, b1:] -= Err [rows, block] @ U[b0:b1, b1:].
    pool.parallel_for(static_cast<size_t>(rows), 16, [&](size_t r0, size_t r1) {
      std::vector<double> acc(static_cast<size_t>(cols - b1));
      for (size_t r = r0; r < r1; ++r) {
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t k = b0; k < b1; ++k) {
          const double e = err[r * options.block + (k - b0)];
          const double* uk = u.data() + k * cols + b1;
          for (int64_t j = 0; j < cols - b1; ++j) acc[j] += e * uk[j];
        }
        float* wr = w.data() + r * cols + b1;
        for (int64_t j = 0; j < cols - b1; ++j) wr[j] -= static_cast<float>(acc[j]);
      }
    });
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
