#include "lowbit/model/engine.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>

#include "lowbit/core/error.h"
#include "lowbit/core/thread_pool.h"
#include "lowbit/model/tokenizer.h"
#include "engine_backend.h"

namespace lowbit::model {

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kMaxTopLogprobs = 20;  // OpenAI's bound

class CpuEngineBackend final : public EngineBackend {
 public:
  CpuEngineBackend(const Model& model, int slots, int64_t capacity, ThreadPool& pool)
      : model_(model), capacity_(capacity), pool_(pool), caches_(static_cast<size_t>(slots)) {}

  void prefill(int slot, std::span<const int32_t> tokens, int64_t pos, float* logits) override {
    forward(model_, cache(slot), tokens, pos, logits, false, pool_);
  }

  // All rows in one forward_rows(): each linear is one batched matmul over the rows, so a step reads the weights
  // once however many sequences it decodes; attention runs per row over its slot's cache.
  void decode(std::span<const int32_t> tokens, std::span<const int32_t> pos, std::span<const int32_t> slot,
              std::span<float* const> logits, std::span<int32_t> next) override {
    const auto vocab = static_cast<size_t>(model_.config.vocab);
    const size_t m = tokens.size();
    caches_of_rows_.resize(m);
    pos_of_rows_.resize(m);
    for (size_t i = 0; i < m; ++i) {
      caches_of_rows_[i] = &cache(slot[i]);
      pos_of_rows_[i] = pos[i];
    }
    rows_logits_.resize(m * vocab);
    forward_rows(model_, caches_of_rows_, tokens, pos_of_rows_, rows_logits_.data(), pool_);
    for (size_t i = 0; i < m; ++i) {
      const std::span<const float> row(rows_logits_.data() + i * vocab, vocab);
      next[i] = argmax(row);
      if (logits[i]) std::copy(row.begin(), row.end(), logits[i]);
    }
  }

 private:
  // A slot's cache is allocated when the slot is first used and kept for the requests after.
  KvCache& cache(int slot) {
    auto& c = caches_[static_cast<size_t>(slot)];
    if (!c) c = std::make_unique<KvCache>(model_.config, capacity_);
    return *c;
  }

  const Model& model_;
  int64_t capacity_;
  ThreadPool& pool_;
  std::vector<std::unique_ptr<KvCache>> caches_;
  // a decode step's rows: their caches, positions and logits [rows, vocab]
  std::vector<KvCache*> caches_of_rows_;
  std::vector<int64_t> pos_of_rows_;
  std::vector<float> rows_logits_;
};

// Log-softmax of `logits` at `token`, and the `top` most likely tokens with theirs.
TokenLogprob logprobs_of(std::span<const float> logits, int32_t token, int top) {
  const float max = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x - max));
  const float log_z = max + static_cast<float>(std::log(sum));
  TokenLogprob out{token, logits[static_cast<size_t>(token)] - log_z, {}};
  if (top > 0) {
    std::vector<int32_t> ids(logits.size());
    std::iota(ids.begin(), ids.end(), 0);
    const auto k = std::min(ids.size(), static_cast<size_t>(top));
    std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(), [&](int32_t a, int32_t b) {
      return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)] ||
             (logits[static_cast<size_t>(a)] == logits[static_cast<size_t>(b)] && a < b);
    });
    for (size_t i = 0; i < k; ++i) out.top.emplace_back(ids[i], logits[static_cast<size_t>(ids[i])] - log_z);
  }
  return out;
}

// Bytes at the end of `text` that may begin a stop string (the longest suffix that is a proper prefix of one).
size_t possible_stop_start(std::string_view text, const std::vector<std::string>& stops) {
  size_t hold = 0;
  for (const auto& s : stops)
    for (size_t k = std::min(s.size() - 1, text.size()); k > hold; --k)
      if (text.ends_with(std::string_view(s).substr(0, k))) {
        hold = k;
        break;
      }
  return hold;
}

