// lowbit generate: stream a continuation of a prompt to stdout; speeds on stderr.
#include <cstdio>
#include <optional>
#include <random>
#include <string>

#include "command.h"
#include "lowbit/core/thread_pool.h"
#include "lowbit/model/cuda_model.h"
#include "lowbit/model/generate.h"

namespace {

struct Args {
  std::string model;
  std::optional<std::string> tokenizer;
  lowbit::model::GenerateOptions gen;
  std::optional<uint64_t> seed;
  size_t threads = 0;
  std::string device = "cpu";
  std::string devices;
};

void run(const Args& a) {
  using namespace lowbit;
  set_default_threads(a.threads);
  const std::vector<int> devices = lowbit::cli::devices_of(a.devices);
  const auto model = model::load_model(a.model, {.cpu_only = a.device == "cpu"});
  model::use_device(*model, a.device, devices);
  const auto tokenizer = model::load_tokenizer_for(*model, a.model, a.tokenizer);
  model::GenerateOptions gen = a.gen;
  gen.sampler.seed = a.seed ? *a.seed : std::random_device{}();
  const auto stats = model::generate(*model, *tokenizer, gen, default_pool(), [](std::string_view text) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  });
  std::fprintf(stderr, "prefill: %lld tokens, %.1f tokens/s; decode: %lld tokens, %.1f tokens/s\n",
               static_cast<long long>(stats.prompt_tokens), stats.prompt_tokens / std::max(stats.prefill_seconds, 1e-9),
               static_cast<long long>(stats.generated_tokens),
               stats.generated_tokens / std::max(stats.decode_seconds, 1e-9));
}

void setup(CLI::App& root) {
  auto args = std::make_shared<Args>();
  auto* cmd = root.add_subcommand("generate", "Generate text from a prompt (streams to stdout)");
  cmd->add_option("model", args->model, "Model: llama2.c .bin, HF directory, lowbit artifact")->required();
  cmd->add_option("-p,--prompt", args->gen.prompt, "Prompt text");
  cmd->add_option("-n,--steps", args->gen.steps,
                  "Decode steps after the prompt (run.c's steps minus the prompt); up to N+1 new tokens")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  auto& s = args->gen.sampler;
  cmd->add_option("--temp", s.temperature, "Temperature; 0 = greedy")->capture_default_str();
  cmd->add_option("--top-k", s.top_k, "Top-k; 0 = off")->capture_default_str();
  cmd->add_option("--top-p", s.top_p, "Top-p; 1 = off")->capture_default_str();
  cmd->add_option("--min-p", s.min_p, "Min-p; 0 = off")->capture_default_str();
  cmd->add_option("--repeat-penalty", s.repeat_penalty, "Repeat penalty; 1 = off")->capture_default_str();
  cmd->add_option("--repeat-last-n", s.repeat_last_n, "Tokens the repeat penalty looks back")->capture_default_str();
  cmd->add_option("--seed", args->seed, "Sampling seed (default: random)");
  cmd->add_option("--tokenizer", args->tokenizer, "Tokenizer file when not beside the model");
  cmd->add_option("--threads", args->threads, "Threads (default: all cores)");
  cmd->add_option("--device", args->device, "cpu or cuda")->capture_default_str();
  lowbit::cli::add_devices_option(cmd, args->devices);
  cmd->callback([args] { run(*args); });
}

}  // namespace

LOWBIT_COMMAND(generate, setup);
