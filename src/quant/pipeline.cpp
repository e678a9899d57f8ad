#include "lowbit/quant/pipeline.h"

#include <chrono>
#include <cstdio>
#include <algorithm>
#include <map>

#include "lowbit/artifact/writer.h"
#include "lowbit/core/checked.h"
#include "lowbit/core/error.h"
#include "lowbit/core/progress.h"
#include "lowbit/core/sha256.h"
#include "lowbit/core/thread_pool.h"
#include "lowbit/io/json.h"
#include "lowbit/kernels/cpu.h"
#include "lowbit/model/gguf_model.h"
#include "lowbit/model/model.h"
#include "lowbit/model/speech.h"
#include "lowbit/model/tokenizer_export.h"
#include "lowbit/quant/allocate.h"
#include "lowbit/quant/block_ldlq.h"
#include "lowbit/quant/calibration.h"
#include "lowbit/quant/calibration_cache.h"
#include "lowbit/quant/fold.h"
#include "lowbit/quant/gptq.h"
#include "lowbit/quant/reuse.h"

namespace lowbit::quant {

namespace {

namespace fs = std::filesystem;

constexpr int64_t kDecodeBlockValues = int64_t{16} << 20;

uint64_t total_weights(const model::Model& m) {
  uint64_t n = 0;
  for (const auto& t : m.tensors) n += checked_numel(t.ref.shape, t.name);
  return n;
}

bool is_head_or_embedding(std::string_view name) {
  return name == model::kEmbedTensor || name == model::kLmHeadTensor;
}

uint64_t encoded_bytes(const codec::EncodedTensor& t) {
  uint64_t n = 0;
  for (const auto& [role, buffer] : t.arrays) n += buffer.bytes.size();
  return n;
}

// Why the source at `path` is already quantized, from its files alone (before loading it): a GGUF tensor of a
// quantized ggml type, or a config.json with a `quantization` (MLX) or `quantization_config` (transformers)
// block. nullopt when the files say nothing; the loaded tensors' codecs are checked after loading.
std::optional<std::string> quantized_source_files(const fs::path& path) {
  std::error_code ec;
  if (fs::is_regular_file(path, ec) && model::is_gguf_file(path)) {
    const auto file = io::GgufFile::open(path);
    for (const auto& t : file.header().tensors)
      if (t.type != io::GgmlType::F32 && t.type != io::GgmlType::F16 && t.type != io::GgmlType::BF16)
        return fmt::format("GGUF tensor '{}' is {}", t.name, io::ggml_type_info(static_cast<uint32_t>(t.type))->name);
    return std::nullopt;
  }
  const fs::path config = path / "config.json";
  if (!fs::is_directory(path, ec) || !fs::is_regular_file(config, ec)) return std::nullopt;
  const nlohmann::json j = io::read_json_file(config, "quantize", 16 << 20);
  for (const char* key : {"quantization", "quantization_config"})
    if (j.is_object() && j.contains(key)) return fmt::format("config.json has a '{}' block", key);
  return std::nullopt;
}

// Requantizing compounds two quantizations' errors, so it takes --allow-requantize; with it, a warning.
void check_requantize(const QuantizeOptions& o, const std::optional<std::string>& why) {
  if (!why) return;
  if (!o.allow_requantize)
    fail(Errc::unsupported,
         "[quantize] {} is already quantized ({}); requantizing adds a second rounding error to the "
         "first, pass --allow-requantize to do it anyway",
         o.source.string(), *why);
  std::fprintf(stderr, "[quantize] warning: %s is already quantized (%s); quality is bounded by the source\n",
               o.source.string().c_str(), why->c_str());
}

// A GGUF tokenizer (the source itself, or --tokenizer) travels as its tokenizer metadata only
// (model/tokenizer_export.h), never as a copy of a whole model file.
std::optional<fs::path> gguf_tokenizer_source(const QuantizeOptions& o) {
  const fs::path& f = o.tokenizer ? *o.tokenizer : o.source;
  std::error_code ec;
  if (fs::is_regular_file(f, ec) && model::is_gguf_file(f)) return f;
  return std::nullopt;
}

// Tokenizer and config files that travel with the model into the artifact.
std::vector<fs::path> tokenizer_files(const QuantizeOptions& o) {
  std::vector<fs::path> files;
  if (gguf_tokenizer_source(o)) return files;
  if (o.tokenizer) files.push_back(*o.tokenizer);
  std::error_code ec;
  if (fs::is_directory(o.source, ec))
    // Recent transformers save the chat template as chat_template.jinja (older ones inside tokenizer_config.json
    // or as chat_template.json); chat and serve read it from the artifact.
    for (const char* name : {"tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
                             "generation_config.json", "chat_template.jinja", "chat_template.json"})
      if (fs::is_regular_file(o.source / name) && (!o.tokenizer || o.tokenizer->filename() != name))
        files.push_back(o.source / name);
  return files;
}

std::vector<artifact::SourceFile> source_files(const fs::path& source) {
  std::vector<fs::path> paths;
  std::error_code ec;
  if (fs::is_directory(source, ec)) {
    for (const auto& e : fs::directory_iterator(source))
      if (e.is_regular_file()) paths.push_back(e.path());
    std::sort(paths.begin(), paths.end());
  } else {
    paths.push_back(source);
  }
  uint64_t total = 0;
  for (const auto& p : paths) total += fs::file_size(p);
  Progress progress("hash sources", total, "B");
  std::vector<artifact::SourceFile> out;
  for (const auto& p : paths)
    out.push_back({p.filename().string(), static_cast<uint64_t>(fs::file_size(p)), sha256_file(p, &progress)});
  return out;
}

// Artifacts store q/k rows in Hugging Face's half-rotation RoPE layout, whatever the source used (llama2.c and
// GGUF llama rotate adjacent pairs), so that every artifact reads like an HF / MLX checkpoint.
std::unique_ptr<model::Model> to_hf_rope_layout(std::unique_ptr<model::Model> m) {
  const model::ModelConfig& c = m->config;
  if (c.rope_style == model::RopeStyle::half) return m;
  model::ModelBuilder b;
  for (const auto& t : m->tensors) b.add_f32(t.name, t.ref.shape, model::decode_half_rope(*m, t));
  model::ModelConfig half = c;
  half.rope_style = model::RopeStyle::half;
  return b.finish(half, "quantize");
}

class Quantizer {
 public:
  Quantizer(const QuantizeOptions& o, model::Model& model, artifact::ArtifactWriter& writer, QuantizeReport& report,
            ReuseBank* reuse)
      : o_(o), model_(model), writer_(writer), report_(report), reuse_(reuse) {}

