// Qwen3-ASR (speech.h): the loader of transformers' qwen3_asr directories, the audio encoder, transcription.
// The encoder's layers are a family.h description (family/qwen3_asr_encoder.cpp) run by the CPU interpreter,
// one attention window per pass; the text decoder is an ordinary Qwen3 model fed embeddings whose audio
// placeholder rows are the encoder's output.
#include "lowbit/model/speech.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <numbers>
#include <set>

#include "family/qwen3_asr_encoder.h"
#include "json_fields.h"
#include "lowbit/artifact/foreign.h"
#include "lowbit/artifact/phonon.h"
#include "lowbit/core/error.h"
#include "lowbit/core/thread_pool.h"
#include "lowbit/io/json.h"
#include "lowbit/io/safetensors.h"
#include "lowbit/model/artifact_model.h"
#include "lowbit/model/cuda_model.h"
#include "lowbit/model/family.h"
#include "lowbit/model/foreign_model.h"
#include "lowbit/model/hf.h"

namespace lowbit::model {

#if LOWBIT_WITH_CUDA
// src/model/cuda/cuda_speech.cpp
std::shared_ptr<AudioEncoderDevice> make_cuda_audio_encoder(const SpeechModel& sm);
#endif

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr uint64_t kMaxJsonBytes = 16 << 20;
constexpr int64_t kMaxDim = int64_t{1} << 20;
constexpr std::string_view kLanguageModel = "model.language_model.";

// Where a checkpoint keeps the encoder's tensors: transformers' qwen3_asr, or mlx_audio's (Phonon directories).
struct Layout {
  std::string_view tower;         // conv2d1..3, conv_out, layers.N.*, ln_post
  std::string_view proj1, proj2;  // the projector's linears
  bool mlx_conv;                  // conv weights stored [out, kh, kw, in] (MLX) rather than [out, in, kh, kw]
};
constexpr Layout kHfLayout{"model.audio_tower.", "model.multi_modal_projector.linear_1",
                           "model.multi_modal_projector.linear_2", false};
constexpr Layout kMlxLayout{"audio_tower.", "audio_tower.proj1", "audio_tower.proj2", true};

int64_t int_field(const json& j, const char* key, int64_t fallback, int64_t lo, int64_t hi, std::string_view source) {
  if (!j.contains(key)) return fallback;
  const json& v = j.at(key);
  if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > hi)
    fail(Errc::format, "[load_speech_model] {}: audio_config.{} must be an integer in [{}, {}]", source, key, lo, hi);
  return v.get<int64_t>();
}

float gelu_erf(float x) { return 0.5f * x * (1.0f + std::erf(x / std::numbers::sqrt2_v<float>)); }

// LayerNorm of each row of x [m, n] in place.
void layer_norm_rows(float* x, int64_t m, int64_t n, const std::vector<float>& w, const std::vector<float>& b,
                     float eps) {
  for (int64_t r = 0; r < m; ++r) {
    float* row = x + r * n;
    float mean = 0.0f, var = 0.0f;
    for (int64_t j = 0; j < n; ++j) mean += row[j];
    mean /= static_cast<float>(n);
    for (int64_t j = 0; j < n; ++j) var += (row[j] - mean) * (row[j] - mean);
    const float inv = 1.0f / std::sqrt(var / static_cast<float>(n) + eps);
    for (int64_t j = 0; j < n; ++j)
      row[j] = (row[j] - mean) * inv * w[static_cast<size_t>(j)] + b[static_cast<size_t>(j)];
  }
}

void add_bias(float* y, int64_t m, const std::vector<float>& bias) {
  const auto n = static_cast<int64_t>(bias.size());
  for (int64_t r = 0; r < m; ++r)
    for (int64_t j = 0; j < n; ++j) y[r * n + j] += bias[static_cast<size_t>(j)];
}

