#include <gtest/gtest.h>

#include <random>

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

}  // namespace
}  // namespace lowbit::quant
