// measure_cuda (cuda_model.h): prefill and batched greedy decode speed of a CudaModel.
#include <algorithm>
#include <chrono>
#include <numeric>
#include <random>

#include "lowbit/core/error.h"
#include "lowbit/kernels/cuda.h"
#include "lowbit/model/cuda_model.h"

namespace lowbit::model {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Seconds for `prompt` tokens through CudaModel::prefill on slot 0, the last token's logits copied back.
double prefill_seconds(CudaModel& gpu, const std::vector<int32_t>& prompt) {
  std::vector<float> logits(static_cast<size_t>(gpu.config().vocab));
  const auto t0 = Clock::now();
  gpu.prefill(prompt, 0, 0, CudaModel::Logits::last, logits.data());
  return seconds_since(t0);
}

// Seconds for `steps` greedy steps of `batch` sequences in slots 0..batch-1 from position 0.
double decode_seconds(CudaModel& gpu, const std::vector<int32_t>& first_tokens, int batch, int64_t steps) {
  std::vector<int32_t> pos(batch, 0), slot(batch);
  std::iota(slot.begin(), slot.end(), 0);
  gpu.set_rows(std::span(first_tokens).first(batch), pos, slot);
  const auto t0 = Clock::now();
  gpu.decode_greedy(batch, steps);
  gpu.synchronize();
  return seconds_since(t0);
}

}  // namespace

std::string cuda_device_summary() { return kernels::cuda::device_summary(); }

std::vector<Speed> measure_cuda(const ModelConfig& config, const ModelDesc& desc, const TensorLookup& lookup,
                                const SpeedOptions& o) {
  if (o.batches.empty() || o.prompt < 1 || o.steps < 1) fail(Errc::usage, "[bench] empty batch list or no steps");
  const int max_batch = *std::max_element(o.batches.begin(), o.batches.end());
  const CudaModelOptions options{.max_batch = max_batch,
                                 .slots = max_batch,
                                 .capacity = std::max(o.prompt, o.steps + 4),
                                 .kv_type = o.kv_type,
                                 .use_graphs = o.use_graphs};
  const auto t_load = Clock::now();
  const std::unique_ptr<CudaModel> model = make_cuda_model(config, desc, lookup, o.devices, options, "[bench]");
  CudaModel& gpu = *model;
  const double load = seconds_since(t_load);
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(config.vocab - 1));
  std::vector<int32_t> prompt(static_cast<size_t>(o.prompt)), first(static_cast<size_t>(max_batch));
  for (auto& t : prompt) t = token(rng);
  for (auto& t : first) t = token(rng);
  prefill_seconds(gpu, prompt);  // warm-up: loads the modules
  const double prefill = prefill_seconds(gpu, prompt);
  // The prefill's seconds with the parts in `skipped` left out.
  const auto prefill_without = [&](unsigned skipped) {
    gpu.set_skipped_parts(skipped);
    const double seconds = prefill_seconds(gpu, prompt);
    gpu.set_skipped_parts(0);
    return seconds;
  };
  const double prefill_gemm = prefill_without(kPartsAll);
  const double prefill_attention = prefill - prefill_without(kPartAttention);
  std::vector<Speed> out;
  for (const int batch : o.batches) {
    // ms per step with the parts in `skipped` left out (after a warm-up that captures the graph).
    const auto ms_without = [&](unsigned skipped) {
      gpu.set_skipped_parts(skipped);
      decode_seconds(gpu, first, batch, 4);
      const double seconds = decode_seconds(gpu, first, batch, o.steps);
      gpu.set_skipped_parts(0);
      return 1e3 * seconds / static_cast<double>(o.steps);
    };
    Speed s;
    s.ms_per_step = ms_without(0);
    s.matmul_ms_per_step = ms_without(kPartsAll);
    s.norm_ms = s.ms_per_step - ms_without(kPartNorm);
    s.rope_ms = s.ms_per_step - ms_without(kPartRope);
    s.attention_ms = s.ms_per_step - ms_without(kPartAttention);
    s.swiglu_ms = s.ms_per_step - ms_without(kPartSwiglu);
    s.batch = batch;
    s.prefill_tokens_per_s = static_cast<double>(o.prompt) / prefill;
    s.prefill_gemm_ms = 1e3 * prefill_gemm;
    s.prefill_attention_ms = 1e3 * prefill_attention;
    s.decode_tokens_per_s = 1e3 * batch / s.ms_per_step;
    s.weight_bytes = gpu.weight_bytes();
    s.load_seconds = load;
    out.push_back(s);
  }
  return out;
}

}  // namespace lowbit::model