// out [(h + 1) / 2, (w + 1) / 2, co] = gelu(conv2d(in [h, w, ci], weight, stride 2, padding 1) + bias), channels
// last: the 3x3 patches of the input (zeros beyond its edges) as rows [i * 9 + ky * 3 + kx] times the weight.
std::vector<float> conv_gelu(const std::vector<float>& in, int64_t ci, int64_t h, int64_t w,
                             const kernels::CpuLinear& weight, const std::vector<float>& bias, ThreadPool& pool) {
  const auto co = static_cast<int64_t>(bias.size());
  const int64_t oh = (h - 1) / 2 + 1, ow = (w - 1) / 2 + 1, k = ci * 9;
  std::vector<float> patches(static_cast<size_t>(oh * ow * k), 0.0f);
  for (int64_t y = 0; y < oh; ++y)
    for (int64_t x = 0; x < ow; ++x) {
      float* p = patches.data() + (y * ow + x) * k;
      for (int64_t ky = 0; ky < 3; ++ky) {
        const int64_t iy = 2 * y + ky - 1;
        if (iy < 0 || iy >= h) continue;
        for (int64_t kx = 0; kx < 3; ++kx) {
          const int64_t ix = 2 * x + kx - 1;
          if (ix < 0 || ix >= w) continue;
          const float* src = in.data() + (iy * w + ix) * ci;
          for (int64_t i = 0; i < ci; ++i) p[i * 9 + ky * 3 + kx] = src[i];
        }
      }
    }
  std::vector<float> out(static_cast<size_t>(oh * ow * co));
  weight.matmul(patches.data(), oh * ow, out.data(), pool);
  add_bias(out.data(), oh * ow, bias);
  for (float& v : out) v = gelu_erf(v);
  return out;
}

// The encoder's tensors, each taken once and checked against the shape the description gives it.
class Tensors {
 public:
  Tensors(std::map<std::string, codec::TensorRef> refs, std::string source)
      : refs_(std::move(refs)), source_(std::move(source)) {}

  codec::TensorRef ref(const std::string& name, const Shape& shape) {
    const auto it = refs_.find(name);
    if (it == refs_.end()) fail(Errc::format, "[load_speech_model] {}: tensor '{}' is missing", source_, name);
    if (!taken_.insert(name).second) fail(Errc::internal, "[load_speech_model] tensor '{}' taken twice", name);
    if (it->second.shape != shape)
      fail(Errc::shape, "[load_speech_model] {}: tensor '{}' has shape [{}], the config gives [{}]", source_, name,
           fmt::join(it->second.shape, ", "), fmt::join(shape, ", "));
    codec::validate_tensor(it->second, "load_speech_model");
    return it->second;
  }
  std::vector<float> values(const std::string& name, const Shape& shape) { return codec::decode_all(ref(name, shape)); }
  // Errc::format naming the first tensor no description took.
  void check_all_taken() const {
    for (const auto& [name, ref] : refs_)
      if (!taken_.contains(name))
        fail(Errc::format, "[load_speech_model] {}: tensor '{}' is not part of a Qwen3-ASR model", source_, name);
  }

 private:
  std::map<std::string, codec::TensorRef> refs_;
  std::string source_;
  std::set<std::string> taken_;
};

// [out, kh, kw, in] -> [out, in, kh, kw]
std::vector<float> from_mlx_conv(const std::vector<float>& w, int64_t out, int64_t in) {
  std::vector<float> t(w.size());
  for (int64_t o = 0; o < out; ++o)
    for (int64_t k = 0; k < 9; ++k)
      for (int64_t i = 0; i < in; ++i)
        t[static_cast<size_t>((o * in + i) * 9 + k)] = w[static_cast<size_t>((o * 9 + k) * in + i)];
  return t;
}

// sin | cos of position * 10000^(-i / (channels / 2 - 1)), as transformers' SinusoidsPositionEmbedding.
std::vector<float> sinusoids(int64_t length, int64_t channels) {
  const int64_t half = channels / 2;
  const double increment = std::log(10000.0) / static_cast<double>(half - 1);
  std::vector<float> out(static_cast<size_t>(length * channels));
  for (int64_t i = 0; i < half; ++i) {
    const auto inv = static_cast<float>(std::exp(-increment * static_cast<double>(i)));
    for (int64_t t = 0; t < length; ++t) {
      const float angle = static_cast<float>(t) * inv;
      out[static_cast<size_t>(t * channels + i)] = std::sin(angle);
      out[static_cast<size_t>(t * channels + half + i)] = std::cos(angle);
    }
  }
  return out;
}

