// lowbit chat: talk to an instruction-tuned model through its chat template. With -p, one reply to that message;
// otherwise a REPL reading one message per line from stdin. Replies stream to stdout; prompts and speeds go to
// stderr.
#include <cstdio>
#include <iostream>
#include <optional>
#include <random>
#include <string>
#include <unistd.h>

#include "command.h"
#include "lowbit/core/error.h"
#include "lowbit/core/thread_pool.h"
#include "lowbit/model/chat.h"
#include "lowbit/model/cuda_model.h"

namespace {

struct Args {
  std::string model;
  std::optional<std::string> tokenizer, system, message, template_name, template_file;
  int64_t max_tokens = 256;
  int64_t context = 4096;
  lowbit::model::SamplerOptions sampler;
  std::optional<uint64_t> seed;
  size_t threads = 0;
  bool quiet = false;
  std::string device = "cpu";
  std::string devices;
};

void write_stdout(std::string_view text) {
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
}

void report(const lowbit::model::GenerateStats& s) {
  std::fprintf(stderr, "[chat] prefill %lld tokens, %.1f tokens/s; decode %lld tokens, %.1f tokens/s\n",
               static_cast<long long>(s.prompt_tokens), s.prompt_tokens / std::max(s.prefill_seconds, 1e-9),
               static_cast<long long>(s.generated_tokens), s.generated_tokens / std::max(s.decode_seconds, 1e-9));
}

void run(const Args& a) {
  using namespace lowbit;
  set_default_threads(a.threads);
  const std::vector<int> devices = lowbit::cli::devices_of(a.devices);
  const auto model = model::load_model(a.model, {.max_seq = a.context, .cpu_only = a.device == "cpu"});
  model::use_device(*model, a.device, devices);
  const auto tokenizer = model::load_tokenizer_for(*model, a.model, a.tokenizer);
  model::ChatTemplate tmpl;
  if (a.template_file) {
    tmpl = model::chat_template_from_file(*a.template_file, a.model, *tokenizer);
  } else if (a.template_name) {
    const auto format = model::parse_chat_format(*a.template_name);
    if (!format) fail(Errc::usage, "[chat] --template {}: expected chatml, llama3, gemma or phi3", *a.template_name);
    tmpl = model::builtin_chat_template(*format, a.model, *tokenizer);
  } else {
    tmpl = model::chat_template_for(*model, a.model, *tokenizer);
  }
  model::SamplerOptions sampler = a.sampler;
  sampler.seed = a.seed ? *a.seed : std::random_device{}();
  model::ChatSession session(*model, *tokenizer, tmpl, a.context, sampler, a.system);
  if (a.message) {
    const auto stats = session.reply(*a.message, a.max_tokens, default_pool(), write_stdout);
    write_stdout("\n");
    if (!a.quiet) report(stats);
    return;
  }
  const bool interactive = isatty(STDIN_FILENO);
  std::string line;
  while (true) {
    if (interactive) std::fputs("> ", stderr);
    if (!std::getline(std::cin, line)) break;
    if (line.empty()) continue;
    const auto stats = session.reply(line, a.max_tokens, default_pool(), write_stdout);
    write_stdout("\n");
    if (!a.quiet) report(stats);
  }
}

void setup(CLI::App& root) {
  auto args = std::make_shared<Args>();
  auto* cmd = root.add_subcommand("chat", "Chat with an instruction-tuned model through its own chat template");
  cmd->add_option("model", args->model, "Model: GGUF file, HF directory, lowbit artifact")->required();
  cmd->add_option("-p,--message", args->message, "One user message; without it, read messages from stdin");
  cmd->add_option("--system", args->system, "System prompt (default: the template's own, if any)");
  auto* builtin = cmd->add_option("--template", args->template_name,
                                  "Built-in chatml, llama3, gemma or phi3 template instead of the model's own");
  cmd->add_option("--chat-template", args->template_file, "Jinja chat template file instead of the model's own")
      ->excludes(builtin);
  cmd->add_option("-n,--max-tokens", args->max_tokens, "Most tokens per reply")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--ctx", args->context, "Context length of the conversation")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  auto& s = args->sampler;
  cmd->add_option("--temp", s.temperature, "Temperature; 0 = greedy")->capture_default_str();
  cmd->add_option("--top-k", s.top_k, "Top-k; 0 = off")->capture_default_str();
  cmd->add_option("--top-p", s.top_p, "Top-p; 1 = off")->capture_default_str();
  cmd->add_option("--min-p", s.min_p, "Min-p; 0 = off")->capture_default_str();
  cmd->add_option("--repeat-penalty", s.repeat_penalty, "Repeat penalty; 1 = off")->capture_default_str();
  cmd->add_option("--seed", args->seed, "Sampling seed (default: random)");
  cmd->add_option("--tokenizer", args->tokenizer, "Tokenizer file when not beside the model");
  cmd->add_option("--threads", args->threads, "Threads (default: all cores)");
  cmd->add_option("--device", args->device, "cpu or cuda")->capture_default_str();
  lowbit::cli::add_devices_option(cmd, args->devices);
  cmd->add_flag("-q,--quiet", args->quiet, "No speed lines on stderr");
  cmd->callback([args] { run(*args); });
}

}  // namespace

LOWBIT_COMMAND(chat, setup);
