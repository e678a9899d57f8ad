#include "lowbit/model/generate.h"

#include <algorithm>
#include <chrono>

#include "lowbit/core/error.h"

namespace lowbit::model {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Length of the UTF-8 sequence a lead byte announces (1 for ASCII and for bytes that cannot lead).
size_t utf8_length(unsigned char lead) {
  if (lead >= 0xF0 && lead < 0xF8) return 4;
  if (lead >= 0xE0) return lead < 0xF0 ? 3 : 1;
  if (lead >= 0xC0) return 2;
  return 1;
}

std::vector<int32_t> stop_tokens(const Model& model, const Tokenizer& tokenizer) {
  std::vector<int32_t> stops = tokenizer.eos_ids();
  stops.insert(stops.end(), model.config.eos_ids.begin(), model.config.eos_ids.end());
  return stops;
}

}  // namespace

void Utf8Stream::write(std::string_view bytes) {
  pending_ += bytes;
  size_t done = 0;
  while (done < pending_.size()) {
    const size_t n = utf8_length(static_cast<unsigned char>(pending_[done]));
    if (done + n > pending_.size()) break;
    bool whole = true;
    for (size_t i = 1; i < n; ++i)
      if ((static_cast<unsigned char>(pending_[done + i]) & 0xC0) != 0x80) whole = false;
    done += whole ? n : 1;
  }
  if (done > 0) emit_(std::string_view(pending_).substr(0, done));
  pending_.erase(0, done);
}

void Utf8Stream::flush() {
  if (!pending_.empty()) emit_(pending_);
  pending_.clear();
}

GenerateStats generate(const Model& model, const Tokenizer& tokenizer, const GenerateOptions& options,
                       ThreadPool& pool, const std::function<void(std::string_view)>& emit) {
  GenerateStats stats;
  std::vector<int32_t> tokens = tokenizer.encode(options.prompt, true);
  if (tokens.empty()) fail(Errc::usage, "[generate] the prompt is empty and the tokenizer has no BOS token");
  const int64_t n_prompt = static_cast<int64_t>(tokens.size());
  const int64_t ctx = std::min(model.config.max_seq, n_prompt + std::max<int64_t>(options.steps, 0));
  if (n_prompt > ctx) fail(Errc::limit, "[generate] the prompt has {} tokens; the context holds {}", n_prompt, ctx);
  stats.prompt_tokens = n_prompt;

  KvCache cache(model.config, ctx);
  Sampler sampler(options.sampler);
  const std::vector<int32_t> stops = stop_tokens(model, tokenizer);
  Utf8Stream out(emit);
  if (options.echo_prompt) {  // the prompt's text without its BOS; a tokenizer without BOS echoes every token
    const int64_t first = tokenizer.bos_id() == tokens[0] ? 1 : 0;
    for (int64_t i = first; i < n_prompt; ++i) out.write(tokenizer.token_text_after(i ? tokens[i - 1] : -1, tokens[i]));
  }

  std::vector<float> logits(static_cast<size_t>(model.config.vocab));
  const auto t0 = Clock::now();
  forward(model, cache, tokens, 0, logits.data(), false, pool);
  stats.prefill_seconds = seconds_since(t0);

  const auto t1 = Clock::now();
  for (int64_t pos = n_prompt;; ++pos) {
    const int32_t next = sampler.sample(logits, tokens);
    if (std::find(stops.begin(), stops.end(), next) != stops.end()) {
      stats.stopped_at_eos = true;
      break;
    }
    out.write(tokenizer.token_text_after(tokens.back(), next));
    tokens.push_back(next);
    ++stats.generated_tokens;
    if (pos >= ctx) break;
    forward(model, cache, std::span(&tokens.back(), 1), pos, logits.data(), false, pool);
  }
  stats.decode_seconds = seconds_since(t1);
  out.flush();
  emit("\n");
  return stats;
}

}  // namespace lowbit::model