void load_encoder(SpeechModel& sm, Tensors& t, const Layout& layout) {
  const AudioEncoderConfig& a = sm.audio;
  const std::string tower(layout.tower);
  // The tensor `name`, recorded in encoder_tensors under `key`.
  const auto take = [&](const std::string& key, const std::string& name, const Shape& shape) {
    return sm.encoder_tensors.insert_or_assign(key, t.ref(name, shape)).first->second;
  };
  for (size_t i = 0; i < 3; ++i) {
    const std::string conv = fmt::format("{}conv2d{}.", tower, i + 1);
    const int64_t in = i == 0 ? 1 : a.conv_channels, out = a.conv_channels;
    sm.conv_weight[i] = layout.mlx_conv ? from_mlx_conv(t.values(conv + "weight", {out, 3, 3, in}), out, in)
                                        : t.values(conv + "weight", {out, in, 3, 3});
    sm.conv_bias[i] = t.values(conv + "bias", {out});
    sm.conv[i] = kernels::prepare_cpu(dense_f32_ref({out, in * 9}, sm.conv_weight[i]));
  }
  sm.conv_out = kernels::prepare_cpu(
      take("conv_out.weight", tower + "conv_out.weight", {a.d_model, a.conv_channels * a.conv_freq()}));
  sm.encoder.config = audio_encoder_config(a);
  sm.encoder.desc = describe_audio_encoder(a);
  sm.encoder.layers.resize(static_cast<size_t>(a.layers));
  for (int64_t l = 0; l < a.layers; ++l)
    for (const TensorSpec& spec : sm.encoder.desc.layers[static_cast<size_t>(l)].tensors) {
      const std::string name = fmt::format("{}layers.{}.{}", tower, l, spec.hf);
      LayerWeights& w = sm.encoder.layers[static_cast<size_t>(l)];
      const int64_t rows = dim_size(spec.rows, sm.encoder.config);
      if (spec.linear()) {
        w.linear_slot(spec.role) =
            kernels::prepare_cpu(take(hf_tensor_name(l, spec), name, {rows, dim_size(spec.cols, sm.encoder.config)}));
      } else {
        w.vectors[static_cast<size_t>(spec.role)] = codec::decode_all(take(hf_tensor_name(l, spec), name, {rows}));
      }
    }
  sm.ln_post_weight = codec::decode_all(take(std::string(kFinalNormTensor), tower + "ln_post.weight", {a.d_model}));
  sm.ln_post_bias = codec::decode_all(take(std::string(kFinalNormBiasTensor), tower + "ln_post.bias", {a.d_model}));
  const std::string proj1(layout.proj1), proj2(layout.proj2);
  sm.proj1 = kernels::prepare_cpu(take("proj1.weight", proj1 + ".weight", {a.d_model, a.d_model}));
  sm.proj1_bias = codec::decode_all(take("proj1.bias", proj1 + ".bias", {a.d_model}));
  sm.proj2 = kernels::prepare_cpu(take("proj2.weight", proj2 + ".weight", {a.output_dim, a.d_model}));
  sm.proj2_bias = codec::decode_all(take("proj2.bias", proj2 + ".bias", {a.output_dim}));
  t.check_all_taken();
  sm.positions = sinusoids(a.positions, a.d_model);
}

int32_t token_field(const json& config, const char* key, int32_t fallback, std::string_view source) {
  if (!config.contains(key)) return fallback;
  const json& v = config.at(key);
  if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
    fail(Errc::format, "[load_speech_model] {}: {} must be a token id", source, key);
  return v.get<int32_t>();
}

}  // namespace

int64_t AudioEncoderConfig::conv_tokens(int64_t frames) {
  for (int i = 0; i < 3; ++i) frames = frames > 0 ? (frames - 1) / 2 + 1 : 0;
  return frames;
}

