// The family table, and what every family shares: the config.json fields and GGUF metadata common to all, the
// layer prefixes of tensor names, role names and the sizes tensor shapes are written in. Everything that
// differs between families is in its file under src/model/family/.
#include "lowbit/model/family.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <numbers>

#include <fmt/format.h>

#include "json_fields.h"
#include "lowbit/core/error.h"
#include "lowbit/io/gguf.h"

namespace lowbit::model {

extern const Family kLlamaFamily;
extern const Family kMistralFamily;
extern const Family kQwen2Family;
extern const Family kQwen3Family;
extern const Family kGemma2Family;
extern const Family kGemma3Family;
extern const Family kPhi3Family;
extern const Family kQwen3MoeFamily;
extern const Family kMixtralFamily;

namespace {

constexpr std::array<const Family*, 9> kFamilies{&kLlamaFamily, &kMistralFamily,  &kQwen2Family,
                                                 &kQwen3Family, &kGemma2Family,   &kGemma3Family,
                                                 &kPhi3Family,  &kQwen3MoeFamily, &kMixtralFamily};

constexpr std::string_view kHfLayerPrefix = "model.layers.";
constexpr std::string_view kGgufLayerPrefix = "blk.";

constexpr std::array<std::string_view, kRoleCount> kRoleNames{
    "attn_norm", "attn_norm_bias", "q",      "k",           "v",         "qkv",        "q_bias",
    "k_bias",    "v_bias",         "q_norm", "k_norm",      "o",         "o_bias",     "post_attn_norm",
    "ffn_norm",  "ffn_norm_bias",  "gate",   "up",          "gate_up",   "down",       "down_bias",
    "up_bias",   "post_ffn_norm",  "router", "expert_gate", "expert_up", "expert_down"};

bool names(const Family& f, std::string_view name) {
  if (name == f.name || name == f.hf_class) return true;
  for (std::string_view alias : f.hf_aliases)
    if (alias == name) return true;
  return false;
}

int64_t gguf_required(const io::GgufFile& f, const std::string& key) {
  const auto v = f.get_uint(key);
  if (!v) fail(Errc::format, "[gguf] {}: metadata '{}' is missing", f.source(), key);
  if (*v > (1ull << 40)) fail(Errc::limit, "[gguf] {}: metadata '{}' is {}", f.source(), key, *v);
  return static_cast<int64_t>(*v);
}

int64_t gguf_optional(const io::GgufFile& f, const std::string& key, int64_t fallback) {
  return f.get_uint(key) ? gguf_required(f, key) : fallback;
}

std::optional<int32_t> gguf_token_id(const io::GgufFile& f, const std::string& key, size_t n_tokens) {
  const auto v = f.get_uint(key);
  if (!v) return std::nullopt;
  if (*v >= n_tokens)
    fail(Errc::format, "[gguf] {}: {} = {} is outside the vocabulary of {}", f.source(), key, *v, n_tokens);
  return static_cast<int32_t>(*v);
}

// llama.cpp stores Llama-3.1-style RoPE scaling not as parameters but as a tensor of per-frequency divisors
// (rope_freqs.weight, [head_dim / 2]). The parameters are recovered by checking every divisor against HF's
// "llama3" rule with the factor read off the lowest frequency and the usual band (low 1, high 4).
RopeScaling llama3_from_rope_freqs(const io::GgufFile& f, const io::GgufTensorInfo& t, const ModelConfig& c,
                                   const std::string& arch) {
  const std::vector<float> divisors = f.dequantize(t);
  if (static_cast<int64_t>(divisors.size()) * 2 != c.head_dim)
    fail(Errc::shape, "[gguf] {}: rope_freqs.weight has {} values for head_dim {}", f.source(), divisors.size(),
         c.head_dim);
  RopeScaling s;
  s.kind = RopeScaling::Kind::llama3;
  s.factor = divisors.back();
  s.low_freq_factor = 1.0;
  s.high_freq_factor = 4.0;
  const std::string ctx_key = arch + ".rope.scaling.original_context_length";
  if (const auto ctx = f.get_uint(ctx_key)) {
    s.original_max_position = static_cast<int64_t>(std::min<uint64_t>(*ctx, uint64_t{1} << 40));
  } else {
    // llama.cpp's converter does not write it; a divisor in the blended band gives it away: there
    // 1 / divisor = (1 - smooth) / factor + smooth, smooth = (ctx / wavelen - low) / (high - low).
    for (size_t i = 0; i < divisors.size(); ++i) {
      if (!(s.factor > 1.0 && divisors[i] > 1.0f + 1e-3f && divisors[i] < s.factor * (1.0 - 1e-3))) continue;
      const double smooth = (1.0 / divisors[i] - 1.0 / s.factor) / (1.0 - 1.0 / s.factor);
      const double wavelen =
          2 * std::numbers::pi * std::pow(c.rope_theta, 2.0 * static_cast<double>(i) / static_cast<double>(c.head_dim));
      s.original_max_position =
          std::llround(wavelen * (smooth * (s.high_freq_factor - s.low_freq_factor) + s.low_freq_factor));
      break;
    }
  }
  const double low_wavelen = s.original_max_position / s.low_freq_factor;
  const double high_wavelen = s.original_max_position / s.high_freq_factor;
  for (size_t i = 0; i < divisors.size(); ++i) {
    const double freq = 1.0 / std::pow(c.rope_theta, 2.0 * static_cast<double>(i) / static_cast<double>(c.head_dim));
    const double wavelen = 2 * std::numbers::pi / freq;
    double expected = 1.0;
    if (wavelen > low_wavelen) {
      expected = s.factor;
    } else if (wavelen >= high_wavelen) {
      const double smooth =
          (s.original_max_position / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      expected = 1.0 / ((1 - smooth) / s.factor + smooth);
    }
    if (std::abs(divisors[i] - expected) > 1e-3 * expected)
      fail(Errc::unsupported, "[gguf] {}: rope_freqs.weight[{}] = {} does not follow the llama3 RoPE scaling rule ({})",
           f.source(), i, divisors[i], expected);
  }
  return s;
}

RopeScaling gguf_rope_scaling(const io::GgufFile& f, const std::string& arch, const ModelConfig& c) {
  if (const auto* freqs = f.tensor("rope_freqs.weight")) return llama3_from_rope_freqs(f, *freqs, c, arch);
  RopeScaling s;
  const auto type = f.get_string(arch + ".rope.scaling.type");
  if (!type || *type == "none") return s;
  if (*type != "linear") fail(Errc::unsupported, "[gguf] {}: RoPE scaling '{}' is not supported", f.source(), *type);
  s.kind = RopeScaling::Kind::linear;
  s.factor = f.get_float(arch + ".rope.scaling.factor").value_or(1.0);
  return s;
}

}  // namespace

std::span<const Family* const> families() { return kFamilies; }

std::string known_families() {
  std::string known;
  for (const Family* f : kFamilies) known += (known.empty() ? "" : ", ") + std::string(f->name);
  return known;
}

std::string_view role_name(Role r) {
  return r < Role::count ? kRoleNames[static_cast<size_t>(r)] : std::string_view("none");
}

std::optional<LinearInput> linear_input(Role r) {
  switch (r) {
    case Role::q:
    case Role::k:
    case Role::v:
    case Role::qkv: return LinearInput::attn_in;
    case Role::o: return LinearInput::attn_out;
    case Role::gate:
    case Role::up:
    case Role::gate_up: return LinearInput::ffn_in;
    case Role::down: return LinearInput::ffn_mid;
    case Role::router: return LinearInput::ffn_in;
    case Role::expert_gate:
    case Role::expert_up: return LinearInput::expert_in;
    case Role::expert_down: return LinearInput::expert_mid;
    default: return std::nullopt;
  }
}

int64_t dim_size(Dim d, const ModelConfig& c) {
  switch (d) {
    case Dim::none: return 0;
    case Dim::dim: return c.dim;
    case Dim::q_dim: return c.q_dim();
    case Dim::kv_dim: return c.kv_dim();
    case Dim::qkv_dim: return c.q_dim() + 2 * c.kv_dim();
    case Dim::head_dim: return c.head_dim;
    case Dim::hidden: return c.hidden_dim;
    case Dim::gate_up_dim: return 2 * c.hidden_dim;
    case Dim::n_experts: return c.n_experts;
    case Dim::expert_hidden: return c.expert_hidden_dim;
  }
  fail(Errc::internal, "[dim_size] unknown dimension {}", static_cast<int>(d));
}

const TensorSpec* LayerDesc::find(Role r) const {
  for (const TensorSpec& t : tensors)
    if (t.role == r) return &t;
  return nullptr;
}

const Family& find_family_hf(const nlohmann::json& hf, std::string_view source) {
  const std::string model_type = json_string_or(hf, "model_type", "", source);
  for (const Family* f : kFamilies)
    if (!model_type.empty() && names(*f, model_type)) return *f;
  if (const auto it = hf.find("architectures"); it != hf.end() && it->is_array())
    for (const auto& cls : *it)
      for (const Family* f : kFamilies)
        if (cls.is_string() && names(*f, cls.get<std::string>())) return *f;
  fail(Errc::unsupported, "[load_model] {}: model_type '{}' is not supported (known: {})", source, model_type,
       known_families());
}

const Family& find_family_gguf(std::string_view arch, std::string_view source) {
  for (const Family* f : kFamilies)
    for (std::string_view a : f->gguf_archs)
      if (a == arch) return *f;
  fail(Errc::unsupported, "[gguf] {}: general.architecture '{}' is not supported (known: {})", source, arch,
       known_families());
}

const Family& family_of(const ModelConfig& c) {
  for (const Family* f : kFamilies)
    if (f->name == c.arch) return *f;
  fail(Errc::unsupported, "[load_model] config arch '{}' is not a known family (known: {})", c.arch, known_families());
}

ModelDesc describe_model(const ModelConfig& c, std::string_view source) {
  ModelDesc d = family_of(c).describe(c, source);
  if (static_cast<int64_t>(d.layers.size()) != c.n_layers)
    fail(Errc::internal, "[load_model] {}: the {} description has {} layers for n_layers {}", source, c.arch,
         d.layers.size(), c.n_layers);
  for (const LayerDesc& l : d.layers)
    if (l.attention.rope < 0 || static_cast<size_t>(l.attention.rope) >= d.rope_inv_freq.size() ||
        l.attention.rope_dims < 2 || l.attention.rope_dims > c.head_dim || l.attention.rope_dims % 2 != 0 ||
        static_cast<int64_t>(d.rope_inv_freq[l.attention.rope].size()) * 2 != l.attention.rope_dims)
      fail(Errc::internal, "[load_model] {}: the {} description's RoPE table {} does not fit rope_dims {}", source,
           c.arch, l.attention.rope, l.attention.rope_dims);
  return d;
}

RopeScaling parse_rope_scaling(const nlohmann::json& hf, std::string_view source) {
  RopeScaling s;
  const auto it = hf.find("rope_scaling");
  if (it == hf.end() || it->is_null()) return s;
  if (!it->is_object()) fail(Errc::format, "[load_model] {}: rope_scaling is not an object", source);
  std::string type = json_string_or(*it, "rope_type", "", source);
  if (type.empty()) type = json_string_or(*it, "type", "default", source);
  if (type == "default") return s;
  s.factor = json_number(*it, "factor", source);
  if (type == "linear") {
    s.kind = RopeScaling::Kind::linear;
  } else if (type == "llama3") {
    s.kind = RopeScaling::Kind::llama3;
    s.low_freq_factor = json_number(*it, "low_freq_factor", source);
    s.high_freq_factor = json_number(*it, "high_freq_factor", source);
    s.original_max_position = json_int(*it, "original_max_position_embeddings", source);
  } else {
    fail(Errc::unsupported, "[load_model] {}: rope_scaling type '{}' is not supported", source, type);
  }
  return s;
}

ModelConfig parse_hf_config(const nlohmann::json& hf, std::string_view source) {
  if (!hf.is_object()) fail(Errc::format, "[load_model] {}: config is not a JSON object", source);
  const Family& family = find_family_hf(hf, source);
  ModelConfig c;
  c.arch = std::string(family.name);
  c.dim = json_int(hf, "hidden_size", source);
  c.n_layers = json_int(hf, "num_hidden_layers", source);
  c.n_heads = json_int(hf, "num_attention_heads", source);
  c.n_kv_heads = json_int_or(hf, "num_key_value_heads", c.n_heads, source);
  c.head_dim = c.n_heads > 0 ? c.dim / c.n_heads : 0;
  c.hidden_dim = json_int(hf, "intermediate_size", source);
  c.vocab = json_int(hf, "vocab_size", source);
  c.max_seq = json_int_or(hf, "max_position_embeddings", 2048, source);
  c.rope_theta = json_number_or(hf, "rope_theta", 10000.0, source);
  // transformers 5 writes the base inside rope_parameters; only its plain ("default") RoPE is read from there
  if (const auto it = hf.find("rope_parameters"); it != hf.end() && it->is_object() && !hf.contains("rope_theta")) {
    if (it->value("rope_type", std::string("default")) != "default")
      fail(Errc::unsupported, "[load_model] {}: rope_parameters.rope_type {} (default expected)", source,
           it->at("rope_type").dump());
    c.rope_theta = json_number_or(*it, "rope_theta", 10000.0, source);
  }
  c.norm_eps = static_cast<float>(json_number_or(hf, "rms_norm_eps", 1e-6, source));
  c.tied_embeddings = json_bool_or(hf, "tie_word_embeddings", false, source);
  c.rope_style = RopeStyle::half;
  if (const auto it = hf.find("bos_token_id"); it != hf.end() && it->is_number_integer()) c.bos_id = it->get<int32_t>();
  c.eos_ids = json_ids(hf, "eos_token_id", source);
  family.parse_hf(hf, c, source);
  validate_config(c, source);
  describe_model(c, source);
  return c;
}

nlohmann::json config_to_hf_json(const ModelConfig& c) {
  const Family& family = family_of(c);
  nlohmann::json j = {
      {"architectures", {std::string(family.hf_class)}},
      {"model_type", c.arch},
      {"hidden_size", c.dim},
      {"num_hidden_layers", c.n_layers},
      {"num_attention_heads", c.n_heads},
      {"num_key_value_heads", c.n_kv_heads},
      {"head_dim", c.head_dim},
      {"intermediate_size", c.hidden_dim},
      {"vocab_size", c.vocab},
      {"max_position_embeddings", c.max_seq},
      {"rope_theta", c.rope_theta},
      {"rms_norm_eps", c.norm_eps},
      {"tie_word_embeddings", c.tied_embeddings},
      {"torch_dtype", "float32"},
  };
  if (c.qkv_bias) j["attention_bias"] = true;
  const auto& s = c.rope_scaling;
  if (s.kind == RopeScaling::Kind::linear) j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", s.factor}};
  if (s.kind == RopeScaling::Kind::llama3)
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", s.factor},
                         {"low_freq_factor", s.low_freq_factor},
                         {"high_freq_factor", s.high_freq_factor},
                         {"original_max_position_embeddings", s.original_max_position}};
  if (c.bos_id) j["bos_token_id"] = *c.bos_id;
  if (c.eos_ids.size() == 1) j["eos_token_id"] = c.eos_ids[0];
  if (c.eos_ids.size() > 1) j["eos_token_id"] = c.eos_ids;
  family.write_hf(c, j);
  return j;
}

ModelConfig parse_gguf_config(const io::GgufFile& f) {
  const std::string arch = f.get_string("general.architecture").value_or("");
  const Family& family = find_family_gguf(arch, f.source());
  ModelConfig c;
  c.arch = std::string(family.name);
  c.dim = gguf_required(f, arch + ".embedding_length");
  c.n_layers = gguf_required(f, arch + ".block_count");
  c.n_heads = gguf_required(f, arch + ".attention.head_count");
  c.n_kv_heads = gguf_optional(f, arch + ".attention.head_count_kv", c.n_heads);
  c.hidden_dim = gguf_required(f, arch + ".feed_forward_length");
  c.max_seq = gguf_optional(f, arch + ".context_length", 2048);
  c.head_dim = gguf_optional(f, arch + ".attention.key_length", c.n_heads > 0 ? c.dim / c.n_heads : 0);
  c.rope_theta = f.get_float(arch + ".rope.freq_base").value_or(10000.0);
  c.norm_eps = static_cast<float>(f.get_float(arch + ".attention.layer_norm_rms_epsilon").value_or(1e-5));
  c.rope_scaling = gguf_rope_scaling(f, arch, c);
  c.rope_style = family.gguf_rope_style;
  const auto* embed = f.tensor("token_embd.weight");
  if (!embed || embed->ne.size() != 2) fail(Errc::format, "[gguf] {}: no 2-D token_embd.weight", f.source());
  c.vocab = static_cast<int64_t>(embed->ne[1]);
  c.tied_embeddings = f.tensor("output.weight") == nullptr;
  const auto n_tokens = f.get_strings("tokenizer.ggml.tokens").value_or(std::vector<std::string>{}).size();
  if (n_tokens > 0) {
    c.bos_id = gguf_token_id(f, "tokenizer.ggml.bos_token_id", n_tokens);
    if (auto eos = gguf_token_id(f, "tokenizer.ggml.eos_token_id", n_tokens)) c.eos_ids = {*eos};
  }
  family.parse_gguf(f, arch, c);
  validate_config(c, f.source());
  describe_model(c, f.source());
  return c;
}

bool is_decoder_tensor_name(std::string_view hf_name) {
  if (hf_name.starts_with("model.audio_tower.") || hf_name.starts_with("model.multi_modal_projector."))
    return false;  // a qwen3_asr artifact's audio encoder
  return hf_name.starts_with("model.") || hf_name.starts_with("lm_head.");
}

std::string hf_tensor_name(int64_t layer, const TensorSpec& t) {
  if (t.expert >= 0) return fmt::format("{}{}.{}", kHfLayerPrefix, layer, fmt::format(fmt::runtime(t.hf), t.expert));
  return fmt::format("{}{}.{}", kHfLayerPrefix, layer, t.hf);
}

std::string gguf_tensor_name(int64_t layer, const TensorSpec& t) {
  return fmt::format("{}{}.{}", kGgufLayerPrefix, layer, t.gguf);
}

std::optional<LayerTensor> find_layer_tensor(const ModelDesc& d, std::string_view hf_name) {
  if (!hf_name.starts_with(kHfLayerPrefix)) return std::nullopt;
  const std::string_view rest = hf_name.substr(kHfLayerPrefix.size());
  const size_t dot = rest.find('.');
  if (dot == std::string_view::npos || dot == 0) return std::nullopt;
  int64_t layer = -1;
  const auto [end, ec] = std::from_chars(rest.data(), rest.data() + dot, layer);
  if (ec != std::errc() || end != rest.data() + dot || layer < 0 || layer >= static_cast<int64_t>(d.layers.size()))
    return std::nullopt;
  for (const TensorSpec& t : d.layers[static_cast<size_t>(layer)].tensors)
    if (t.expert < 0 ? t.hf == rest.substr(dot + 1) : hf_tensor_name(layer, t) == hf_name)
      return LayerTensor{layer, &t};
  return std::nullopt;
}

}  // namespace lowbit::model