// The end of the whole UTF-8 characters in text[0, end): an incomplete sequence at the end waits for its bytes.
size_t utf8_complete_end(std::string_view text, size_t end) {
  for (size_t back = 1; back <= 3 && back <= end; ++back) {
    const auto c = static_cast<unsigned char>(text[end - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back for its lead
    const size_t need = c >= 0xF0 && c < 0xF8 ? 4 : c >= 0xE0 && c < 0xF0 ? 3 : c >= 0xC0 && c < 0xE0 ? 2 : 1;
    return need > back ? end - back : end;
  }
  return end;
}

}  // namespace

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::cancelled: return "cancelled";
    case FinishReason::error: return "error";
    case FinishReason::none: break;
  }
  return "none";
}

bool GenerationStream::next(GenerationEvent& out, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  if (!ready_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return false;
  out = GenerationEvent{};
  for (auto& e : events_) {
    out.text += e.text;
    out.tokens.insert(out.tokens.end(), std::make_move_iterator(e.tokens.begin()),
                      std::make_move_iterator(e.tokens.end()));
    out.finish = e.finish;
    out.prompt_tokens = e.prompt_tokens;
    out.completion_tokens = e.completion_tokens;
    out.error = std::move(e.error);
  }
  events_.clear();
  return true;
}

void GenerationStream::cancel() { cancelled_ = true; }

void GenerationStream::push(GenerationEvent event) {
  {
    std::lock_guard lock(mutex_);
    events_.push_back(std::move(event));
  }
  ready_.notify_all();
}

struct Engine::Sequence {
  std::shared_ptr<GenerationStream> stream = std::make_shared<GenerationStream>();
  GenerationRequest request;
  Sampler sampler;
  int slot = -1;
  std::vector<int32_t> tokens;  // the prompt, then every sampled token
  int64_t prefilled = 0;        // prompt positions in the slot's cache
  std::vector<float> logits;    // [vocab], of the last position run, unless only its argmax was asked for:
  std::optional<int32_t> greedy_next;  // the last decode step's argmax when its logits were not fetched
  std::string text;             // the completion so far
  size_t emitted = 0;           // bytes of text already sent
  int64_t generated = 0;
  std::vector<TokenLogprob> unsent;
  bool done = false;

  explicit Sequence(GenerationRequest r) : request(std::move(r)), sampler(request.sampler), tokens(request.prompt) {}
  bool prefilling() const { return prefilled < static_cast<int64_t>(request.prompt.size()); }
  // Whether the next token needs the whole distribution: sampling, a repeat penalty, or logprobs to report.
  bool needs_logits() const {
    return request.sampler.temperature != 0.0f || request.sampler.repeat_penalty != 1.0f || request.top_logprobs >= 0;
  }
};

Engine::Engine(const Model& model, const Tokenizer& tokenizer, EngineOptions options, ThreadPool& pool)
    : model_(model), tokenizer_(tokenizer), options_(std::move(options)) {
  if (options_.parallel < 1) fail(Errc::usage, "[engine] parallel {}: expected at least 1", options_.parallel);
  if (options_.prefill_chunk < 1) fail(Errc::usage, "[engine] prefill_chunk {}: expected at least 1", options_.prefill_chunk);
  if (options_.context < 0) fail(Errc::usage, "[engine] context {}: expected at least 0", options_.context);
  if (model.device)
    fail(Errc::usage, "[engine] the model runs through use_device(); give the engine its device instead");
  context_ = options_.context > 0 ? std::min(options_.context, model.config.max_seq) : model.config.max_seq;
  if (!options_.devices.empty() && options_.device != "cuda")
    fail(Errc::usage, "[--devices] runs on --device cuda, not {}", options_.device);
  if (options_.device == "cpu") {
    backend_ = std::make_unique<CpuEngineBackend>(model, options_.parallel, context_, pool);
  } else if (options_.device == "cuda") {
    model.require_stored_arrays("engine cuda");
#if LOWBIT_WITH_CUDA
    backend_ = make_cuda_engine_backend(model, options_.parallel, context_, options_.devices);
#else
    fail(Errc::usage, "[--device] cuda: this lowbit was built without CUDA (configure with -DLOWBIT_CUDA=ON)");
#endif
  } else {
    fail(Errc::usage, "[--device] '{}': expected cpu or cuda", options_.device);
  }
  for (int s = options_.parallel - 1; s >= 0; --s) free_slots_.push_back(s);
}

Engine::~Engine() { stop(); }

void Engine::start() {
  std::lock_guard lock(mutex_);
  if (!thread_.joinable() && !stopping_) thread_ = std::thread([this] { loop(); });
}

void Engine::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard lock(mutex_);
  for (auto& seq : queue_) finish(*seq, FinishReason::cancelled);
  queue_.clear();
}

