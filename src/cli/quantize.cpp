// lowbit quantize SRC OUT: recipe-driven, calibrated quantization into an artifact.
#include <unistd.h>

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "command.h"
#include "lowbit/core/error.h"
#include "lowbit/core/progress.h"
#include "lowbit/core/thread_pool.h"
#include "lowbit/quant/pipeline.h"

namespace {

namespace fs = std::filesystem;

struct Args {
  std::string source, destination;
  std::optional<std::string> recipe_file, preset_name, calib, calib_cache, tokenizer;
  std::optional<double> target_bpw, target_linear_bpw;
  int64_t calib_tokens = 2048;
  int64_t calib_ctx = 512;
  bool no_calib = false;
  bool force = false;
  bool allow_requantize = false;
  std::vector<std::string> reuse;
  bool json = false;
  size_t threads = 0;
  uint64_t seed = 0;
  uint64_t shard_bytes = lowbit::artifact::kDefaultShardBytes;
};

// The default calibration text: Debian's reference manual, installed by the debian-reference-en package
// (scripts/install-deps.sh) as gzip. Its text is the one docs/QUALITY.md's rows were calibrated on.
// LOWBIT_DEFAULT_CALIB names another file to take as the default (where the package installs elsewhere; tests).
constexpr const char* kDebianReference = "/usr/share/debian-reference/debian-reference.en.txt.gz";

fs::path default_calibration() {
  const char* env = std::getenv("LOWBIT_DEFAULT_CALIB");
  const fs::path path = env && *env ? fs::path(env) : fs::path(kDebianReference);
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    lowbit::fail(lowbit::Errc::missing_file,
                 "[quantize] no default calibration text at {}: install debian-reference-en, pass --calib FILE, "
                 "or --no-calib for plain rounding",
                 path.string());
  return path;
}

void run(const Args& a) {
  using namespace lowbit;
  set_default_threads(a.threads);
  if (a.recipe_file && a.preset_name) fail(Errc::usage, "[quantize] give --recipe or --preset, not both");
  quant::QuantizeOptions o;
  o.source = a.source;
  o.destination = a.destination;
  o.recipe = a.recipe_file ? quant::Recipe::load(*a.recipe_file) : quant::preset(a.preset_name.value_or("affine4"));
  o.target_bpw = a.target_bpw;
  o.target_linear_bpw = a.target_linear_bpw;
  if (a.no_calib && a.calib) fail(Errc::usage, "[quantize] give --calib FILE or --no-calib, not both");
  if (!a.no_calib) o.calibration = a.calib ? fs::path(*a.calib) : default_calibration();
  if (o.calibration) std::fprintf(stderr, "[quantize] calibrating on %s\n", o.calibration->string().c_str());
  o.calib_tokens = a.calib_tokens;
  o.calib_ctx = a.calib_ctx;
  if (a.calib_cache) {
    if (!o.calibration) fail(Errc::usage, "[quantize] --calib-cache needs a calibration text (drop --no-calib)");
    o.calib_cache = fs::path(*a.calib_cache);
  }
  if (a.tokenizer) o.tokenizer = fs::path(*a.tokenizer);
  o.force = a.force;
  o.allow_requantize = a.allow_requantize;
  o.reuse.assign(a.reuse.begin(), a.reuse.end());
  o.seed = a.seed;
  o.shard_bytes = a.shard_bytes;
  const quant::QuantizeReport r = quant::quantize(o);
  if (a.json) {
    std::printf("%s\n", r.to_json().dump(1).c_str());
    return;
  }
  size_t tripped = 0;
  for (const auto& t : r.tensors) tripped += t.guard_tripped;
  std::printf("wrote %s: %zu tensors, %s\n", a.destination.c_str(), r.tensors.size(),
              human_bytes(r.artifact_bytes).c_str());
  std::printf("bits per weight: %.3f overall, %.3f on the linears (without embedding and head)\n",
              r.bits_per_weight(), r.linear_bits_per_weight());
  std::printf(
      "recipe %s; calibration tokens %lld; guard trips %zu; %.1f s; peak RSS %s (%s anonymous, %s "
      "file-backed)\n",
      o.recipe.name.c_str(), static_cast<long long>(r.calibration_tokens), tripped, r.seconds,
      human_bytes(r.peak_rss).c_str(), human_bytes(r.peak_resident.anon).c_str(),
      human_bytes(r.peak_resident.file).c_str());
}

void setup(CLI::App& root) {
  auto args = std::make_shared<Args>();
  auto* cmd = root.add_subcommand("quantize", "Quantize a model into a lowbit artifact");
  cmd->add_option("source", args->source, "Model: HF directory, GGUF, llama2.c .bin, MLX directory, artifact")
      ->required();
  cmd->add_option("destination", args->destination, "Output artifact directory")->required();
  cmd->add_option("--recipe", args->recipe_file, "Recipe JSON file (docs/RECIPES.md)");
  cmd->add_option("--preset", args->preset_name,
                  "Built-in recipe: affine4 (default), affine3, q4, q3, fivestate, trellis2, trellis3, trellis4");
  cmd->add_option("--target-bpw", args->target_bpw, "Choose among the recipe's candidates to fit X bits per weight");
  cmd->add_option("--target-linear-bpw", args->target_linear_bpw,
                  "Choose among the linears' candidates to fit X bits per weight on the linears (embedding and head "
                  "keep their first candidate)");
  cmd->add_option("--calib", args->calib, "Calibration text, plain or gzip (default: debian-reference-en's text, "
                  "/usr/share/debian-reference/debian-reference.en.txt.gz)");
  cmd->add_flag("--no-calib", args->no_calib, "Plain rounding, no calibration");
  cmd->add_option("--calib-tokens", args->calib_tokens, "Calibration tokens")->capture_default_str();
  cmd->add_option("--calib-ctx", args->calib_ctx, "Calibration window length")->capture_default_str();
  cmd->add_option("--calib-cache", args->calib_cache,
                  "Directory that keeps each layer's calibration Hessians and reuses them when nothing they depend "
                  "on changed (docs/RECIPES.md)");
  cmd->add_option("--tokenizer", args->tokenizer, "Tokenizer file when not beside the source; stored in OUT");
  cmd->add_option("--threads", args->threads, "Threads (default: all cores)");
  cmd->add_option("--seed", args->seed, "Seed for randomized transforms")->capture_default_str();
  cmd->add_option("--shard-bytes", args->shard_bytes, "Cut payload shards at this many bytes")->capture_default_str();
  cmd->add_flag("--force", args->force, "Replace an existing artifact at OUT");
  cmd->add_flag("--allow-requantize", args->allow_requantize,
                "Quantize a source that is already quantized (GGUF quant types, MLX or lowbit artifacts)");
  cmd->add_option("--reuse", args->reuse,
                  "Earlier artifacts of the same source: a tensor they store with the codec and parameters the recipe "
                  "picks is copied, not encoded again (the first that has it; recorded in provenance.sources)")
      ->check(CLI::ExistingDirectory);
  cmd->add_flag("--json", args->json, "Print the report as JSON");
  cmd->callback([args] { run(*args); });
}

}  // namespace

LOWBIT_COMMAND(quantize, setup);