AudioEncoderConfig parse_audio_encoder_config(const json& j, std::string_view source) {
  if (!j.is_object()) fail(Errc::format, "[load_speech_model] {}: audio_config is not an object", source);
  AudioEncoderConfig a;
  a.mel_bins = int_field(j, "num_mel_bins", a.mel_bins, 1, 1024, source);
  a.layers = int_field(j, "encoder_layers", a.layers, 1, 1024, source);
  a.heads = int_field(j, "encoder_attention_heads", a.heads, 1, 1024, source);
  a.ffn_dim = int_field(j, "encoder_ffn_dim", a.ffn_dim, 1, kMaxDim, source);
  a.d_model = int_field(j, "d_model", a.d_model, 4, kMaxDim, source);
  a.output_dim = int_field(j, "output_dim", a.output_dim, 1, kMaxDim, source);
  a.conv_channels = int_field(j, "downsample_hidden_size", a.conv_channels, 1, 8192, source);
  a.n_window = int_field(j, "n_window", a.n_window, 1, 1 << 16, source);
  a.n_window_infer = int_field(j, "n_window_infer", a.n_window_infer, 1, 1 << 24, source);
  a.positions = int_field(j, "max_position_embeddings", a.positions, 1, 1 << 16, source);
  if (a.d_model % a.heads != 0 || a.d_model % 2 != 0)
    fail(Errc::format,
         "[load_speech_model] {}: audio_config.d_model {} is not an even multiple of "
         "encoder_attention_heads {}",
         source, a.d_model, a.heads);
  if (a.n_window_infer % a.chunk_frames() != 0)
    fail(Errc::format, "[load_speech_model] {}: audio_config.n_window_infer {} is not a multiple of 2 * n_window {}",
         source, a.n_window_infer, a.chunk_frames());
  if (a.positions < AudioEncoderConfig::conv_tokens(a.chunk_frames()))
    fail(Errc::format,
         "[load_speech_model] {}: audio_config.max_position_embeddings {} is less than the {} tokens "
         "of a chunk",
         source, a.positions, AudioEncoderConfig::conv_tokens(a.chunk_frames()));
  if (j.contains("activation_function") && j.at("activation_function") != "gelu")
    fail(Errc::unsupported, "[load_speech_model] {}: audio_config.activation_function {} (gelu expected)", source,
         j.at("activation_function").dump());
  if (j.contains("scale_embedding") && j.at("scale_embedding") != false)
    fail(Errc::unsupported, "[load_speech_model] {}: audio_config.scale_embedding must be false", source);
  return a;
}

bool is_qwen3_asr_checkpoint(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_regular_file(dir / "config.json", ec) || fs::exists(dir / "manifest.json", ec)) return false;
  const json config = io::read_json_file(dir / "config.json", "load_speech_model", kMaxJsonBytes);
  return config.is_object() && config.value("model_type", json()) == "qwen3_asr";
}

SpeechCheckpoint load_qwen3_asr_checkpoint(const fs::path& dir, const LoadOptions& options) {
  const std::string source = (dir / "config.json").string();
  const json config = io::read_json_file(dir / "config.json", "load_speech_model", kMaxJsonBytes);
  if (!config.is_object() || !config.contains("text_config") || !config.at("text_config").is_object())
    fail(Errc::format, "[load_speech_model] {}: text_config is missing or not an object", source);
  json text = config.at("text_config");
  if (!text.contains("model_type")) text["model_type"] = "qwen3";
  if (config.contains("eos_token_id") && !text.contains("eos_token_id")) text["eos_token_id"] = config["eos_token_id"];
  const ModelConfig c = parse_hf_config(text, source);
  auto ckpt = std::make_shared<io::SafetensorsCheckpoint>(io::SafetensorsCheckpoint::open(dir));
  ModelBuilder b;
  b.keep_alive(ckpt);
  SpeechCheckpoint out;
  for (const std::string& name : ckpt->names()) {
    codec::TensorRef ref = dense_view_ref(ckpt->tensor(name), name, source);
    if (name.starts_with(kLanguageModel)) {
      b.add("model." + name.substr(kLanguageModel.size()), std::move(ref));
    } else if (name == kLmHeadTensor) {
      if (!c.tied_embeddings) b.add(name, std::move(ref));  // some exports store the tied copy too
    } else {
      out.tower.push_back({name, std::move(ref), nullptr});
    }
  }
  out.decoder = b.finish(c, dir.string(), options);
  return out;
}

