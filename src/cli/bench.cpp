// lowbit bench: prefill and decode tokens per second of a model on the CPU or the GPU, or of a synthetic
// Llama-3-8B- or Qwen3-30B-A3B-shaped model on the GPU (random stored arrays per codec, never encoded). Table or
// --json on stdout.
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "command.h"
#include "lowbit/core/error.h"
#include "lowbit/core/thread_pool.h"
#include "lowbit/model/cuda_model.h"
#include "lowbit/model/sampler.h"

namespace {

using namespace lowbit;

struct Args {
  std::optional<std::string> model, synthetic;
  std::string device = "cpu";
  std::string devices;
  std::vector<std::string> codecs{"affine4"};
  std::vector<int> batches{1};
  int64_t prompt = 128, steps = 128, layers = 0;
  std::string kv = "f32";
  bool no_graph = false, json = false;
  size_t threads = 0;
};

struct Row {
  std::string model, codec;
  model::Speed speed;
};

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Bytes of the weights a decode step multiplies: every matrix but a gathered (untied) embedding, as the prepared
// kernels read them (the stored arrays are released after preparing).
uint64_t matmul_bytes(const model::Model& m) {
  uint64_t bytes = m.lm_head->weight_bytes();
  const auto add = [&bytes](const kernels::CpuLinear* k) { bytes += k ? k->weight_bytes() : 0; };
  for (const model::LayerWeights& layer : m.layers) {
    for (const auto& linear : layer.linears) add(linear.get());
    for (const model::ExpertWeights& e : layer.experts) {
      add(e.gate.get());
      add(e.up.get());
      add(e.down.get());
    }
  }
  return bytes;
}

// On the CPU kernels, per batch size B: B sequences, each prefilled with the same random prompt (one forward()
// each), then greedy decode steps of all B together (forward_rows: each linear one batched matmul over the B rows,
// attention per row; B = 1 is forward() of one token, the matvec path).
std::vector<model::Speed> measure_cpu(const model::Model& m, const Args& a) {
  const int64_t ctx = a.prompt + a.steps;
  if (ctx > m.config.max_seq) fail(Errc::usage, "[bench] prompt + steps = {} exceed the context of {}", ctx, m.config.max_seq);
  std::mt19937_64 rng(1);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(m.config.vocab - 1));
  std::vector<int32_t> prompt(static_cast<size_t>(a.prompt));
  for (auto& t : prompt) t = token(rng);
  const auto vocab = static_cast<size_t>(m.config.vocab);
  std::vector<model::Speed> out;
  for (const int batch : a.batches) {
    const auto b = static_cast<size_t>(batch);
    std::vector<std::unique_ptr<model::KvCache>> owned;
    std::vector<model::KvCache*> caches;
    std::vector<float> logits(b * vocab);
    model::Speed s;
    s.batch = batch;
    auto t0 = Clock::now();
    for (size_t i = 0; i < b; ++i) {
      owned.push_back(std::make_unique<model::KvCache>(m.config, ctx));
      caches.push_back(owned.back().get());
      model::forward(m, *caches.back(), prompt, 0, logits.data() + i * vocab, false, default_pool());
    }
    s.prefill_tokens_per_s = static_cast<double>(a.prompt) * static_cast<double>(b) / seconds_since(t0);
    std::vector<int32_t> next(b);
    std::vector<int64_t> pos(b);
    t0 = Clock::now();
    for (int64_t step = 0; step < a.steps; ++step) {
      for (size_t i = 0; i < b; ++i) {
        next[i] = model::argmax(std::span<const float>(logits.data() + i * vocab, vocab));
        pos[i] = a.prompt + step;
      }
      model::forward_rows(m, caches, next, pos, logits.data(), default_pool());
    }
    const double seconds = seconds_since(t0);
    s.decode_tokens_per_s = static_cast<double>(a.steps) * static_cast<double>(b) / seconds;
    s.ms_per_step = 1e3 * seconds / static_cast<double>(a.steps);
    s.weight_bytes = matmul_bytes(m);
    out.push_back(s);
  }
  return out;
}

model::KvType kv_type(const std::string& name) {
  if (name == "f32") return model::KvType::f32;
  if (name == "f16") return model::KvType::f16;
  if (name == "bf16") return model::KvType::bf16;
  fail(Errc::usage, "[bench] --kv {}: expected f32, f16 or bf16", name);
}

