// lowbit quantize: loads any model the runtime loads, encodes every tensor with the codec its recipe picks
// (Hessian-aware where a calibration text is given), and writes the artifact through the atomic writer.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "lowbit/artifact/writer.h"
#include "lowbit/core/progress.h"
#include "lowbit/quant/recipe.h"

namespace lowbit::quant {

struct QuantizeOptions {
  std::filesystem::path source;
  std::filesystem::path destination;
  Recipe recipe;
  std::optional<double> target_bpw;         // bits per weight of every tensor (--target-bpw)
  std::optional<double> target_linear_bpw;  // of the layers' linears only (--target-linear-bpw)
  std::optional<std::filesystem::path> calibration;  // none: plain rounding everywhere
  int64_t calib_tokens = 2048;
  int64_t calib_ctx = 512;
  std::optional<std::filesystem::path> calib_cache;  // --calib-cache DIR (quant/calibration_cache.h)
  std::optional<std::filesystem::path> tokenizer;  // for sources without one beside them; copied into OUT
  bool force = false;
  // An already-quantized source (GGUF quant types, MLX or lowbit artifacts, a config.json quantization block) is
  // refused (Errc::unsupported, exit 3) unless this is set (--allow-requantize).
  bool allow_requantize = false;
  // --reuse ART...: earlier artifacts of the same source whose tensors are copied where they match (quant/reuse.h).
  std::vector<std::filesystem::path> reuse;
  uint64_t shard_bytes = artifact::kDefaultShardBytes;
  uint64_t seed = 0;
};

struct TensorReport {
  std::string name;
  Shape shape;
  CodecChoice choice;
  std::string method;  // "dense", "rtn", "gptq", "block_ldlq", "reused" (copied from a --reuse artifact)
  double bits_per_weight = 0;
  uint64_t bytes = 0;
  double loss = 0;      // Hessian-weighted error of what was stored (0 where no Hessian)
  double rtn_loss = 0;  // the same for plain rounding
  int64_t rtn_sampled_rows = 0;  // rtn_loss estimated from this many rows; 0: exact
  bool guard_tripped = false;
  // Calibration rows (tokens) the tensor's Hessian was collected from; an expert's are the tokens routed to it,
  // and fewer than its width leave it "rtn". -1: quantized without calibration.
  int64_t calibration_rows = -1;
};

struct QuantizeReport {
  std::vector<TensorReport> tensors;
  uint64_t weights = 0, bytes = 0;                 // every tensor
  uint64_t linear_weights = 0, linear_bytes = 0;   // without embedding and head (and vectors)
  uint64_t artifact_bytes = 0;
  double seconds = 0;
  uint64_t peak_rss = 0;  // getrusage's peak (anonymous and file-backed together)
  // The peaks sampled every 50 ms (core/progress.h): anonymous and file-backed apart, and their largest sum.
  ResidentMemory peak_resident;
  int64_t calibration_tokens = 0;
  bool source_quantized = false;
  nlohmann::json allocation;
  nlohmann::json calibration_cache;  // layers reused and computed, seconds saved and spent; null without calibration
  nlohmann::json fold;        // the rotation fold's seed, check KLD and deviations, else null  // --target-bpw's budget and per-tensor choices (candidate indices), else null
  double bits_per_weight() const;
  double linear_bits_per_weight() const;
  nlohmann::json to_json() const;
};

QuantizeReport quantize(const QuantizeOptions& options);

}  // namespace lowbit::quant