std::shared_ptr<GenerationStream> Engine::submit(GenerationRequest request) {
  const auto n = static_cast<int64_t>(request.prompt.size());
  if (n == 0) fail(Errc::usage, "[engine] the prompt has no tokens");
  if (n >= context_)
    fail(Errc::limit, "[engine] the prompt has {} tokens; a slot holds {} positions with the completion", n, context_);
  if (request.top_logprobs < -1 || request.top_logprobs > kMaxTopLogprobs)
    fail(Errc::usage, "[engine] top_logprobs {}: expected 0..{}", request.top_logprobs, kMaxTopLogprobs);
  if (request.max_tokens < 1) fail(Errc::usage, "[engine] max_tokens {}: expected at least 1", request.max_tokens);
  for (int32_t id : request.prompt)
    if (id < 0 || id >= model_.config.vocab)
      fail(Errc::usage, "[engine] prompt token {} outside the vocabulary of {}", id, model_.config.vocab);
  for (const auto& s : request.stop)
    if (s.empty()) fail(Errc::usage, "[engine] an empty stop string");
  auto seq = std::make_unique<Sequence>(std::move(request));
  auto stream = seq->stream;
  {
    std::lock_guard lock(mutex_);
    if (stopping_ || queue_.size() >= options_.max_queue + free_slots_.size()) {
      ++rejected_;
      return nullptr;
    }
    queue_.push_back(std::move(seq));
    ++requests_;
  }
  wake_.notify_all();
  return stream;
}

EngineMetrics Engine::metrics() const {
  EngineMetrics m;
  m.requests = requests_;
  m.rejected = rejected_;
  m.prompt_tokens = prompt_tokens_;
  m.generated_tokens = generated_tokens_;
  m.steps = steps_;
  m.active = active_;
  m.decode_tokens_per_second = tokens_per_second_;
  std::lock_guard lock(mutex_);
  m.queued = queue_.size();
  return m;
}

void Engine::loop() {
  std::vector<std::unique_ptr<Sequence>> active;
  while (true) {
    {
      std::unique_lock lock(mutex_);
      // With an active sequence the loop never sleeps, so a cancellation is seen at the next step.
      wake_.wait(lock, [&] { return stopping_ || !active.empty() || !queue_.empty(); });
      if (stopping_) break;
      std::erase_if(queue_, [&](const std::unique_ptr<Sequence>& seq) {
        if (!seq->stream->cancelled()) return false;
        finish(*seq, FinishReason::cancelled);
        return true;
      });
      while (!free_slots_.empty() && !queue_.empty()) {
        active.push_back(std::move(queue_.front()));
        queue_.pop_front();
        active.back()->slot = free_slots_.back();
        free_slots_.pop_back();
      }
      active_ = active.size();
    }
    if (active.empty()) continue;
    step(active);
    std::lock_guard lock(mutex_);
    std::erase_if(active, [&](const std::unique_ptr<Sequence>& seq) {
      if (seq->done) free_slots_.push_back(seq->slot);
      return seq->done;
    });
    active_ = active.size();
  }
  for (auto& seq : active) finish(*seq, FinishReason::cancelled);
}

