#include "lowbit/quant/allocate.h"

#include <algorithm>
#include <limits>

#include "lowbit/core/error.h"

namespace lowbit::quant {

namespace {

// Each item's candidate minimizing loss + lambda * bytes (ties to fewer bytes).
Allocation at_lambda(const std::vector<AllocationItem>& items, double lambda) {
  Allocation a;
  for (const auto& it : items) {
    size_t best = 0;
    double best_cost = std::numeric_limits<double>::infinity();
    for (size_t c = 0; c < it.bytes.size(); ++c) {
      const double cost = it.loss[c] + lambda * static_cast<double>(it.bytes[c]);
      if (cost < best_cost || (cost == best_cost && it.bytes[c] < it.bytes[best])) {
        best = c;
        best_cost = cost;
      }
    }
    a.choice.push_back(best);
    a.bytes += it.bytes[best];
    a.loss += it.loss[best];
  }
  return a;
}

struct Move {
  size_t item;
  size_t candidate;
};

// Applies the best improving change of one or two items that stays within the budget, while there is one.
void improve(const std::vector<AllocationItem>& items, uint64_t budget, Allocation& a) {
  auto delta_bytes = [&](const Move& m) {
    return static_cast<int64_t>(items[m.item].bytes[m.candidate]) -
           static_cast<int64_t>(items[m.item].bytes[a.choice[m.item]]);
  };
  auto delta_loss = [&](const Move& m) { return items[m.item].loss[m.candidate] - items[m.item].loss[a.choice[m.item]]; };
  for (int round = 0; round < 10000; ++round) {
    std::vector<Move> moves;
    for (size_t i = 0; i < items.size(); ++i)
      for (size_t c = 0; c < items[i].bytes.size(); ++c)
        if (c != a.choice[i]) moves.push_back({i, c});
    double best_gain = 1e-12;
    std::vector<Move> best_moves;
    const auto room = static_cast<int64_t>(budget) - static_cast<int64_t>(a.bytes);
    for (size_t x = 0; x < moves.size(); ++x) {
      if (delta_bytes(moves[x]) <= room && -delta_loss(moves[x]) > best_gain) {
        best_gain = -delta_loss(moves[x]);
        best_moves = {moves[x]};
      }
      for (size_t y = x + 1; y < moves.size(); ++y) {
        if (moves[y].item == moves[x].item) continue;
        const double gain = -(delta_loss(moves[x]) + delta_loss(moves[y]));
        if (gain > best_gain && delta_bytes(moves[x]) + delta_bytes(moves[y]) <= room) {
          best_gain = gain;
          best_moves = {moves[x], moves[y]};
        }
      }
    }
    if (best_moves.empty()) return;
    for (const Move& m : best_moves) {
      a.bytes = static_cast<uint64_t>(static_cast<int64_t>(a.bytes) + delta_bytes(m));
      a.loss += delta_loss(m);
      a.choice[m.item] = m.candidate;
    }
  }
}

}  // namespace

Allocation allocate(const std::vector<AllocationItem>& items, uint64_t budget) {
  for (const auto& it : items)
    if (it.bytes.empty() || it.bytes.size() != it.loss.size())
      fail(Errc::internal, "[allocate] '{}' needs one loss per candidate", it.name);

  // A larger lambda prices bytes higher. Find the smallest lambda whose allocation fits.
  Allocation best = at_lambda(items, 0.0);
  if (best.bytes > budget) {
    double lo = 0.0, hi = 1.0;
    Allocation fit = at_lambda(items, hi);
    for (int i = 0; i < 200 && fit.bytes > budget; ++i) fit = at_lambda(items, hi *= 4.0);
    if (fit.bytes > budget) {
      // Even the most byte-averse choice is too large: take every item's smallest candidate.
      Allocation smallest;
      smallest.feasible = false;
      for (const auto& it : items) {
        const size_t c = static_cast<size_t>(std::min_element(it.bytes.begin(), it.bytes.end()) - it.bytes.begin());
        smallest.choice.push_back(c);
        smallest.bytes += it.bytes[c];
        smallest.loss += it.loss[c];
      }
      return smallest;
    }
    for (int i = 0; i < 100; ++i) {
      const double mid = 0.5 * (lo + hi);
      Allocation a = at_lambda(items, mid);
      if (a.bytes <= budget) {
        hi = mid;
        fit = std::move(a);
      } else {
        lo = mid;
      }
    }
    best = std::move(fit);
  }
  // The sweep can leave budget unused between two lambdas, and small problems have a gap to the optimum:
  // improve by local search over single changes and pairs of changes that fit, best loss reduction first.
  improve(items, budget, best);
  return best;
}

}  // namespace lowbit::quant
