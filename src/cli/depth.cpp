// lowbit depth MODEL --inputs IN --out OUT [--logits] [--device cpu|cuda]: the seed 004 depth decoder over a file of
// frames (include/lowbit/model/depth_decoder.h; docs/FORMAT.md "Depth decoder directories").
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "command.h"
#include "lowbit/core/error.h"
#include "lowbit/core/thread_pool.h"
#include "lowbit/model/depth_decoder.h"

namespace {

struct Options {
  std::string model, inputs, out, dtype = "f16", device = "cpu";
  bool logits = false;
  double temperature = 0.7;
  int top_k = 64;
  size_t threads = 0;
};

void run(const Options& o) {
  using namespace lowbit;
  set_default_threads(o.threads);
  const DType dtype = o.dtype == "f16" ? DType::F16 : o.dtype == "bf16" ? DType::BF16 : DType::F32;
  const auto t0 = std::chrono::steady_clock::now();
  auto model = model::DepthDecoder::load(
      o.model, {.dtype = dtype, .temperature = o.temperature, .top_k = o.top_k, .cuda = o.device == "cuda"});
  const auto t1 = std::chrono::steady_clock::now();
  const int64_t frames = model::run_depth_file(model, o.inputs, o.out, o.logits);
  const auto t2 = std::chrono::steady_clock::now();
  const double seconds = std::chrono::duration<double>(t2 - t1).count();
  fmt::print(stderr, "depth ({}): loaded in {:.2f} s, {} frames in {:.2f} s ({:.1f} frames/s)\n", o.device,
             std::chrono::duration<double>(t1 - t0).count(), frames, seconds, static_cast<double>(frames) / seconds);
}

void setup(CLI::App& root) {
  static Options o;
  auto* cmd = root.add_subcommand("depth", "Run the seed 004 depth decoder over a file of frames");
  cmd->add_option("model", o.model, "Model directory (depth.safetensors, optional quant.json)")->required();
  cmd->add_option("--inputs", o.inputs, "Input safetensors: h, cb0, uniform, optional force and speaker")->required();
  cmd->add_option("--out", o.out, "Output safetensors: codes, feedback, and logits with --logits")->required();
  cmd->add_flag("--logits", o.logits, "Also write every level's logits");
  cmd->add_option("--dtype", o.dtype, "Compute dtype")->check(CLI::IsMember({"f16", "bf16", "f32"}));
  cmd->add_option("--temperature", o.temperature, "Sampling temperature (default 0.7)");
  cmd->add_option("--top-k", o.top_k, "Top-k of the sampler (default 64)");
  cmd->add_option("--threads", o.threads, "Threads (default: all cores)");
  cmd->add_option("--device", o.device, "Where frames run (cuda: bit-identical to cpu)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->callback([] { run(o); });
}

}  // namespace

LOWBIT_COMMAND(depth, setup);