  // Encodes one tensor with its recipe's choice (GPTQ where a Hessian and a column quantizer exist), writes it,
  // and returns the stored encoding for the caller to run the model on.
  codec::EncodedTensor encode(const model::NamedTensor& t, const Hessian* h) {
    const std::vector<float> w = decode_releasing(t);
    const auto chosen = allocated_.find(t.name);
    const CodecChoice choice = chosen != allocated_.end() ? chosen->second : o_.recipe.choose(t.name, t.ref.shape);
    const codec::Codec& codec = codec::codec_or_throw(choice.codec, t.name);
    TensorReport r{t.name, t.ref.shape, choice, "rtn"};
    std::optional<codec::EncodedTensor> reused;
    if (reuse_ && choice.codec != "dense") reused = reuse_->take(t.name, t.ref.shape, choice);
    codec::EncodeOptions eo;
    eo.seed = o_.seed;
    eo.pool = &default_pool();
    codec::EncodedTensor enc;
    if (choice.codec == "dense") {
      r.method = "dense";
      enc = codec.encode(choice.params, t.ref.shape, w.data(), eo);
    } else if (!reused && h && h->dim > 0 && (codec.quantize_column || choice.codec == "trellis")) {
      GptqOptions go;
      go.encode = eo;
      const bool trellis = choice.codec == "trellis";
      if (trellis) go.damp = kBlockLdlqDamp;
      RoundingResult rr = trellis ? block_ldlq_quantize(choice.params, t.ref.shape, w.data(), *h, go)
                                  : gptq_quantize(codec, choice.params, t.ref.shape, w.data(), *h, go);
      r.method = rr.guard_tripped || !rr.hessian_aware ? "rtn" : (trellis ? "block_ldlq" : "gptq");
      r.loss = rr.loss;
      r.rtn_loss = rr.rtn_loss;
      r.rtn_sampled_rows = rr.rtn_sampled_rows;
      r.guard_tripped = rr.guard_tripped;
      enc = std::move(rr.tensor);
    } else {
      if (reused) r.method = "reused";
      enc = reused ? std::move(*reused) : codec.encode(choice.params, t.ref.shape, w.data(), eo);
      if (h && h->dim > 0) {
        const auto q = codec::decode_all({&codec, enc.params, t.ref.shape, enc.views()});
        r.loss = r.rtn_loss = hessian_loss(w, q, codec::matrix_dims(t.ref.shape).first, *h);
      }
    }
    r.bytes = encoded_bytes(enc);
    r.bits_per_weight = codec::bits_per_weight(codec, enc.params, t.ref.shape);
    record(r);
    writer_.add(t.name, t.ref.shape, choice.codec, enc);
    return enc;
  }

