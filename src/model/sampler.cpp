#include "lowbit/model/sampler.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "lowbit/core/error.h"

namespace lowbit::model {

int32_t argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = static_cast<int32_t>(i);
  return best;
}

Sampler::Sampler(const SamplerOptions& options) : options_(options), rng_(options.seed) {
  const auto& o = options_;
  if (!(o.temperature >= 0) || o.top_k < 0 || !(o.top_p > 0 && o.top_p <= 1) || !(o.min_p >= 0 && o.min_p <= 1) ||
      !(o.repeat_penalty > 0) || o.repeat_last_n < 0)
    fail(Errc::usage, "[sampler] need temp >= 0, top-k >= 0, 0 < top-p <= 1, 0 <= min-p <= 1, repeat penalty > 0");
}

int32_t Sampler::sample(std::span<float> logits, std::span<const int32_t> history) {
  if (logits.empty()) fail(Errc::internal, "[sampler] empty logits");
  if (options_.repeat_penalty != 1.0f) {
    const size_t n = std::min(history.size(), static_cast<size_t>(options_.repeat_last_n));
    const std::unordered_set<int32_t> recent(history.end() - static_cast<std::ptrdiff_t>(n), history.end());
    for (int32_t id : recent) {
      if (id < 0 || static_cast<size_t>(id) >= logits.size()) continue;
      float& l = logits[id];
      l = l > 0 ? l / options_.repeat_penalty : l * options_.repeat_penalty;
    }
  }
  if (options_.temperature == 0.0f) return argmax(logits);

  // Candidates sorted by logit, descending, cut to top-k.
  candidates_.clear();
  for (size_t i = 0; i < logits.size(); ++i) candidates_.emplace_back(logits[i], static_cast<int32_t>(i));
  const size_t k = options_.top_k > 0 ? std::min(candidates_.size(), static_cast<size_t>(options_.top_k))
                                      : candidates_.size();
  const auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  std::partial_sort(candidates_.begin(), candidates_.begin() + static_cast<std::ptrdiff_t>(k), candidates_.end(), by_logit);
  candidates_.resize(k);

  // Softmax at the temperature, in place of the logits.
  const float max = candidates_.front().first;
  double sum = 0;
  for (auto& c : candidates_) {
    c.first = std::exp((c.first - max) / options_.temperature);
    sum += c.first;
  }
  for (auto& c : candidates_) c.first = static_cast<float>(c.first / sum);

  // Top-p: the shortest prefix holding at least top_p of the mass; min-p: drop tokens below min_p * p_max.
  size_t keep = candidates_.size();
  if (options_.top_p < 1.0f) {
    double cum = 0;
    for (size_t i = 0; i < candidates_.size(); ++i) {
      cum += candidates_[i].first;
      if (cum >= options_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  const float floor = options_.min_p * candidates_.front().first;
  while (keep > 1 && candidates_[keep - 1].first < floor) --keep;
  candidates_.resize(keep);

  double mass = 0;
  for (const auto& c : candidates_) mass += c.first;
  const double r = std::uniform_real_distribution<double>(0.0, mass)(rng_);
  double cum = 0;
  for (const auto& c : candidates_) {
    cum += c.first;
    if (r < cum) return c.second;
  }
  return candidates_.back().second;
}

}  // namespace lowbit::model
