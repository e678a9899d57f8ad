#include <gtest/gtest.h>

#include <random>

#include "lowbit/codec/codec.h"
#include "lowbit/quant/allocate.h"

namespace lowbit::quant {
namespace {

// Exhaustive search over every combination: the optimum the allocator is measured against.
double brute_force(const std::vector<AllocationItem>& items, uint64_t budget) {
  double best = 1e300;
  std::vector<size_t> idx(items.size(), 0);
  for (;;) {
    uint64_t bytes = 0;
    double loss = 0;
    for (size_t i = 0; i < items.size(); ++i) {
      bytes += items[i].bytes[idx[i]];
      loss += items[i].loss[idx[i]];
    }
    if (bytes <= budget) best = std::min(best, loss);
    size_t k = 0;
    while (k < items.size() && ++idx[k] == items[k].bytes.size()) idx[k++] = 0;
    if (k == items.size()) return best;
  }
}

// Candidates shaped like codec widths: more bytes, less loss, with diminishing returns.
std::vector<AllocationItem> random_items(std::mt19937_64& rng, size_t n) {
  std::uniform_real_distribution<double> u(0.5, 2.0);
  std::vector<AllocationItem> items(n);
  for (size_t i = 0; i < n; ++i) {
    const double size = u(rng) * 1000, sensitivity = u(rng);
    for (int bits : {2, 3, 4}) {
      items[i].bytes.push_back(static_cast<uint64_t>(size * bits));
      items[i].loss.push_back(sensitivity * size * std::pow(4.0, -bits) * u(rng));
    }
  }
  return items;
}

TEST(Allocate, RespectsTheBudgetAndNearsTheOptimum) {
  std::mt19937_64 rng(42);
  for (int trial = 0; trial < 20; ++trial) {
    const auto items = random_items(rng, 6);
    uint64_t min_bytes = 0, max_bytes = 0;
    for (const auto& it : items) {
      min_bytes += it.bytes.front();
      max_bytes += it.bytes.back();
    }
    const uint64_t budget = min_bytes + (max_bytes - min_bytes) * (trial + 1) / 22;
    const Allocation a = allocate(items, budget);
    ASSERT_TRUE(a.feasible);
    EXPECT_LE(a.bytes, budget);
    const double optimum = brute_force(items, budget);
    EXPECT_LE(a.loss, optimum * 1.10 + 1e-12) << "trial " << trial;
  }
}

TEST(Allocate, GenerousBudgetTakesTheBestCandidates) {
  std::mt19937_64 rng(1);
  const auto items = random_items(rng, 5);
  const Allocation a = allocate(items, ~0ull);
  for (size_t i = 0; i < items.size(); ++i) EXPECT_EQ(a.choice[i], 2u);
}

TEST(Allocate, InfeasibleBudgetTakesTheSmallest) {
  std::mt19937_64 rng(2);
  const auto items = random_items(rng, 4);
  const Allocation a = allocate(items, 10);
  EXPECT_FALSE(a.feasible);
  for (size_t i = 0; i < items.size(); ++i) EXPECT_EQ(a.choice[i], 0u);
}

// A synthetic tensor for measure_candidate: rows of unequal sizes (what the row sample must average over) and a
// Hessian of correlated inputs with unequal variances.
struct Synthetic {
  int64_t rows, cols;
  std::vector<float> w;
  Hessian h;
};

Synthetic synthetic(int64_t rows, int64_t cols, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::uniform_real_distribution<float> u(0.3f, 3.0f);
  Synthetic s{rows, cols, std::vector<float>(static_cast<size_t>(rows * cols)), {}};
  for (int64_t r = 0; r < rows; ++r) {
    const float size = u(rng);
    for (int64_t c = 0; c < cols; ++c) s.w[r * cols + c] = size * n(rng);
  }
  s.h.dim = cols;
  s.h.h.assign(static_cast<size_t>(cols * cols), 0.0);
  std::vector<float> x(static_cast<size_t>(cols));
  for (int t = 0; t < 4 * cols; ++t) {
    const float shared = n(rng);
    for (int64_t c = 0; c < cols; ++c) x[c] = (1.0f + static_cast<float>(c % 5)) * n(rng) + 0.5f * shared;
    s.h.add(x.data(), 1, cols);
  }
  return s;
}

CodecChoice trellis(int k) { return {"trellis", {{"L", 8}, {"k", k}, {"code", "3inst"}}}; }

// The row sample's Hessian-weighted error estimates the whole tensor's: within 15% on a tensor of 40 tiles of
// unequal rows, and the bytes are exactly those of the whole encode.
TEST(MeasureCandidate, RowSampleEstimatesTheWholeTensor) {
  const Synthetic s = synthetic(640, 128, 7);
  const Shape shape{s.rows, s.cols};
  for (int k : {2, 3}) {
    const CandidateMeasure m = measure_candidate(trellis(k), shape, s.w.data(), &s.h, 3, "blk.0.weight");
    EXPECT_EQ(m.rows, 640);
    EXPECT_EQ(m.sampled_rows, 5 * 16) << "an eighth of 40 tiles";
    const codec::Codec& codec = codec::codec_or_throw("trellis", "test");
    codec::EncodeOptions eo;
    eo.seed = 3;
    const codec::EncodedTensor whole = codec.encode(trellis(k).params, shape, s.w.data(), eo);
    uint64_t bytes = 0;
    for (const auto& [role, buffer] : whole.arrays) bytes += buffer.bytes.size();
    EXPECT_EQ(m.bytes, bytes);
    const double full = hessian_loss(s.w, codec::decode_all({&codec, whole.params, shape, whole.views()}), s.rows, s.h);
    EXPECT_NEAR(m.loss / full, 1.0, 0.15) << "k " << k;
  }
}

// The sample is a fixed function of seed and name, and a tensor of few tiles is measured whole.
TEST(MeasureCandidate, SampleIsReproducibleAndSmallTensorsAreWhole) {
  const Synthetic s = synthetic(640, 64, 11);
  const Shape shape{s.rows, s.cols};
  const CandidateMeasure a = measure_candidate(trellis(2), shape, s.w.data(), &s.h, 5, "x.weight");
  const CandidateMeasure b = measure_candidate(trellis(2), shape, s.w.data(), &s.h, 5, "x.weight");
  EXPECT_EQ(a.loss, b.loss);
  const CandidateMeasure small = measure_candidate(trellis(2), {64, 64}, s.w.data(), &s.h, 5, "x.weight");
  EXPECT_EQ(small.sampled_rows, 64);
  const CodecChoice affine{"affine", {{"bits", 3}, {"group_size", 64}, {"scale_dtype", "bf16"}}};
  EXPECT_EQ(measure_candidate(affine, shape, s.w.data(), nullptr, 5, "x.weight").sampled_rows, 640);
}

}  // namespace
}  // namespace lowbit::quant