std::unique_ptr<SpeechModel> load_speech_model(const fs::path& dir, std::string_view device) {
  if (device != "cpu" && device != "cuda") fail(Errc::usage, "[--device] '{}': expected cpu or cuda", device);
  const LoadOptions load{.cpu_only = device == "cpu"};
  const fs::path config_path = dir / "config.json";
  const std::string source = config_path.string();
  const json config = io::read_json_file(config_path, "load_speech_model", kMaxJsonBytes);
  if (!config.is_object()) fail(Errc::format, "[load_speech_model] {}: not a JSON object", source);
  const artifact::ForeignFormat* foreign = artifact::find_foreign_format(dir);
  if (foreign ? foreign->name != artifact::phonon::kFormatName : config.value("model_type", json()) != "qwen3_asr")
    fail(
        Errc::unsupported,
        "[load_speech_model] {}: neither a transformers qwen3_asr directory (nor an artifact quantized from one) nor a "
        "Phonon one",
        source);
  // mlx_audio's configs (Phonon) may nest the model's sections in thinker_config
  const json& top = config.contains("thinker_config") && config.at("thinker_config").is_object()
                        ? config.at("thinker_config")
                        : config;
  auto sm = std::make_unique<SpeechModel>();
  sm->audio = parse_audio_encoder_config(top.value("audio_config", json::object()), source);
  sm->audio_token = token_field(top, "audio_token_id", sm->audio_token, source);
  if (const fs::path pre = dir / "preprocessor_config.json"; fs::is_regular_file(pre))
    sm->mel = parse_mel_options(io::read_json_file(pre, "load_speech_model", kMaxJsonBytes), pre.string());
  if (sm->mel.bins != sm->audio.mel_bins || sm->mel.chunk_frames != sm->audio.chunk_frames())
    fail(Errc::format,
         "[load_speech_model] {}: the feature extractor's {} bins and {}-frame chunks differ from "
         "audio_config's {} and {}",
         source, sm->mel.bins, sm->mel.chunk_frames, sm->audio.mel_bins, sm->audio.chunk_frames());

  if (foreign) {
    // The Phonon reader's checks, its text decoder (two-plane linears), and the audio tower it leaves to us.
    auto opened = std::make_shared<artifact::ForeignModel>(foreign->open(dir, {}));
    std::map<std::string, codec::TensorRef> tower;
    for (const auto& [name, ref] : opened->tensors)
      if (name.starts_with(kMlxLayout.tower)) tower.emplace(name, ref);
    Tensors t(std::move(tower), source);
    load_encoder(*sm, t, kMlxLayout);
    sm->keep_alive.push_back(opened);
    sm->decoder = build_foreign_model(opened, dir.string(), load);
  } else if (fs::exists(dir / "manifest.json")) {
    // A lowbit artifact quantized from a qwen3_asr checkpoint: the decoder under model.*, the tower under HF names.
    auto art = std::make_shared<artifact::Artifact>(artifact::Artifact::open(dir));
    std::map<std::string, codec::TensorRef> tower;
    for (const std::string& name : art->tensor_names())
      if (!is_decoder_tensor_name(name)) tower.emplace(name, art->tensor(name));
    Tensors t(std::move(tower), source);
    load_encoder(*sm, t, kHfLayout);
    sm->keep_alive.push_back(art);
    sm->decoder = load_artifact_model(art, dir, load);
  } else {
    SpeechCheckpoint ckpt = load_qwen3_asr_checkpoint(dir, load);
    std::map<std::string, codec::TensorRef> tower;
    for (NamedTensor& n : ckpt.tower) tower.emplace(n.name, n.ref);
    Tensors t(std::move(tower), source);
    load_encoder(*sm, t, kHfLayout);
    sm->decoder = std::move(ckpt.decoder);
  }
  ModelConfig& c = sm->decoder->config;
  if (sm->audio.output_dim != c.dim)
    fail(Errc::format, "[load_speech_model] {}: audio_config.output_dim {} differs from the text decoder's width {}",
         source, sm->audio.output_dim, c.dim);
  if (const fs::path gen = dir / "generation_config.json"; fs::is_regular_file(gen)) {
    const json g = io::read_json_file(gen, "load_speech_model", kMaxJsonBytes);
    if (g.contains("eos_token_id")) c.eos_ids = json_ids(g, "eos_token_id", gen.string());
  }
  if (device == "cuda") {
    use_device(*sm->decoder, device);  // Errc::usage in a build without CUDA
#if LOWBIT_WITH_CUDA
    sm->encoder_device = make_cuda_audio_encoder(*sm);
#endif
  }
  return sm;
}

