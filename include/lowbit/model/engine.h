// The serving engine (lowbit serve): continuous batching of generation requests over one model. Each request
// gets its own KV slot, sampler and stop state; a new request joins between decode steps. One engine thread runs
// steps: a step runs at most one prefill pass (up to EngineOptions::prefill_chunk prompt positions of one
// request, so a long prompt never stalls the others for more than one pass), then one decode token for every
// request past its prompt. Requests beyond the free slots wait in a bounded queue. Results come back through a
// GenerationStream per request, which any thread may read and cancel.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "lowbit/model/model.h"
#include "lowbit/model/sampler.h"

namespace lowbit {
class ThreadPool;
}

namespace lowbit::model {

struct EngineOptions {
  std::string device = "cpu";   // "cpu", or "cuda" (a build with LOWBIT_CUDA): one CudaModel slot per sequence
  std::vector<int> devices;     // cuda: the GPUs of tensor_parallel (cuda_model.h, --devices); empty: the current one
  int parallel = 4;             // sequences decoded together, each in its own KV slot (cuda: 1..16)
  int64_t context = 0;          // positions per slot (prompt and completion); 0: the model's max_seq
  size_t max_queue = 64;        // requests waiting for a slot; submit() refuses more
  int64_t prefill_chunk = 512;  // prompt positions per prefill pass
  // Called on the engine thread after every step with the number of sequences it decoded (tests use it to act
  // at a known point of a generation).
  std::function<void(int decoded)> after_step;
};

struct GenerationRequest {
  std::vector<int32_t> prompt;      // tokens, BOS included where the model wants one
  int64_t max_tokens = 16;          // completion tokens at most (also ends at the slot's context)
  SamplerOptions sampler;
  std::vector<std::string> stop;    // stop strings: the text ends before the first occurrence of any
  std::vector<int32_t> stop_tokens; // end-of-sequence tokens: generation ends there, without them
  int top_logprobs = -1;            // -1: no logprobs; 0..20: the chosen token's and this many alternatives'
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;                              // log-softmax of the model's logits (before sampling)
  std::vector<std::pair<int32_t, float>> top;     // the top_logprobs most likely tokens, most likely first
};

enum class FinishReason { none, stop, length, cancelled, error };
const char* finish_reason_name(FinishReason reason);  // OpenAI's names: "stop", "length"; else "cancelled", "error"

struct GenerationEvent {
  std::string text;                 // new text; stop strings held back until they can be ruled out
  std::vector<TokenLogprob> tokens; // the tokens sampled since the last event (logprobs only when asked)
  FinishReason finish = FinishReason::none;  // set on the last event of a stream
  int64_t prompt_tokens = 0, completion_tokens = 0;  // on the last event
  std::string error;                // FinishReason::error: what failed
};

// The results of one request. The engine appends events; a reader takes them in order.
class GenerationStream {
 public:
  // Takes every event ready, merged into `out` (text concatenated, tokens appended, the finish of the last), or
  // waits up to `timeout` for one; false when none came. Nothing follows an event with a finish reason.
  bool next(GenerationEvent& out, std::chrono::milliseconds timeout);
  // Ends the request: a queued one never starts, an active one frees its slot before the next step.
  void cancel();
  bool cancelled() const { return cancelled_.load(); }

 private:
  friend class Engine;
  void push(GenerationEvent event);
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<GenerationEvent> events_;
  std::atomic<bool> cancelled_{false};
  std::function<void()> wake_engine_;
};

struct EngineMetrics {
  uint64_t requests = 0;           // accepted by submit()
  uint64_t rejected = 0;           // refused because the queue was full
  uint64_t prompt_tokens = 0;      // prefilled
  uint64_t generated_tokens = 0;   // sampled
  uint64_t steps = 0;
  size_t queued = 0;               // waiting for a slot now
  size_t active = 0;               // holding a slot now (the batch size)
  double decode_tokens_per_second = 0;  // tokens sampled per second of step time, smoothed over recent steps
};

class EngineBackend;

class Engine {
 public:
  // Requests come as tokens; the tokenizer turns sampled tokens into text. `pool` runs the CPU forward passes.
  // The engine thread starts with start() (requests submitted before then wait in the queue).
  Engine(const Model& model, const Tokenizer& tokenizer, EngineOptions options, ThreadPool& pool);
  ~Engine();  // stop()
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  void start();
  // Ends every request (FinishReason::cancelled) and joins the engine thread.
  void stop();

  // Queues a request. nullptr when the queue already holds max_queue requests. Errc::usage for an empty prompt
  // or a bad top_logprobs, Errc::limit when the prompt leaves no room in a slot (prompt.size() >= context()).
  std::shared_ptr<GenerationStream> submit(GenerationRequest request);

  int64_t context() const { return context_; }
  const EngineOptions& options() const { return options_; }
  EngineMetrics metrics() const;

 private:
  struct Sequence;
  void loop();
  void step(std::vector<std::unique_ptr<Sequence>>& active);
  // Samples the next token of `seq` from its logits; false when the sequence ended.
  bool advance(Sequence& seq);
  void finish(Sequence& seq, FinishReason reason, const std::string& error = {});

  const Model& model_;
  const Tokenizer& tokenizer_;
  EngineOptions options_;
  int64_t context_ = 0;
  std::unique_ptr<EngineBackend> backend_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::unique_ptr<Sequence>> queue_;
  std::vector<int> free_slots_;
  bool stopping_ = false;
  std::thread thread_;

  std::atomic<uint64_t> requests_{0}, rejected_{0}, prompt_tokens_{0}, generated_tokens_{0}, steps_{0};
  std::atomic<size_t> active_{0};
  std::atomic<double> tokens_per_second_{0};
};

}  // namespace lowbit::model