  // Measures every candidate of a tensor's rule by plain rounding (measure_candidate): its bytes, and its error
  // (Hessian-weighted where a Hessian is given, plain squared error otherwise).
  AllocationItem measure(const model::NamedTensor& t, const Hessian* h) const {
    AllocationItem item{t.name, {}, {}};
    const std::vector<CodecChoice> candidates = o_.recipe.candidates(t.name, t.ref.shape);
    const std::vector<float> w = decode_releasing(t);
    std::vector<int64_t> sampled_rows;
    for (const CodecChoice& c : candidates) {
      const CandidateMeasure m = measure_candidate(c, t.ref.shape, w.data(), h, o_.seed, t.name);
      item.bytes.push_back(m.bytes);
      item.loss.push_back(m.loss);
      sampled_rows.push_back(m.sampled_rows);
    }
    candidates_[t.name] = candidates;
    sampled_rows_[t.name] = std::move(sampled_rows);
    return item;
  }

  const std::vector<CodecChoice>& measured(const std::string& name) const { return candidates_.at(name); }
  const std::vector<int64_t>& sampled_rows(const std::string& name) const { return sampled_rows_.at(name); }

  void apply(const std::vector<AllocationItem>& items, const Allocation& a) {
    for (size_t i = 0; i < items.size(); ++i) allocated_[items[i].name] = measured(items[i].name)[a.choice[i]];
  }

 private:
  // t's values, decoded in blocks of rows, the source's pages released after each (MappedFile::release_pages): the
  // source's resident pages are one block's, not a tensor's (a 150k-row embedding is 1.2 GB of bf16).
  std::vector<float> decode_releasing(const model::NamedTensor& t) const {
    const auto [rows, cols] = codec::matrix_dims(t.ref.shape);
    std::vector<float> w(checked_mul(static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), t.name));
    const int64_t block = std::max<int64_t>(1, kDecodeBlockValues / std::max<int64_t>(cols, 1));
    for (int64_t r = 0; r < rows; r += block) {
      t.ref.codec->decode_rows(t.ref.params, t.ref.shape, t.ref.arrays, r, std::min(rows, r + block),
                               w.data() + r * cols);
      model_.release_pages(t);
    }
    return w;
  }

  void record(const TensorReport& r) {
    const uint64_t n = checked_numel(r.shape, r.name);
    report_.weights += n;
    report_.bytes += r.bytes;
    if (r.shape.size() == 2 && !is_head_or_embedding(r.name)) {
      report_.linear_weights += n;
      report_.linear_bytes += r.bytes;
    }
    report_.tensors.push_back(r);
  }

