// Perplexity and KL divergence by llama.cpp's method (tools/perplexity/perplexity.cpp): the token stream is cut
// into non-overlapping windows of ctx tokens (a partial tail is dropped), each window's first token is replaced
// by BOS when the tokenizer adds one, the window runs through the model from an empty KV cache, and only the
// second half is scored: the logits at positions ctx/2 .. ctx-2 predict the tokens after them, so
// ctx - 1 - ctx/2 tokens per window. Unlike llama.cpp, one window (not two) is enough input.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "lowbit/model/model.h"

namespace lowbit::eval {

struct WindowOptions {
  int64_t ctx = 512;
  std::optional<int32_t> bos;   // replaces each window's first token when set
  int64_t batch = 256;          // positions per forward call (bounds the logits buffer to batch x vocab)
  std::function<void()> on_window;  // progress hook, called after each window
};

// Number of windows `tokens` yields (Errc::usage when fewer than ctx tokens or ctx < 4).
int64_t count_windows(size_t tokens, int64_t ctx);

struct PerplexityResult {
  double ppl = 0;
  double ppl_stderr = 0;  // ppl * standard error of the mean NLL, as llama.cpp's "+/-"
  double nll_mean = 0;
  int64_t tokens = 0;     // scored tokens
  int64_t windows = 0;
};

PerplexityResult perplexity(const model::Model& model, std::span<const int32_t> tokens, const WindowOptions& options,
                            ThreadPool& pool);

struct KldResult {
  double kld_mean = 0, kld_stderr = 0, kld_median = 0, kld_p99 = 0, kld_max = 0;
  double top1_agreement = 0;   // share of scored tokens where both models' argmax agree
  double delta_p_mean = 0;     // mean of p_other(correct) - p_base(correct)
  double delta_p_stderr = 0;
  PerplexityResult base, other;
  int64_t tokens = 0;
};

// KL(base || other) per scored token, both models run over the same windows.
KldResult kl_divergence(const model::Model& base, const model::Model& other, std::span<const int32_t> tokens,
                        const WindowOptions& options, ThreadPool& pool);

}  // namespace lowbit::eval
