// The target-bits allocator: per tensor, one of its recipe candidates, so that the total measured error is
// smallest while the total bytes stay within the budget (a multiple-choice knapsack, solved by a Lagrangian
// sweep and finished greedily).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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

}  // namespace lowbit::quant