  const QuantizeOptions& o_;
  const model::Model& model_;
  artifact::ArtifactWriter& writer_;
  QuantizeReport& report_;
  ReuseBank* reuse_;  // --reuse; null without
  std::map<std::string, CodecChoice, std::less<>> allocated_;
  mutable std::map<std::string, std::vector<CodecChoice>> candidates_;
  mutable std::map<std::string, std::vector<int64_t>> sampled_rows_;
};

// Folds and rotates the model, then checks over a few hundred tokens that the full-precision function is kept
// (mean KLD against the unrotated model below 1e-4) before anything is quantized.
nlohmann::json fold_checked(std::unique_ptr<model::Model>& model, const std::optional<CalibrationText>& calib,
                            uint64_t seed) {
  FoldResult folded = fold_and_rotate(*model, seed);
  std::vector<std::vector<int32_t>> windows;
  int64_t tokens = 0;
  if (calib) {
    for (const auto& w : calib->windows) {
      if (tokens >= 256) break;
      windows.emplace_back(w.begin(), w.begin() + std::min<std::ptrdiff_t>(static_cast<std::ptrdiff_t>(w.size()), 128));
      tokens += static_cast<int64_t>(windows.back().size());
    }
  } else {  // no text: a fixed pseudo-random token sequence exercises the same arithmetic
    std::vector<int32_t> w;
    for (int64_t i = 0; i < std::min<int64_t>(256, model->config.max_seq); ++i)
      w.push_back(static_cast<int32_t>((i * 7919 + 17) % model->config.vocab));
    windows.push_back(w);
  }
  const double kld = mean_kld(*model, *folded.model, windows);
  constexpr double kMaxFoldKld = 1e-4;
  if (!(kld < kMaxFoldKld))
    fail(Errc::internal, "[quantize] rotation fold changed the model: KLD {:.3g} >= {:.0e} over the check tokens", kld,
         kMaxFoldKld);
  std::fprintf(stderr, "[quantize] rotation fold (seed %llu): KLD %.3g against the source\n",
               static_cast<unsigned long long>(seed), kld);
  model = std::move(folded.model);
  return {{"seed", seed}, {"kld", kld}, {"deviations", folded.deviations}};
}

// What the calibration cache's key takes from outside the calibration text (calibration_cache.h).
struct CalibrationKeySource {
  std::vector<std::string> source_sha256;
  bool rotate = false;
  uint64_t rotation_seed = 0;
};

std::optional<CalibrationCache> open_calibration_cache(const QuantizeOptions& o, const CalibrationKeySource& key,
                                                       std::string_view pass, const CalibrationText& text) {
  if (!o.calib_cache) return std::nullopt;
  return CalibrationCache(*o.calib_cache,
                          CalibrationCache::base_key(pass, key.source_sha256, text, key.rotate, key.rotation_seed));
}

void report_calibration_cache(const QuantizeOptions& o, const CalibrationCacheStats& s, std::string_view pass) {
  if (!o.calib_cache) return;
  const std::string dir = o.calib_cache->string();
  const auto layers = static_cast<long long>(s.reused + s.computed);
  const int n = static_cast<int>(pass.size());
  if (s.reused == 0 && s.rejected == 0)
    std::fprintf(stderr, "[quantize] calibration: %lld layers computed (%.*s pass, %.2f s) and stored in cache %s\n",
                 layers, n, pass.data(), s.seconds_spent, dir.c_str());
  else if (s.computed == 0)
    std::fprintf(stderr, "[quantize] calibration: reused from cache %s (%.*s pass, %lld of %lld layers), saved %.2f s\n",
                 dir.c_str(), n, pass.data(), static_cast<long long>(s.reused), layers, s.seconds_saved);
  else
    std::fprintf(stderr,
                 "[quantize] calibration: %lld of %lld layers reused from cache %s (%.*s pass, saved %.2f s), %lld "
                 "computed (%.2f s) and stored there\n",
                 static_cast<long long>(s.reused), layers, dir.c_str(), n, pass.data(), s.seconds_saved,
                 static_cast<long long>(s.computed), s.seconds_spent);
}

// --target-bpw / --target-linear-bpw: measures every tensor's candidates on the full-precision model (layer by
// layer, with the calibration Hessians when there are any) and picks one per tensor within the byte budget: of
// every tensor, or of the layers' linears only (embedding and head then keep their first candidate, outside it).
struct BitsTarget {
  double bits_per_weight;
  bool linears_only;
};

// The command line's target, else the recipe's own target for the linears, else none.
std::optional<BitsTarget> bits_target(const QuantizeOptions& o) {
  if (o.target_bpw && o.target_linear_bpw)
    fail(Errc::usage, "[quantize] give --target-bpw or --target-linear-bpw, not both");
  if (o.target_bpw) return BitsTarget{*o.target_bpw, false};
  if (o.target_linear_bpw) return BitsTarget{*o.target_linear_bpw, true};
  if (o.recipe.target_linear_bpw) return BitsTarget{*o.recipe.target_linear_bpw, true};
  return std::nullopt;
}

nlohmann::json allocate_bits(const QuantizeOptions& o, const BitsTarget& goal, model::Model& model,
                             Quantizer& quantizer,
                             const std::map<int64_t, std::vector<const model::NamedTensor*>>& by_layer,
                             const std::optional<CalibrationText>& calib, const CalibrationKeySource& key) {
  const bool linears_only = goal.linears_only;
  const double target = goal.bits_per_weight;
  std::vector<AllocationItem> items;
  uint64_t weights = 0;
  for (const auto& [layer, tensors] : by_layer)
    for (const model::NamedTensor* t : tensors) weights += checked_numel(t->ref.shape, t->name);
  Progress progress("measure candidates", total_weights(model), "weights");
  for (const auto& t : model.tensors) {
    if (layer_linear(model.desc, t.name)) continue;
    if (!linears_only) {
      items.push_back(quantizer.measure(t, nullptr));
      weights += checked_numel(t.ref.shape, t.name);
    }
    progress.advance(checked_numel(t.ref.shape, t.name));
  }
  std::optional<CachedCalibrator> calibrator;
  if (calib) calibrator.emplace(model, *calib, open_calibration_cache(o, key, "measure", *calib));
  for (const auto& [layer, tensors] : by_layer) {
    LayerHessians hessians;
    if (calibrator) {
      progress.set_note(fmt::format("calibrating layer {}", layer));  // the bar keeps ticking meanwhile
      hessians = calibrator->hessians(layer);
    }
    for (const model::NamedTensor* t : tensors) {
      const LayerLinear linear = *layer_linear(model.desc, t->name);
      progress.set_note(t->name);
      items.push_back(quantizer.measure(*t, calibrator ? hessians.for_linear(linear.input, linear.expert) : nullptr));
      progress.advance(checked_numel(t->ref.shape, t->name));
    }
    if (calibrator) calibrator->finish_layer(layer);
  }
  progress.finish();
  if (calibrator) report_calibration_cache(o, calibrator->stats(), "measure");
  const auto budget = static_cast<uint64_t>(target * static_cast<double>(weights) / 8.0);
  const Allocation a = allocate(items, budget);
  if (!a.feasible)
    std::fprintf(stderr, "[quantize] warning: %.3f bits per weight is below the smallest candidates (%.3f)\n", target,
                 8.0 * static_cast<double>(a.bytes) / static_cast<double>(weights));
  quantizer.apply(items, a);
  nlohmann::json out{{"target_bits_per_weight", target}, {"scope", linears_only ? "linears" : "all"},
                     {"budget_bytes", budget}, {"bytes", a.bytes}, {"feasible", a.feasible},
                     {"choices", nlohmann::json::object()}};
  // Per tensor: the index of the chosen candidate, and every candidate measured with its bytes, loss and the
  // rows it was measured on.
  for (size_t i = 0; i < items.size(); ++i) {
    nlohmann::json measured = nlohmann::json::array();
    const std::vector<CodecChoice>& choices = quantizer.measured(items[i].name);
    for (size_t k = 0; k < choices.size(); ++k)
      measured.push_back({{"codec", choices[k].codec}, {"params", choices[k].params}, {"bytes", items[i].bytes[k]},
                          {"loss", items[i].loss[k]}, {"sampled_rows", quantizer.sampled_rows(items[i].name)[k]}});
    out["choices"][items[i].name] = {{"chosen", a.choice[i]}, {"candidates", std::move(measured)}};
  }
  return out;
}

// An artifact of only affine and dense tensors also carries mlx-lm's config.json: the HF config plus a
// "quantization" block whose defaults are the most common affine setting and whose per-module entries override it.
// MLX has no padding, so a width that is no multiple of its group keeps the artifact lowbit-only.
std::optional<nlohmann::json> mlx_config(const nlohmann::json& hf_config, const QuantizeReport& report) {
  std::map<std::pair<int64_t, int64_t>, int> counts;
  for (const auto& t : report.tensors) {
    if (t.choice.codec == "dense") continue;
    if (t.choice.codec != "affine" || !t.name.ends_with(".weight")) return std::nullopt;
    if (t.shape[1] % t.choice.params.at("group_size").get<int64_t>() != 0) return std::nullopt;
    counts[{t.choice.params.at("bits").get<int64_t>(), t.choice.params.at("group_size").get<int64_t>()}]++;
  }
  if (counts.empty()) return std::nullopt;
  const auto common = std::max_element(counts.begin(), counts.end(),
                                       [](const auto& a, const auto& b) { return a.second < b.second; })->first;
  nlohmann::json q{{"group_size", common.second}, {"bits", common.first}, {"mode", "affine"}};
  for (const auto& t : report.tensors) {
    if (t.choice.codec != "affine") continue;
    const std::pair<int64_t, int64_t> setting{t.choice.params.at("bits").get<int64_t>(),
                                              t.choice.params.at("group_size").get<int64_t>()};
    if (setting != common)
      q[t.name.substr(0, t.name.size() - 7)] = {{"group_size", setting.second}, {"bits", setting.first}};
  }
  nlohmann::json config = hf_config;
  config["quantization"] = q;
  config["quantization_config"] = q;
  return config;
}

}  // namespace

