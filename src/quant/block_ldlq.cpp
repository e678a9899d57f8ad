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

// U[r0:r1, c0:c1] in f32, row-major [r1 - r0, c1 - c0]: the right operand of a feedback product.
std::vector<float> factor_block(const std::vector<double>& u, int64_t n, int64_t r0, int64_t r1, int64_t c0,
                                int64_t c1) {
  std::vector<float> out(static_cast<size_t>((r1 - r0) * (c1 - c0)));
  for (int64_t r = r0; r < r1; ++r)
    std::copy(u.begin() + r * n + c0, u.begin() + r * n + c1, out.begin() + (r - r0) * (c1 - c0));
  return out;
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

  // The feedback is lazy, as GPTQ's: a tile's error E [pr, 16] becomes Z = E inv(U_TT) (one triangular solve per
  // row), which updates the rest of its group of kLazyTiles tiles right away and the columns after the group in
  // one product of the group's Z [pr, 128] with U[group, after]: the same sum of per-tile updates
  // (W'[:, after] -= E inv(U_TT) U_T,after), with one pass over W' per group instead of one per tile.
  constexpr int64_t kLazyTiles = 8, kLazy = kLazyTiles * kTileDim;
  std::vector<float> z(static_cast<size_t>(pr * kLazy));  // [pr, kLazy]: the group's Z
  for (int64_t g0 = 0; g0 < pc; g0 += kLazy) {
    const int64_t g1 = std::min(pc, g0 + kLazy);
    for (int64_t b0 = g0; b0 < g1; b0 += kTileDim) {
      const int64_t bt = b0 / kTileDim, b1 = b0 + kTileDim;
      // Code block bt of every tile row from the error-fed weights; its Z from the error.
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
          encoder.encode(target, importance,
                         codes + (static_cast<int64_t>(rt) * lay.col_tiles() + bt) * lay.words_per_tile(), recon);
          for (int64_t r = r0; r < r0 + kTileDim; ++r) {
            float* zr = z.data() + r * kLazy + (b0 - g0);
            for (int64_t j = 0; j < kTileDim; ++j) {  // Z U_TT = E, column by column
              double e = wp[r * pc + b0 + j] - recon[(r - r0) * kTileDim + j] * scale[r];
              for (int64_t i = 0; i < j; ++i) e -= zr[i] * u[(b0 + i) * pc + b0 + j];
              zr[j] = static_cast<float>(e / u[(b0 + j) * pc + b0 + j]);
            }
          }
        }
      });
      if (b1 < g1) {
        const std::vector<float> ub = factor_block(u, pc, b0, b1, b1, g1);
        gemm(pr, g1 - b1, kTileDim, -1.0f, z.data() + (b0 - g0), kLazy, ub.data(), g1 - b1, false, 1.0f, wp.data() + b1,
             pc);
      }
    }
    if (g1 >= pc) break;
    const std::vector<float> ub = factor_block(u, pc, g0, g1, g1, pc);
    gemm(pr, pc - g1, g1 - g0, -1.0f, z.data(), kLazy, ub.data(), pc - g1, false, 1.0f, wp.data() + g1, pc);
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
