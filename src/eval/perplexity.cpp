#include "lowbit/eval/perplexity.h"

#include <algorithm>
#include <cmath>

#include "lowbit/core/error.h"

namespace lowbit::eval {

namespace {

// Running mean and standard error of the mean (llama.cpp: sqrt((E[x^2] - E[x]^2) / (n - 1))).
struct Moments {
  double sum = 0, sum2 = 0;
  int64_t n = 0;
  void add(double x) {
    sum += x;
    sum2 += x * x;
    ++n;
  }
  double mean() const { return n ? sum / static_cast<double>(n) : 0.0; }
  double stderr_of_mean() const {
    if (n < 2) return 0.0;
    const double var = sum2 / static_cast<double>(n) - mean() * mean();
    return var > 0 ? std::sqrt(var / static_cast<double>(n - 1)) : 0.0;
  }
};

// log-softmax of logits [vocab] into out (double, for the sums over a large vocabulary).
void log_softmax(std::span<const float> logits, std::vector<double>& out) {
  const float max = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - max);
  const double log_sum = std::log(sum) + max;
  out.resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = logits[i] - log_sum;
}

// Runs the window [ctx] (BOS already in place) through `model` from an empty cache, calling
// score(j, logits) for each scored position j (its logits predict window[j + 1]).
template <class Score>
void run_window(const model::Model& model, std::span<const int32_t> window, const WindowOptions& o,
                ThreadPool& pool, Score score) {
  const int64_t ctx = static_cast<int64_t>(window.size()), first = ctx / 2, vocab = model.config.vocab;
  if (ctx > model.config.max_seq)
    fail(Errc::usage, "[eval] --ctx {} exceeds the model's context of {}", ctx, model.config.max_seq);
  const int64_t batch = std::clamp<int64_t>(o.batch, 1, ctx);
  std::vector<float> logits(static_cast<size_t>(batch * vocab));
  model::KvCache cache(model.config, ctx);
  for (int64_t b = 0; b < ctx; b += batch) {
    const int64_t m = std::min(batch, ctx - b);
    model::forward(model, cache, window.subspan(b, m), b, logits.data(), true, pool);
    for (int64_t j = std::max(b, first); j < std::min(b + m, ctx - 1); ++j)
      score(j, std::span<const float>(logits.data() + (j - b) * vocab, vocab));
  }
}

// Calls per_window(window) for every window of `tokens`, BOS in place, then the progress hook.
template <class PerWindow>
int64_t for_each_window(std::span<const int32_t> tokens, const WindowOptions& o, PerWindow per_window) {
  const int64_t windows = count_windows(tokens.size(), o.ctx);
  for (int64_t w = 0; w < windows; ++w) {
    std::vector<int32_t> window(tokens.begin() + w * o.ctx, tokens.begin() + (w + 1) * o.ctx);
    if (o.bos) window[0] = *o.bos;
    per_window(std::span<const int32_t>(window));
    if (o.on_window) o.on_window();
  }
  return windows;
}

PerplexityResult finish(const Moments& nll, int64_t windows) {
  PerplexityResult r;
  r.nll_mean = nll.mean();
  r.ppl = std::exp(r.nll_mean);
  r.ppl_stderr = r.ppl * nll.stderr_of_mean();
  r.tokens = nll.n;
  r.windows = windows;
  return r;
}

double percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0.0;
  const auto i = static_cast<size_t>(std::round(q * static_cast<double>(sorted.size() - 1)));
  return sorted[std::min(i, sorted.size() - 1)];
}

}  // namespace

int64_t count_windows(size_t tokens, int64_t ctx) {
  if (ctx < 4) fail(Errc::usage, "[eval] --ctx {} is too small (at least 4)", ctx);
  const auto windows = static_cast<int64_t>(tokens / static_cast<size_t>(ctx));
  if (windows < 1) fail(Errc::usage, "[eval] the text has {} tokens, fewer than one window of {}", tokens, ctx);
  return windows;
}

PerplexityResult perplexity(const model::Model& model, std::span<const int32_t> tokens, const WindowOptions& options,
                            ThreadPool& pool) {
  Moments nll;
  std::vector<double> logp;
  const int64_t windows = for_each_window(tokens, options, [&](std::span<const int32_t> window) {
    run_window(model, window, options, pool, [&](int64_t j, std::span<const float> logits) {
      log_softmax(logits, logp);
      nll.add(-logp[window[j + 1]]);
    });
  });
  return finish(nll, windows);
}

KldResult kl_divergence(const model::Model& base, const model::Model& other, std::span<const int32_t> tokens,
                        const WindowOptions& options, ThreadPool& pool) {
  if (base.config.vocab != other.config.vocab)
    fail(Errc::usage, "[eval kld] vocabularies differ: {} vs {}", base.config.vocab, other.config.vocab);
  const int64_t vocab = base.config.vocab;
  std::vector<double> base_logp;  // [scored positions of the window, vocab]
  std::vector<double> logp;
  Moments base_nll, other_nll, kld, delta_p;
  std::vector<double> klds;
  int64_t agree = 0;
  const int64_t windows = for_each_window(tokens, options, [&](std::span<const int32_t> window) {
    base_logp.clear();
    run_window(base, window, options, pool, [&](int64_t j, std::span<const float> logits) {
      log_softmax(logits, logp);
      base_nll.add(-logp[window[j + 1]]);
      base_logp.insert(base_logp.end(), logp.begin(), logp.end());
    });
    size_t row = 0;
    run_window(other, window, options, pool, [&](int64_t j, std::span<const float> logits) {
      log_softmax(logits, logp);
      const double* p = base_logp.data() + row++ * vocab;
      double kl = 0;
      int64_t base_top = 0, other_top = 0;
      for (int64_t v = 0; v < vocab; ++v) {
        kl += std::exp(p[v]) * (p[v] - logp[v]);
        if (p[v] > p[base_top]) base_top = v;
        if (logp[v] > logp[other_top]) other_top = v;
      }
      const int32_t target = window[j + 1];
      other_nll.add(-logp[target]);
      kld.add(kl);
      klds.push_back(kl);
      delta_p.add(std::exp(logp[target]) - std::exp(p[target]));
      agree += base_top == other_top;
    });
  });
  std::sort(klds.begin(), klds.end());
  KldResult r;
  r.tokens = kld.n;
  r.kld_mean = kld.mean();
  r.kld_stderr = kld.stderr_of_mean();
  r.kld_median = percentile(klds, 0.5);
  r.kld_p99 = percentile(klds, 0.99);
  r.kld_max = klds.empty() ? 0.0 : klds.back();
  r.top1_agreement = kld.n ? static_cast<double>(agree) / static_cast<double>(kld.n) : 0.0;
  r.delta_p_mean = delta_p.mean();
  r.delta_p_stderr = delta_p.stderr_of_mean();
  r.base = finish(base_nll, windows);
  r.other = finish(other_nll, windows);
  return r;
}

}  // namespace lowbit::eval