EncoderPlan plan_encoder(const AudioEncoderConfig& a, const LogMel& mel) {
  const int64_t chunk = a.chunk_frames();
  if (mel.bins != a.mel_bins || mel.padded_frames % chunk != 0 || mel.frames < 1 || mel.frames > mel.padded_frames)
    fail(Errc::shape, "[encode_audio] features [{}, {}] with {} valid frames for {} bins in chunks of {}", mel.bins,
         mel.padded_frames, mel.frames, a.mel_bins, chunk);
  EncoderPlan plan;
  int64_t longest = 0;  // the most tokens of one chunk
  for (int64_t i = 0; i < mel.padded_frames / chunk; ++i) {
    plan.tokens.push_back(AudioEncoderConfig::conv_tokens(std::clamp<int64_t>(mel.frames - i * chunk, 0, chunk)));
    longest = std::max(longest, plan.tokens.back());
    plan.total += plan.tokens.back();
  }
  plan.window = longest * (a.n_window_infer / chunk);
  return plan;
}

std::vector<float> encode_audio(const SpeechModel& sm, const LogMel& mel, ThreadPool& pool) {
  const AudioEncoderConfig& a = sm.audio;
  const EncoderPlan plan = plan_encoder(a, mel);
  if (sm.encoder_device) return sm.encoder_device->encode(mel);
  const int64_t chunk = a.chunk_frames(), d = a.d_model, ch = a.conv_channels, tokens = plan.total;
  std::vector<float> x(static_cast<size_t>(tokens * d));
  int64_t row = 0;
  for (size_t i = 0; i < plan.tokens.size(); ++i) {
    const int64_t n = plan.tokens[i];
    if (n == 0) continue;
    // the chunk [bins, chunk frames] with one channel
    std::vector<float> in(static_cast<size_t>(mel.bins * chunk));
    for (int64_t b = 0; b < mel.bins; ++b)
      std::copy_n(mel.values.data() + b * mel.padded_frames + static_cast<int64_t>(i) * chunk, chunk,
                  in.data() + b * chunk);
    int64_t h = mel.bins, w = chunk, ci = 1;
    for (size_t k = 0; k < 3; ++k) {
      in = conv_gelu(in, ci, h, w, *sm.conv[k], sm.conv_bias[k], pool);
      h = (h - 1) / 2 + 1, w = (w - 1) / 2 + 1, ci = ch;
    }
    // rows [n, ch * freq] from [freq, time, ch]: time steps, each the channels' frequency columns in turn
    std::vector<float> rows(static_cast<size_t>(n * ch * h));
    for (int64_t t = 0; t < n; ++t)
      for (int64_t c = 0; c < ch; ++c)
        for (int64_t f = 0; f < h; ++f)
          rows[static_cast<size_t>((t * ch + c) * h + f)] = in[static_cast<size_t>((f * w + t) * ch + c)];
    float* out = x.data() + row * d;
    sm.conv_out->matmul(rows.data(), n, out, pool);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < d; ++j) out[t * d + j] += sm.positions[static_cast<size_t>(t * d + j)];
    row += n;
  }
  for (int64_t start = 0; start < tokens; start += plan.window) {
    const int64_t n = std::min(plan.window, tokens - start);
    KvCache cache(sm.encoder.config, n);
    forward_layers(sm.encoder, cache, x.data() + start * d, n, 0, 0, a.layers, pool);
  }
  layer_norm_rows(x.data(), tokens, d, sm.ln_post_weight, sm.ln_post_bias, sm.encoder.config.norm_eps);
  std::vector<float> hidden(static_cast<size_t>(tokens * d)), out(static_cast<size_t>(tokens * a.output_dim));
  sm.proj1->matmul(x.data(), tokens, hidden.data(), pool);
  add_bias(hidden.data(), tokens, sm.proj1_bias);
  for (float& v : hidden) v = gelu_erf(v);
  sm.proj2->matmul(hidden.data(), tokens, out.data(), pool);
  add_bias(out.data(), tokens, sm.proj2_bias);
  return out;
}

