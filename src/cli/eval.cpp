// lowbit eval ppl | kld: perplexity and KL divergence on a text file, by llama.cpp's method
// (include/lowbit/eval/perplexity.h). Results on stdout (--json: one object), progress on stderr.
#include <cstdio>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "command.h"
#include "lowbit/core/error.h"
#include "lowbit/core/mapped_file.h"
#include "lowbit/core/progress.h"
#include "lowbit/core/thread_pool.h"
#include "lowbit/eval/perplexity.h"
#include "lowbit/model/cuda_model.h"

namespace {

using namespace lowbit;

struct Common {
  std::string text;
  std::optional<std::string> tokenizer;
  int64_t ctx = 512;
  bool json = false;
  size_t threads = 0;
  std::string device = "cpu";
  std::string devices;
};

struct Prepared {
  std::vector<int32_t> tokens;
  eval::WindowOptions window;
};

// Tokenizes the text once with BOS, as llama.cpp does; BOS opens each window when the tokenizer adds one.
Prepared prepare(const std::string& model_path, const Common& c) {
  const auto tokenizer = model::load_tokenizer(model_path, c.tokenizer);
  const MappedFile file = MappedFile::open(c.text);
  const std::string_view text(reinterpret_cast<const char*>(file.bytes().data()), file.size());
  Prepared p;
  p.tokens = tokenizer->encode(text, true);
  const std::vector<int32_t> probe = tokenizer->encode("", true);
  if (!probe.empty() && probe.front() == tokenizer->bos_id()) p.window.bos = probe.front();
  p.window.ctx = c.ctx;
  return p;
}

void add_common(CLI::App* cmd, Common& c) {
  cmd->add_option("--text", c.text, "Text file to score")->required();
  cmd->add_option("--ctx", c.ctx, "Window length in tokens")->capture_default_str();
  cmd->add_option("--tokenizer", c.tokenizer, "Tokenizer file when not beside the (base) model");
  cmd->add_option("--threads", c.threads, "Threads (default: all cores)");
  cmd->add_option("--device", c.device, "cpu or cuda")->capture_default_str();
  lowbit::cli::add_devices_option(cmd, c.devices);
  cmd->add_flag("--json", c.json, "Print one JSON object");
}

void run_ppl(const std::string& model_path, const Common& c) {
  set_default_threads(c.threads);
  const std::vector<int> devices = lowbit::cli::devices_of(c.devices);
  const auto model = model::load_model(model_path, {.cpu_only = c.device == "cpu"});
  model::use_device(*model, c.device, devices);
  Prepared p = prepare(model_path, c);
  Progress progress("eval ppl", static_cast<uint64_t>(eval::count_windows(p.tokens.size(), c.ctx)), "window");
  p.window.on_window = [&] { progress.advance(); };
  const auto r = eval::perplexity(*model, p.tokens, p.window, default_pool());
  progress.finish();
  if (c.json) {
    const nlohmann::json j = {{"ppl", r.ppl}, {"ppl_stderr", r.ppl_stderr}, {"nll_mean", r.nll_mean},
                              {"tokens", r.tokens}, {"windows", r.windows}, {"ctx", c.ctx}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("PPL = %.4f +/- %.5f (%lld tokens scored in %lld windows of %lld)\n", r.ppl, r.ppl_stderr,
                static_cast<long long>(r.tokens), static_cast<long long>(r.windows), static_cast<long long>(c.ctx));
  }
}

void run_kld(const std::string& base_path, const std::string& other_path, const Common& c) {
  set_default_threads(c.threads);
  const std::vector<int> devices = lowbit::cli::devices_of(c.devices);
  const auto base = model::load_model(base_path, {.cpu_only = c.device == "cpu"});
  const auto other = model::load_model(other_path, {.cpu_only = c.device == "cpu"});
  model::use_device(*base, c.device, devices);
  model::use_device(*other, c.device, devices);
  Prepared p = prepare(base_path, c);
  Progress progress("eval kld", static_cast<uint64_t>(eval::count_windows(p.tokens.size(), c.ctx)), "window");
  p.window.on_window = [&] { progress.advance(); };
  const auto r = eval::kl_divergence(*base, *other, p.tokens, p.window, default_pool());
  progress.finish();
  if (c.json) {
    const nlohmann::json j = {{"kld_mean", r.kld_mean},       {"kld_stderr", r.kld_stderr},
                              {"kld_median", r.kld_median},   {"kld_p99", r.kld_p99},
                              {"kld_max", r.kld_max},         {"top1_agreement", r.top1_agreement},
                              {"delta_p_mean", r.delta_p_mean}, {"delta_p_stderr", r.delta_p_stderr},
                              {"ppl_base", r.base.ppl},       {"ppl_other", r.other.ppl},
                              {"tokens", r.tokens},           {"ctx", c.ctx}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("PPL(base)  = %.4f +/- %.5f\n", r.base.ppl, r.base.ppl_stderr);
    std::printf("PPL(other) = %.4f +/- %.5f\n", r.other.ppl, r.other.ppl_stderr);
    std::printf("KLD mean   = %.6f +/- %.6f\n", r.kld_mean, r.kld_stderr);
    std::printf("KLD median = %.6f, p99 = %.6f, max = %.6f\n", r.kld_median, r.kld_p99, r.kld_max);
    std::printf("top-1 agreement = %.3f%%\n", 100.0 * r.top1_agreement);
    std::printf("mean delta p(correct) = %+.4f%% +/- %.4f%%\n", 100.0 * r.delta_p_mean, 100.0 * r.delta_p_stderr);
    std::printf("tokens = %lld\n", static_cast<long long>(r.tokens));
  }
}

void setup(CLI::App& root) {
  auto* cmd = root.add_subcommand("eval", "Evaluate models: perplexity, KL divergence");
  cmd->require_subcommand(1);

  auto ppl_model = std::make_shared<std::string>();
  auto ppl = std::make_shared<Common>();
  auto* p = cmd->add_subcommand("ppl", "Perplexity on a text (llama.cpp's windows, second halves scored)");
  p->add_option("model", *ppl_model, "Model")->required();
  add_common(p, *ppl);
  p->callback([ppl_model, ppl] { run_ppl(*ppl_model, *ppl); });

  auto kld_models = std::make_shared<std::pair<std::string, std::string>>();
  auto kld = std::make_shared<Common>();
  auto* k = cmd->add_subcommand("kld", "KL divergence of OTHER from BASE on a text, with both perplexities");
  k->add_option("base", kld_models->first, "Reference model")->required();
  k->add_option("other", kld_models->second, "Model compared with it")->required();
  add_common(k, *kld);
  k->callback([kld_models, kld] { run_kld(kld_models->first, kld_models->second, *kld); });
}

}  // namespace

LOWBIT_COMMAND(eval, setup);
