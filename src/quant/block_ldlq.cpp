#include "lowbit/quant/block_ldlq.h"

#include <algorithm>

#include "lowbit/codec/hadamard.h"
#include "lowbit/codec/trellis.h"
#include "lowbit/core/error.h"
#include "lowbit/core/thread_pool.h"
#include "lowbit/quant/allocate.h"
#include "linalg.h"

namespace lowbit::quant {

namespace {

using codec::trellis::kBlock;
using codec::trellis::kTileDim;

// Below this fraction of plain coding's loss as estimated on the row sample, BlockLDLQ is kept without coding
// the whole tensor plainly: the estimate is within a few percent (allocate_test bounds it by 15%), so the exact
// comparison could not come out the other way. Above it, plain coding runs whole and the guard compares exactly.
constexpr double kSampledGuardMargin = 0.8;

// Rows of m [rows, n] <- R row (so m <- m R^T).
void rotate_rows(std::vector<float>& m, int64_t n, const codec::hadamard::RandomizedHadamard& r) {
  const auto rows = static_cast<int64_t>(m.size()) / n;
  default_pool().parallel_for(static_cast<size_t>(rows), 8, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) r.forward(m.data() + i * n);
  });
}

// X = inv(U_BB) U_B,later [16, later] of the 16 columns of block b, in f32: the map from a block's error to the
// update of the later columns. U_BB is upper triangular: one triangular solve.
std::vector<float> feedback(const std::vector<double>& u, int64_t n, int64_t b0, int64_t b1) {
  const int64_t later = n - b1, bs = b1 - b0;
  std::vector<double> x(static_cast<size_t>(bs * later));
  for (int64_t i = 0; i < bs; ++i) std::copy_n(u.begin() + (b0 + i) * n + b1, later, x.begin() + i * later);
  solve_upper(u.data() + b0 * n + b0, n, bs, x.data(), later);
  return std::vector<float>(x.begin(), x.end());
}

}  // namespace

