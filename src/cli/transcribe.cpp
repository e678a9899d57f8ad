// lowbit transcribe: speech to text with a Qwen3-ASR model; the text on stdout, timings on stderr.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>

#include "command.h"
#include "lowbit/core/thread_pool.h"
#include "lowbit/io/audio.h"
#include "lowbit/model/speech.h"

namespace {

struct Args {
  std::string model, audio;
  std::optional<std::string> language;
  bool json = false;
  int64_t max_tokens = 1024;
  lowbit::model::SamplerOptions sampler{.temperature = 0.0f};
  std::optional<uint64_t> seed;
  size_t threads = 0;
  std::string device = "cpu";
};

void run(const Args& a) {
  using namespace lowbit;
  set_default_threads(a.threads);
  const auto model = model::load_speech_model(a.model, a.device);
  const auto tokenizer = model::load_tokenizer_for(*model->decoder, a.model, std::nullopt);
  const std::vector<float> samples = io::read_audio(a.audio, static_cast<int>(model->mel.sample_rate));
  model::SamplerOptions sampler = a.sampler;
  sampler.seed = a.seed ? *a.seed : std::random_device{}();
  const model::Transcript t =
      model::transcribe(*model, *tokenizer, samples,
                        {.language = a.language, .max_tokens = a.max_tokens, .sampler = sampler}, default_pool());
  if (a.json) {
    const nlohmann::json out = {{"text", t.text}, {"token_ids", t.token_ids}};
    std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::printf("%s\n", t.text.c_str());
  }
  std::fprintf(stderr,
               "audio: %.2f s; features %.3f s; encoder: %lld tokens, %.3f s; prefill: %lld tokens, %.3f s; "
               "decode: %zu tokens, %.1f tokens/s\n",
               static_cast<double>(samples.size()) / static_cast<double>(model->mel.sample_rate), t.features_seconds,
               static_cast<long long>(t.audio_tokens), t.encoder_seconds, static_cast<long long>(t.prompt_tokens),
               t.prefill_seconds, t.token_ids.size(),
               static_cast<double>(t.token_ids.size()) / std::max(t.decode_seconds, 1e-9));
}

void setup(CLI::App& root) {
  auto args = std::make_shared<Args>();
  auto* cmd = root.add_subcommand("transcribe", "Transcribe speech (WAV or FLAC) with a Qwen3-ASR model");
  cmd->add_option("model", args->model, "Qwen3-ASR model: a transformers qwen3_asr directory")->required();
  cmd->add_option("audio", args->audio, "Audio file: WAV (PCM 16/24/32-bit, float) or FLAC")->required();
  cmd->add_option("--language", args->language, "Language the speech is in (e.g. English); default: detected");
  cmd->add_flag("--json", args->json, "Print {\"text\", \"token_ids\"} (no prompt, no final end-of-sequence token)");
  cmd->add_option("--max-tokens", args->max_tokens, "Most tokens generated")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  auto& s = args->sampler;
  cmd->add_option("--temp", s.temperature, "Temperature; 0 = greedy")->capture_default_str();
  cmd->add_option("--top-k", s.top_k, "Top-k when sampling; 0 = off")->capture_default_str();
  cmd->add_option("--top-p", s.top_p, "Top-p when sampling; 1 = off")->capture_default_str();
  cmd->add_option("--seed", args->seed, "Sampling seed (default: random)");
  cmd->add_option("--threads", args->threads, "Threads (default: all cores)");
  cmd->add_option("--device", args->device, "Where the encoder and decoder run")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  cmd->callback([args] { run(*args); });
}

}  // namespace

LOWBIT_COMMAND(transcribe, setup);