std::vector<AudioChunk> split_audio(std::span<const float> wav, int64_t rate, double chunk_seconds) {
  const auto total = static_cast<int64_t>(wav.size());
  const auto max_chunk = static_cast<int64_t>(chunk_seconds * static_cast<double>(rate));
  if (max_chunk < 1) fail(Errc::usage, "[split_audio] chunks of {} s hold no sample at {} Hz", chunk_seconds, rate);
  const int64_t search = 5 * rate, window = rate / 10;  // search_expand_sec 5, min_window_ms 100
  std::vector<AudioChunk> out;
  int64_t start = 0;
  while (start < total) {
    const int64_t end = std::min(start + max_chunk, total);
    if (end >= total) {
      out.push_back({start, total});
      break;
    }
    // the lowest mean energy over `window` samples within `search` of the cut, taking the first minimum
    const int64_t lo = std::max(start, end - search), hi = std::min(total, end + search);
    int64_t cut = end;
    if (hi - lo > window) {
      double best = HUGE_VAL;
      int64_t best_at = 0;
      for (int64_t i = 0; i + window <= hi - lo; ++i) {
        double sum = 0;
        for (int64_t j = 0; j < window; ++j) {
          const double v = wav[static_cast<size_t>(lo + i + j)];
          sum += v * v;
        }
        if (sum / static_cast<double>(window) < best) best = sum / static_cast<double>(window), best_at = i;
      }
      cut = lo + best_at + window / 2;
    }
    cut = std::max(cut, start + rate);  // at least a second
    out.push_back({start, cut});
    start = cut;
  }
  return out;
}

namespace {

Transcript transcribe_one(const SpeechModel& sm, const Tokenizer& tokenizer, std::span<const float> samples,
                          const TranscribeOptions& options, Sampler& sampler, ThreadPool& pool) {
  using Clock = std::chrono::steady_clock;
  const auto seconds = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  };
  Transcript out;
  const auto t0 = Clock::now();
  const LogMel mel = log_mel(samples, sm.mel);
  const auto t1 = Clock::now();
  const std::vector<float> audio = encode_audio(sm, mel, pool);
  const auto t2 = Clock::now();
  const Model& dec = *sm.decoder;
  out.audio_tokens = static_cast<int64_t>(audio.size()) / dec.config.dim;
  out.features_seconds = seconds(t0, t1);
  out.encoder_seconds = seconds(t1, t2);