RoundingResult block_ldlq_quantize(const codec::Params& params, const Shape& shape, const float* w_in,
                                   const Hessian& h, const GptqOptions& options) {
  const codec::Codec& codec = codec::codec_or_throw("trellis", "[block_ldlq]");
  const int64_t rows = codec::matrix_dims(shape).first, cols = codec::matrix_dims(shape).second;
  if (h.dim != cols) fail(Errc::shape, "[block_ldlq] Hessian is {} wide, weight has {} columns", h.dim, cols);
  const std::vector<float> original(w_in, w_in + rows * cols);

  RoundingResult result;
  const auto code_plainly = [&] {
    result.tensor = codec.encode(params, shape, w_in, options.encode);
    const std::vector<float> q = codec::decode_all({&codec, result.tensor.params, shape, result.tensor.views()});
    result.rtn_loss = result.loss = hessian_loss(original, q, rows, h);
    result.rtn_sampled_rows = 0;
  };
  // Where rows are coded independently, plain coding's error is estimated on allocate.h's row sample (an eighth
  // of a whole encode, which would be half of BlockLDLQ's time) and its row scales replaced by the rms ones it
  // starts from; plain coding runs whole only when the guard's comparison is close.
  const bool sampled = measured_on_sample({"trellis", params}, shape) && options.encode.column_importance.empty();
  codec::EncodedTensor ldlq;
  if (sampled) {
    const CandidateMeasure plain =
        measure_candidate({"trellis", params}, shape, w_in, &h, options.encode.seed, "[block_ldlq]");
    result.rtn_loss = plain.loss;
    result.rtn_sampled_rows = plain.sampled_rows;
    ldlq.params = plain.params;
  } else {
    code_plainly();
    ldlq = result.tensor;
  }
  const codec::trellis::Layout lay = codec::trellis::parse_layout(ldlq.params, shape);
  if (lay.rotate_output) {  // the feedback runs over inputs only; plain coding stays
    result.hessian_aware = false;
    return result;
  }

  // W' [pr, pc] and H' [pc, pc] in the stored (rotated, padded) domain.
  const int64_t pr = lay.padded_rows, pc = lay.padded_cols;
  std::vector<float> wp(static_cast<size_t>(pr * pc), 0.0f), hp(static_cast<size_t>(pc * pc), 0.0f);
  for (int64_t r = 0; r < rows; ++r) std::copy_n(w_in + r * cols, cols, wp.begin() + r * pc);
  for (int64_t i = 0; i < cols; ++i)
    for (int64_t j = 0; j < cols; ++j) hp[i * pc + j] = static_cast<float>(h.h[i * cols + j]);
  if (lay.rotate_input) {
    const codec::hadamard::RandomizedHadamard rot(pc, lay.input_seed);
    rotate_rows(wp, pc, rot);
    rotate_rows(hp, pc, rot);  // H R^T
    hp = transpose(hp.data(), pc, pc, pc);  // R H (H symmetric)
    rotate_rows(hp, pc, rot);  // R H R^T
  }
  const std::vector<double> u = damped_inverse_factor(std::vector<double>(hp.begin(), hp.end()), pc, options.damp);

  if (sampled) {
    ldlq.arrays.emplace_back("codes", make_buffer(DType::U16, {lay.row_tiles(), lay.col_tiles(), lay.words_per_tile()}));
    ldlq.arrays.emplace_back("scales", codec::trellis::starting_scales(lay, wp));
  }
  auto* codes = ldlq.arrays[0].second.as<uint16_t>();
  const TensorView scales = ldlq.views().at("scales");
  std::vector<float> scale(static_cast<size_t>(pr));
  for (int64_t r = 0; r < pr; ++r) scale[r] = load_float(DType::F16, scales.bytes.data(), lay.per_row_scale ? r : 0);

  std::vector<float> err(static_cast<size_t>(pr * kTileDim));
  for (int64_t bt = 0; bt < lay.col_tiles(); ++bt) {
    const int64_t b0 = bt * kTileDim, b1 = b0 + kTileDim;
    // Code block bt of every tile row from the error-fed weights.
    default_pool().parallel_for(static_cast<size_t>(lay.row_tiles()), 1, [&](size_t t0, size_t t1) {
      codec::trellis::BlockEncoder encoder(lay.code, lay.L, lay.k);
      float target[kBlock], importance[kBlock], recon[kBlock];
      for (size_t rt = t0; rt < t1; ++rt) {
        const int64_t r0 = static_cast<int64_t>(rt) * kTileDim;
        for (int i = 0; i < kBlock; ++i) {
          const int64_t r = r0 + i / kTileDim, c = b0 + i % kTileDim;
          const float s = scale[r];
          target[i] = s != 0.0f ? wp[r * pc + c] / s : 0.0f;
          importance[i] = r < rows ? static_cast<float>(hp[c * pc + c]) * s * s : 0.0f;
        }
        encoder.encode(target, importance, codes + (static_cast<int64_t>(rt) * lay.col_tiles() + bt) * lay.words_per_tile(),
                       recon);
        for (int i = 0; i < kBlock; ++i) {
          const int64_t r = r0 + i / kTileDim, c = b0 + i % kTileDim;
          err[r * kTileDim + (c - b0)] = wp[r * pc + c] - recon[i] * scale[r];
        }
      }
    });
    if (b1 >= pc) break;
    // W'[:, b1:] -= E [pr, 16] @ X, X = inv(U_BB) U_B,later [16, later]: one product.
    const int64_t later = pc - b1;
    const std::vector<float> x = feedback(u, pc, b0, b1);
    gemm(pr, later, kTileDim, -1.0f, err.data(), kTileDim, x.data(), later, false, 1.0f, wp.data() + b1, pc);
  }

  const std::vector<float> q = codec::decode_all({&codec, ldlq.params, shape, ldlq.views()});
  const double loss = hessian_loss(original, q, rows, h);
  if (sampled && loss > kSampledGuardMargin * result.rtn_loss) code_plainly();
  if (result.rtn_sampled_rows > 0 || loss <= result.rtn_loss) {
    result.loss = loss;
    result.tensor = std::move(ldlq);
  } else {
    result.guard_tripped = true;
  }
  return result;
}

}  // namespace lowbit::quant
