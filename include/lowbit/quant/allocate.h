// The target-bits allocator: per tensor, one of its recipe candidates, so that the total measured error is
// smallest while the total bytes stay within the budget (a multiple-choice knapsack, solved by a Lagrangian
// sweep and finished greedily).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "lowbit/quant/gptq.h"
#include "lowbit/quant/recipe.h"

namespace lowbit::quant {

struct AllocationItem {
  std::string name;
  std::vector<uint64_t> bytes;  // per candidate
  std::vector<double> loss;     // per candidate, same length
};

struct Allocation {
  std::vector<size_t> choice;  // per item, an index into its candidates
  uint64_t bytes = 0;
  double loss = 0;
  bool feasible = true;  // false when even the smallest candidates exceed the budget (they are chosen then)
};

Allocation allocate(const std::vector<AllocationItem>& items, uint64_t budget_bytes);

// One candidate measured by plain coding: the bytes it stores for the whole tensor, and its error
// (tr((W - Q) H (W - Q)^T) with a Hessian, sum (W - Q)^2 without), from `sampled_rows` of the `rows`.
struct CandidateMeasure {
  uint64_t bytes = 0;
  double loss = 0;
  int64_t rows = 0, sampled_rows = 0;
  codec::Params params;  // as the whole tensor stores them (defaults filled in, its own padding)
};

// Trellis's Viterbi costs seconds per tensor and candidate (a full encode of every candidate would add more than
// the whole quantize takes), so trellis is measured on a fixed pseudo-random sample of its 16-row tiles (about an
// eighth, at least kMeasureMinTiles): with per-row scales and input rotation only, every row is coded on its own,
// so the sampled rows come out exactly as in the whole tensor, and their error times rows / sampled rows
// estimates the tensor's without bias (the error is a sum over rows). Other codecs are measured whole.
inline constexpr int64_t kMeasureMinTiles = 4;
inline constexpr int64_t kMeasureTileFraction = 8;
// Whether measure_candidate measures this choice on a sample of rows.
bool measured_on_sample(const CodecChoice& choice, const Shape& shape);
CandidateMeasure measure_candidate(const CodecChoice& choice, const Shape& shape, const float* w, const Hessian* h,
                                   uint64_t seed, std::string_view tensor_name);

}  // namespace lowbit::quant