double QuantizeReport::bits_per_weight() const { return weights ? 8.0 * bytes / weights : 0.0; }
double QuantizeReport::linear_bits_per_weight() const {
  return linear_weights ? 8.0 * linear_bytes / linear_weights : 0.0;
}

nlohmann::json QuantizeReport::to_json() const {
  nlohmann::json tensors_json = nlohmann::json::array();
  for (const auto& t : tensors)
    tensors_json.push_back({{"name", t.name}, {"shape", t.shape}, {"codec", t.choice.codec}, {"method", t.method},
                            {"bits_per_weight", t.bits_per_weight}, {"bytes", t.bytes}, {"proxy_loss", t.loss},
                            {"rtn_proxy_loss", t.rtn_loss}, {"rtn_proxy_loss_sampled_rows", t.rtn_sampled_rows},
                            {"guard_tripped", t.guard_tripped}, {"calibration_rows", t.calibration_rows}});
  return {{"tensors", tensors_json},
          {"weights", weights},
          {"bytes", bytes},
          {"bits_per_weight", bits_per_weight()},
          {"linear_bits_per_weight", linear_bits_per_weight()},
          {"artifact_bytes", artifact_bytes},
          {"wall_seconds", seconds},
          {"peak_rss_bytes", peak_rss},
          {"peak_rss_anon_bytes", peak_resident.anon},
          {"peak_rss_file_bytes", peak_resident.file},
          {"calibration_tokens", calibration_tokens},
          {"source_quantized", source_quantized},
          {"allocation", allocation},
          {"fold", fold},
          {"calibration_cache", calibration_cache}};
}