void Engine::step(std::vector<std::unique_ptr<Sequence>>& active) {
  const auto t0 = Clock::now();
  const auto vocab = static_cast<size_t>(model_.config.vocab);
  int decoded = 0;
  try {
    for (auto& seq : active)
      if (seq->stream->cancelled()) finish(*seq, FinishReason::cancelled);

    // One prefill pass, for the first sequence still in its prompt.
    for (auto& seq : active) {
      if (seq->done || !seq->prefilling()) continue;
      const int64_t n = std::min(options_.prefill_chunk, static_cast<int64_t>(seq->request.prompt.size()) - seq->prefilled);
      seq->logits.resize(vocab);
      backend_->prefill(seq->slot, std::span(seq->tokens).subspan(static_cast<size_t>(seq->prefilled), static_cast<size_t>(n)),
                        seq->prefilled, seq->logits.data());
      seq->prefilled += n;
      prompt_tokens_ += static_cast<uint64_t>(n);
      break;
    }

    // One decode token for every sequence past its prompt.
    std::vector<Sequence*> rows;
    std::vector<int32_t> tokens, pos, slot;
    for (auto& seq : active) {
      if (seq->done || seq->prefilling()) continue;
      ++decoded;
      if (!advance(*seq)) continue;
      rows.push_back(seq.get());
      tokens.push_back(seq->tokens.back());
      pos.push_back(static_cast<int32_t>(seq->tokens.size() - 1));
      slot.push_back(seq->slot);
    }
    if (!rows.empty()) {
      std::vector<float*> logits(rows.size(), nullptr);
      std::vector<int32_t> next(rows.size());
      for (size_t i = 0; i < rows.size(); ++i)
        if (rows[i]->needs_logits()) logits[i] = rows[i]->logits.data();  // [vocab] since the prompt's prefill
      backend_->decode(tokens, pos, slot, logits, next);
      for (size_t i = 0; i < rows.size(); ++i)
        if (!logits[i]) rows[i]->greedy_next = next[i];
    }
  } catch (const std::exception& e) {
    // A failing pass ends every request in it (their caches may hold partial work); the engine goes on.
    for (auto& seq : active)
      if (!seq->done) finish(*seq, FinishReason::error, e.what());
  }
  ++steps_;
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (decoded > 0 && seconds > 0) {
    const double rate = decoded / seconds, old = tokens_per_second_;
    tokens_per_second_ = old == 0 ? rate : 0.9 * old + 0.1 * rate;
  }
  if (options_.after_step) options_.after_step(decoded);
}

bool Engine::advance(Sequence& seq) {
  const GenerationRequest& r = seq.request;
  const std::vector<float> raw = r.top_logprobs >= 0 ? seq.logits : std::vector<float>{};
  // A greedy row's argmax came with the step (the same token sample() picks: temperature 0, no penalty).
  const int32_t next = seq.greedy_next ? *seq.greedy_next : seq.sampler.sample(seq.logits, seq.tokens);
  seq.greedy_next.reset();
  ++generated_tokens_;
  if (std::find(r.stop_tokens.begin(), r.stop_tokens.end(), next) != r.stop_tokens.end()) {
    finish(seq, FinishReason::stop);
    return false;
  }
  seq.unsent.push_back(r.top_logprobs >= 0 ? logprobs_of(raw, next, r.top_logprobs) : TokenLogprob{next, 0, {}});
  seq.text += tokenizer_.token_text_after(seq.tokens.back(), next);
  seq.tokens.push_back(next);
  ++seq.generated;

  size_t stop_at = std::string::npos;
  for (const auto& s : r.stop) stop_at = std::min(stop_at, seq.text.find(s, seq.emitted));
  if (stop_at != std::string::npos) {
    seq.text.resize(stop_at);
    finish(seq, FinishReason::stop);
    return false;
  }
  if (seq.generated >= r.max_tokens || static_cast<int64_t>(seq.tokens.size()) >= context_) {
    finish(seq, FinishReason::length);
    return false;
  }
  const size_t safe = utf8_complete_end(seq.text, seq.text.size() - possible_stop_start(seq.text, r.stop));
  if (safe > seq.emitted) {
    GenerationEvent event;
    event.text = seq.text.substr(seq.emitted, safe - seq.emitted);
    event.tokens = std::move(seq.unsent);
    seq.unsent.clear();
    seq.emitted = safe;
    seq.stream->push(std::move(event));
  }
  return true;
}

void Engine::finish(Sequence& seq, FinishReason reason, const std::string& error) {
  if (seq.done) return;
  seq.done = true;
  GenerationEvent event;
  if (seq.text.size() > seq.emitted) event.text = seq.text.substr(seq.emitted);
  seq.emitted = seq.text.size();
  event.tokens = std::move(seq.unsent);
  event.finish = reason;
  event.prompt_tokens = static_cast<int64_t>(seq.request.prompt.size());
  event.completion_tokens = seq.generated;
  event.error = error;
  seq.stream->push(std::move(event));
}

}  // namespace lowbit::model