std::vector<Row> measure(const Args& a, const std::vector<int>& devices) {
  const model::SpeedOptions gpu{.batches = a.batches,
                                .prompt = a.prompt,
                                .steps = a.steps,
                                .kv_type = kv_type(a.kv),
                                .use_graphs = !a.no_graph,
                                .devices = devices};
  std::vector<Row> rows;
  if (a.synthetic) {
    if (a.device != "cuda") fail(Errc::usage, "[bench] --synthetic runs on --device cuda only");
    for (const std::string& codec : a.codecs) {
      std::fprintf(stderr, "[bench] synthetic %s %s: generating and uploading weights\n", a.synthetic->c_str(),
                   codec.c_str());
      const auto t0 = Clock::now();
      const model::SyntheticModel s = model::synthetic_model(*a.synthetic, codec, 1, a.layers);
      std::fprintf(stderr, "[bench] synthetic %s %s: generated in %.1f s\n", a.synthetic->c_str(), codec.c_str(),
                   seconds_since(t0));
      for (const model::Speed& speed : model::measure_cuda(s.config, s.desc, s.lookup, gpu))
        rows.push_back({*a.synthetic, codec, speed});
    }
    return rows;
  }
  if (!a.model) fail(Errc::usage, "[bench] give a MODEL or --synthetic");
  const auto m = model::load_model(*a.model, {.max_seq = a.prompt + a.steps + 4, .cpu_only = a.device == "cpu"});
  if (a.device == "cuda") {
    const auto lookup = [&m](const std::string& name) {
      const model::NamedTensor* t = m->find(name);
      return t ? &t->ref : nullptr;
    };
    for (const model::Speed& speed : model::measure_cuda(m->config, m->desc, lookup, gpu))
      rows.push_back({*a.model, "", speed});
    return rows;
  }
  if (a.device != "cpu") fail(Errc::usage, "[bench] --device {}: expected cpu or cuda", a.device);
  for (const model::Speed& speed : measure_cpu(*m, a)) rows.push_back({*a.model, "", speed});
  return rows;
}

void run(const Args& a) {
  set_default_threads(a.threads);
  const std::vector<int> devices = lowbit::cli::devices_of(a.devices);
  if (!devices.empty() && a.device != "cuda") fail(Errc::usage, "[--devices] runs on --device cuda, not {}", a.device);
  const std::string device = a.device == "cuda" ? model::cuda_device_summary() : "cpu";
  const std::vector<Row> rows = measure(a, devices);
  if (a.json) {
    nlohmann::json out = {{"device", device}, {"prompt", a.prompt}, {"steps", a.steps}, {"kv", a.kv},
                          {"graphs", !a.no_graph}, {"rows", nlohmann::json::array()}};
    for (const Row& r : rows)
      out["rows"].push_back({{"model", r.model}, {"codec", r.codec}, {"batch", r.speed.batch},
                             {"prefill_tokens_per_s", r.speed.prefill_tokens_per_s},
                             {"prefill_gemm_ms", r.speed.prefill_gemm_ms},
                             {"prefill_attention_ms", r.speed.prefill_attention_ms},
                             {"decode_tokens_per_s", r.speed.decode_tokens_per_s},
                             {"ms_per_step", r.speed.ms_per_step}, {"matmul_ms_per_step", r.speed.matmul_ms_per_step},
                             {"norm_ms", r.speed.norm_ms}, {"rope_ms", r.speed.rope_ms},
                             {"attention_ms", r.speed.attention_ms}, {"swiglu_ms", r.speed.swiglu_ms},
                             {"weight_bytes", r.speed.weight_bytes}, {"load_s", r.speed.load_seconds}});
    std::printf("%s\n", out.dump().c_str());
    return;
  }
  std::printf("%s; prompt %lld, decode %lld steps from position 0\n", device.c_str(), static_cast<long long>(a.prompt),
              static_cast<long long>(a.steps));
  std::printf("%-24s %-9s %5s %12s %12s %9s %11s %9s %8s\n", "model", "codec", "batch", "prefill t/s", "decode t/s",
              "ms/step", "matmul ms", "weight GB", "GB/s");
  for (const Row& r : rows) {
    const auto& s = r.speed;
    const double gb = static_cast<double>(s.weight_bytes) / 1e9;
    std::printf("%-24s %-9s %5d %12.1f %12.1f %9.3f %11.3f %9.3f %8.0f\n", r.model.c_str(), r.codec.c_str(),
                s.batch, s.prefill_tokens_per_s, s.decode_tokens_per_s, s.ms_per_step, s.matmul_ms_per_step, gb,
                s.ms_per_step > 0 ? gb / (s.ms_per_step / 1e3) : 0.0);
  }
}

void setup(CLI::App& root) {
  auto args = std::make_shared<Args>();
  auto* cmd = root.add_subcommand("bench", "Prefill and decode tokens/s of a model, or of a synthetic shape on the GPU");
  cmd->add_option("model", args->model, "Model: llama2.c .bin, HF directory, lowbit artifact, GGUF");
  cmd->add_option("--device", args->device, "cpu or cuda")->capture_default_str();
  lowbit::cli::add_devices_option(cmd, args->devices);
  cmd->add_option("--synthetic", args->synthetic, "Synthetic shape instead of a model: llama3-8b or qwen3-30b-a3b (GPU only)");
  cmd->add_option("--codec", args->codecs, "Synthetic codecs: bf16, affine4, trellis2, trellis3 (comma list)")
      ->delimiter(',');
  cmd->add_option("--layers", args->layers, "Synthetic depth (default: the shape's)");
  cmd->add_option("--batch", args->batches, "Decode batch sizes, 1..16 (comma list)")
      ->delimiter(',')
      ->check(CLI::Range(1, 16));
  cmd->add_option("--prompt", args->prompt, "Prompt tokens for prefill")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("-n,--steps", args->steps, "Decode steps")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--kv", args->kv, "GPU KV cache type: f32, f16, bf16")->capture_default_str();
  cmd->add_flag("--no-graph", args->no_graph, "GPU: launch every kernel each step instead of replaying a CUDA graph");
  cmd->add_option("--threads", args->threads, "CPU threads (default: all cores)");
  cmd->add_flag("--json", args->json, "Print one JSON object");
  cmd->callback([args] { run(*args); });
}

}  // namespace

LOWBIT_COMMAND(bench, setup);
