// Hessian-aware rounding for codecs whose grid is fixed column by column (GPTQ / LDLQ): columns are rounded left
// to right, each after the rounding error of the earlier ones has been fed forward through the inverse Hessian's
// Cholesky factor; a group's grid (scales, biases) is chosen by the codec's encoder when the sweep reaches the
// group, from the error-fed weights.
// A guard compares the Hessian-weighted loss with plain rounding and keeps the better (seed 003).
#pragma once

#include <cstdint>
#include <vector>

#include "lowbit/codec/codec.h"

namespace lowbit::quant {

// H = sum over calibration tokens of x x^T for a linear's input x (cols x cols, row-major, fp64).
struct Hessian {
  int64_t dim = 0;
  std::vector<double> h;
  uint64_t samples = 0;
  void add(const float* x, int64_t tokens, int64_t stride);  // accumulates rows of x [tokens, dim]
};

struct GptqOptions {
  double damp = 0.01;  // fraction of mean(diag(H)) added to the diagonal
  int64_t block = 128; // columns per lazy-update block
  // Choose each group's scales when the sweep reaches it, from the error-fed weights (codecs with a
  // "group_size"); false keeps the grid encode() chose from the original weights.
  bool regrid = true;
  codec::EncodeOptions encode;
};

struct RoundingResult {
  codec::EncodedTensor tensor;
  double loss = 0;       // tr((W - Q) H (W - Q)^T) of the kept result
  double rtn_loss = 0;   // the same for plain rounding
  int64_t rtn_sampled_rows = 0;  // rtn_loss estimated from this many rows (allocate.h's sample); 0: exact
  bool guard_tripped = false;  // Hessian-aware rounding came out worse and plain rounding was kept
  bool hessian_aware = true;   // false where the layout admits no error feedback and plain rounding is the result
};

// The upper Cholesky factor U of (H + damp * mean(diag H) * I)^-1 (n x n, row-major), with never-reached inputs
// (zero diagonal) pinned to the mean: the matrix GPTQ's and LDLQ's error feedback runs through.
std::vector<double> damped_inverse_factor(std::vector<double> h, int64_t n, double damp);

// Hessian-weighted squared error of a reconstruction Q of W [rows, cols] under H.
double hessian_loss(const std::vector<float>& w, const std::vector<float>& q, int64_t rows, const Hessian& h);

// W is row-major [rows, cols] with cols == h.dim. Requires codec.quantize_column.
RoundingResult gptq_quantize(const codec::Codec& codec, const codec::Params& params, const Shape& shape,
                             const float* w, const Hessian& h, const GptqOptions& options);

}  // namespace lowbit::quant
