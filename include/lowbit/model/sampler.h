// Next-token sampling: repeat penalty, then greedy at temperature 0, else top-k, softmax at the temperature,
// top-p and min-p (llama.cpp's order), drawn with std::mt19937_64 seeded by `seed`.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace lowbit::model {

struct SamplerOptions {
  float temperature = 0.8f;   // 0: greedy (argmax, lowest id on ties)
  int32_t top_k = 40;         // 0: off
  float top_p = 0.95f;        // 1: off
  float min_p = 0.05f;        // 0: off; keeps tokens with p >= min_p * p_max
  float repeat_penalty = 1.0f;  // 1: off; divides positive logits (multiplies negative ones) of recent tokens
  int32_t repeat_last_n = 64;   // how many recent tokens the penalty looks at
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplerOptions& options);
  // Picks the next token from logits [vocab] (modified in place by the penalty). `history` is every token so
  // far, prompt included.
  int32_t sample(std::span<float> logits, std::span<const int32_t> history);

 private:
  SamplerOptions options_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;
};

// Index of the largest logit (the first on ties), as run.c's argmax.
int32_t argmax(std::span<const float> logits);

}  // namespace lowbit::model