  // mlx_audio's prompt (the original implementation's): an empty system turn, the audio, the assistant turn
  std::string prompt = "<|im_start|>system\n<|im_end|>\n<|im_start|>user\n<|audio_start|>";
  for (int64_t i = 0; i < out.audio_tokens; ++i) prompt += "<|audio_pad|>";
  prompt += "<|audio_end|><|im_end|>\n<|im_start|>assistant\n";
  if (options.language) prompt += fmt::format("language {}<asr_text>", *options.language);
  const std::vector<int32_t> ids = tokenizer.encode(prompt, false, true);
  out.prompt_tokens = static_cast<int64_t>(ids.size());
  std::vector<float> x = embed(dec, ids);
  int64_t placed = 0;
  for (size_t j = 0; j < ids.size(); ++j)
    if (ids[j] == sm.audio_token) {
      if (placed == out.audio_tokens) break;
      std::copy_n(audio.data() + placed * dec.config.dim, dec.config.dim, x.data() + j * dec.config.dim);
      ++placed;
    }
  if (placed != out.audio_tokens || std::count(ids.begin(), ids.end(), sm.audio_token) != out.audio_tokens)
    fail(Errc::format, "[transcribe] the tokenizer encodes <|audio_pad|> as other ids than the model's audio token {}",
         sm.audio_token);
  const int64_t capacity = out.prompt_tokens + options.max_tokens;
  if (capacity > dec.config.max_seq)
    fail(Errc::limit, "[transcribe] {} prompt tokens and up to {} more exceed the model's context of {}",
         out.prompt_tokens, options.max_tokens, dec.config.max_seq);
  KvCache cache(dec.config, capacity);
  std::set<int32_t> eos(dec.config.eos_ids.begin(), dec.config.eos_ids.end());
  for (int32_t id : tokenizer.eos_ids()) eos.insert(id);
  std::vector<float> logits(static_cast<size_t>(dec.config.vocab));
  forward_embeddings(dec, cache, std::move(x), 0, logits.data(), false, pool);
  const auto t3 = Clock::now();
  out.prefill_seconds = seconds(t2, t3);
  int64_t pos = out.prompt_tokens;
  std::vector<int32_t> history = ids;  // the sampler's repeat penalty looks back over prompt and output
  while (static_cast<int64_t>(out.token_ids.size()) < options.max_tokens) {
    const int32_t next = sampler.sample(logits, history);
    if (eos.contains(next)) break;
    out.token_ids.push_back(next);
    history.push_back(next);
    if (static_cast<int64_t>(out.token_ids.size()) == options.max_tokens) break;
    forward(dec, cache, std::span(&next, 1), pos++, logits.data(), false, pool);
  }
  out.decode_seconds = seconds(t3, Clock::now());
  out.text = tokenizer.decode(out.token_ids);
  return out;
}

}  // namespace

Transcript transcribe(const SpeechModel& sm, const Tokenizer& tokenizer, std::span<const float> samples,
                      const TranscribeOptions& options, ThreadPool& pool) {
  const std::vector<AudioChunk> chunks = split_audio(samples, sm.mel.sample_rate, options.chunk_seconds);
  Sampler sampler(options.sampler);
  if (chunks.size() == 1) return transcribe_one(sm, tokenizer, samples, options, sampler, pool);
  // mlx_audio's generate: the chunks in turn, each zero-padded to a second, sharing max_tokens; texts joined by
  // spaces
  Transcript out;
  for (const AudioChunk& c : chunks) {
    if (static_cast<int64_t>(out.token_ids.size()) >= options.max_tokens) break;
    std::vector<float> wav(samples.begin() + c.begin, samples.begin() + c.end);
    wav.resize(std::max<size_t>(wav.size(), static_cast<size_t>(sm.mel.sample_rate)), 0.0f);
    TranscribeOptions o = options;
    o.max_tokens = options.max_tokens - static_cast<int64_t>(out.token_ids.size());
    const Transcript t = transcribe_one(sm, tokenizer, wav, o, sampler, pool);
    out.text += (out.text.empty() ? "" : " ") + t.text;
    out.token_ids.insert(out.token_ids.end(), t.token_ids.begin(), t.token_ids.end());
    out.audio_tokens += t.audio_tokens;
    out.prompt_tokens += t.prompt_tokens;
    out.features_seconds += t.features_seconds;
    out.encoder_seconds += t.encoder_seconds;
    out.prefill_seconds += t.prefill_seconds;
    out.decode_seconds += t.decode_seconds;
  }
  return out;
}

}  // namespace lowbit::model