QuantizeReport quantize(const QuantizeOptions& o) {
  const auto start = std::chrono::steady_clock::now();
  start_rss_sampling();
  const std::optional<BitsTarget> goal = bits_target(o);
  QuantizeReport report;
  std::optional<std::string> quantized = quantized_source_files(o.source);
  if (!o.allow_requantize) check_requantize(o, quantized);  // before the load: a refusal costs no time
  // A qwen3_asr checkpoint: its text decoder is quantized as any model; the audio tower's and projector's tensors
  // follow the recipe's rules by their own names and are written alongside.
  const bool speech = model::is_qwen3_asr_checkpoint(o.source);
  if (speech && o.recipe.rotate)
    fail(Errc::unsupported,
         "[quantize] {}: recipe {} rotates the residual stream, which the audio encoder's output "
         "feeds unrotated (qwen3_asr)",
         o.source.string(), o.recipe.name);
  std::vector<model::NamedTensor> tower;
  std::unique_ptr<model::Model> model;
  if (speech) {
    model::SpeechCheckpoint ckpt = model::load_qwen3_asr_checkpoint(o.source, {});
    model = std::move(ckpt.decoder);
    tower = std::move(ckpt.tower);
  } else {
    model = to_hf_rope_layout(model::load_model(o.source));
  }
  for (const auto& t : model->tensors)
    if (!quantized && t.ref.codec->id != "dense")
      quantized = fmt::format("tensor '{}' is stored as {}", t.name, t.ref.codec->id);
  check_requantize(o, quantized);
  report.source_quantized = quantized.has_value();

  std::optional<CalibrationText> calib;
  if (o.calibration) {
    const auto tokenizer = model::load_tokenizer(o.source, o.tokenizer);
    calib = load_calibration(*o.calibration, *tokenizer, o.calib_tokens, std::min(o.calib_ctx, model->config.max_seq));
    report.calibration_tokens = calib->tokens();
  }

  if (o.recipe.rotate) report.fold = fold_checked(model, calib, o.seed);
  const std::vector<artifact::SourceFile> sources = source_files(o.source);
  CalibrationKeySource cache_key{{}, o.recipe.rotate, o.seed};
  for (const auto& f : sources) cache_key.source_sha256.push_back(f.sha256);

  artifact::Provenance prov;
  prov.tool = "lowbit " LOWBIT_VERSION;
  prov.sources = sources;
  if (calib) prov.calibration_sha256 = calib->sha256;
  prov.seeds["quantize"] = o.seed;
  if (o.recipe.rotate) prov.seeds["rotation"] = o.seed;
  std::optional<ReuseBank> reuse;
  if (!o.reuse.empty()) reuse.emplace(o.reuse, prov);

  artifact::ArtifactWriter writer(o.destination, {o.shard_bytes, o.force});
  Quantizer quantizer(o, *model, writer, report, reuse ? &*reuse : nullptr);
  std::map<int64_t, std::vector<const model::NamedTensor*>> by_layer;
  for (const auto& t : model->tensors)
    if (const auto linear = layer_linear(model->desc, t.name)) by_layer[linear->layer].push_back(&t);
  if (goal)
    report.allocation = allocate_bits(o, *goal, *model, quantizer, by_layer, calib, cache_key);

  // Tensors outside the layers' linears first: embedding, norms, head, biases, a speech model's audio tower.
  uint64_t tower_weights = 0;
  for (const auto& t : tower) tower_weights += checked_numel(t.ref.shape, t.name);
  Progress progress("quantize", total_weights(*model) + tower_weights, "weights");
  for (const auto& t : model->tensors) {
    if (layer_linear(model->desc, t.name)) continue;
    progress.set_note(t.name);
    quantizer.encode(t, nullptr);
    progress.advance(checked_numel(t.ref.shape, t.name));
  }
  for (const auto& t : tower) {
    progress.set_note(t.name);
    quantizer.encode(t, nullptr);
    progress.advance(checked_numel(t.ref.shape, t.name));
  }

  std::optional<CachedCalibrator> calibrator;
  if (calib) calibrator.emplace(*model, *calib, open_calibration_cache(o, cache_key, "quantize", *calib));
  for (auto& [layer, tensors] : by_layer) {
    LayerHessians hessians;
    if (calibrator) {
      progress.set_note(fmt::format("calibrating layer {}", layer));  // the bar keeps ticking meanwhile
      hessians = calibrator->hessians(layer);
    }
    // The layer's quantized weights replace its dense ones so the next layer calibrates on them. The kernel owns
    // its encoding: the calibrator runs this layer only when the next one asks for its Hessians.
    for (const model::NamedTensor* t : tensors) {
      const LayerLinear linear = *layer_linear(model->desc, t->name);
      progress.set_note(t->name);
      codec::EncodedTensor stored =
          quantizer.encode(*t, calibrator ? hessians.for_linear(linear.input, linear.expert) : nullptr);
      if (calibrator) {
        report.tensors.back().calibration_rows = static_cast<int64_t>(hessians.rows(linear.input, linear.expert));
        const std::string& codec_id = report.tensors.back().choice.codec;
        calibrator->stored(t->name, codec_id, stored);
        model->layers.at(static_cast<size_t>(layer)).linear_slot(linear.role, linear.expert) =
            kernels::prepare_cpu_owned(codec::codec_or_throw(codec_id, t->name), t->ref.shape, std::move(stored));
      }
      progress.advance(checked_numel(t->ref.shape, t->name));
    }
    if (calibrator) calibrator->finish_layer(layer);
  }
  progress.finish();
  if (calibrator) {
    report_calibration_cache(o, calibrator->stats(), "quantize");
    report.calibration_cache = {{"directory", o.calib_cache ? nlohmann::json(o.calib_cache->string()) : nlohmann::json()},
                                {"layers_reused", calibrator->stats().reused},
                                {"layers_computed", calibrator->stats().computed},
                                {"entries_rejected", calibrator->stats().rejected},
                                {"seconds_saved", calibrator->stats().seconds_saved},
                                {"seconds_spent", calibrator->stats().seconds_spent}};
  }

  writer.set_config(model::config_to_hf_json(model->config));
  if (speech) {  // the audio encoder's configuration is only in the source's files (model::load_speech_model)
    writer.add_file(o.source / "config.json", artifact::FileRole::config);
    if (fs::is_regular_file(o.source / "preprocessor_config.json"))
      writer.add_file(o.source / "preprocessor_config.json", artifact::FileRole::other);
  } else if (const auto mlx = mlx_config(model::config_to_hf_json(model->config), report)) {
    writer.add_file_contents("config.json", artifact::FileRole::config, mlx->dump(2) + "\n");
  }
  for (const auto& f : tokenizer_files(o)) writer.add_file(f, artifact::FileRole::tokenizer);
  if (const auto gguf = gguf_tokenizer_source(o))
    for (const auto& f : model::gguf_tokenizer_files(io::GgufFile::open(*gguf)))
      writer.add_file_contents(f.name, artifact::FileRole::tokenizer, f.contents);
  if (reuse) {
    std::fprintf(stderr, "[quantize] reused %lld tensors from %zu --reuse artifacts\n",
                 static_cast<long long>(reuse->taken()), o.reuse.size());
    for (auto& s : reuse->used_sources()) prov.sources.push_back(std::move(s));
  }
  writer.set_provenance(prov);
  writer.set_recipe({{"quantize", o.recipe.to_json()}});
  // quality.json gives the artifact's whole size, itself and the manifest included (the writer settles it).
  writer.commit([&](uint64_t artifact_bytes) {
    report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    report.peak_rss = peak_rss_bytes();
    report.peak_resident = peak_resident();
    report.artifact_bytes = artifact_bytes;
    return nlohmann::json{{"quantize", report.to_json()}};
  });
  return report;
}

}  // namespace lowbit::quant
