// Text generation: prefill the prompt in one batch, then decode one token at a time, streaming text.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "lowbit/model/model.h"
#include "lowbit/model/sampler.h"

namespace lowbit::model {

struct GenerateOptions {
  std::string prompt;
  // Forward passes after the prompt, as run.c's steps count positions: the prompt predicts one token and each
  // step one more, so up to steps + 1 new tokens (stories260K's reference output is steps = 255 from [BOS]).
  int64_t steps = 255;
  SamplerOptions sampler;
  bool echo_prompt = true;  // stream the prompt's text before the continuation, as run.c does
};

struct GenerateStats {
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;  // from the first sampled token to the last
  bool stopped_at_eos = false;
};

// Streams text through `emit` in whole UTF-8 characters, stops at an end-of-sequence token (the tokenizer's
// and the config's), after `steps` decode steps, or at the model's context length. Writes a final "\n" as run.c does.
GenerateStats generate(const Model& model, const Tokenizer& tokenizer, const GenerateOptions& options,
                       ThreadPool& pool, const std::function<void(std::string_view)>& emit);

// Buffers bytes so that only complete UTF-8 sequences are emitted; invalid bytes pass through alone.
class Utf8Stream {
 public:
  explicit Utf8Stream(const std::function<void(std::string_view)>& emit) : emit_(emit) {}
  void write(std::string_view bytes);
  void flush();

 private:
  const std::function<void(std::string_view)>& emit_;
  std::string pending_;
};

}  // namespace lowbit::model
