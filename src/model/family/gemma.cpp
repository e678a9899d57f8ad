#include "family/gemma.h"

#include <algorithm>
#include <cmath>

#include "lowbit/core/error.h"
#include "lowbit/io/gguf.h"
#include "json_fields.h"

namespace lowbit::model::gemma {

namespace {

// The layer's tensors. HF's post_attention_layernorm is the norm of the attention output here (in Llama it is
// the norm before the MLP, which Gemma calls pre_feedforward_layernorm).
constexpr TensorSpec kAttnNorm{Role::attn_norm, "input_layernorm.weight", "attn_norm.weight", Dim::dim};
constexpr TensorSpec kQ{Role::q, "self_attn.q_proj.weight", "attn_q.weight", Dim::q_dim, Dim::dim};
constexpr TensorSpec kK{Role::k, "self_attn.k_proj.weight", "attn_k.weight", Dim::kv_dim, Dim::dim};
constexpr TensorSpec kV{Role::v, "self_attn.v_proj.weight", "attn_v.weight", Dim::kv_dim, Dim::dim};
constexpr TensorSpec kQNorm{Role::q_norm, "self_attn.q_norm.weight", "attn_q_norm.weight", Dim::head_dim};
constexpr TensorSpec kKNorm{Role::k_norm, "self_attn.k_norm.weight", "attn_k_norm.weight", Dim::head_dim};
constexpr TensorSpec kO{Role::o, "self_attn.o_proj.weight", "attn_output.weight", Dim::dim, Dim::q_dim};
constexpr TensorSpec kPostAttnNorm{Role::post_attn_norm, "post_attention_layernorm.weight",
                                   "post_attention_norm.weight", Dim::dim};
constexpr TensorSpec kFfnNorm{Role::ffn_norm, "pre_feedforward_layernorm.weight", "ffn_norm.weight", Dim::dim};
constexpr TensorSpec kGate{Role::gate, "mlp.gate_proj.weight", "ffn_gate.weight", Dim::hidden, Dim::dim};
constexpr TensorSpec kUp{Role::up, "mlp.up_proj.weight", "ffn_up.weight", Dim::hidden, Dim::dim};
constexpr TensorSpec kDown{Role::down, "mlp.down_proj.weight", "ffn_down.weight", Dim::dim, Dim::hidden};
constexpr TensorSpec kPostFfnNorm{Role::post_ffn_norm, "post_feedforward_layernorm.weight", "post_ffw_norm.weight",
                                  Dim::dim};

// Each branch is normed on the way in and on the way out, then added to the residual stream.
const std::vector<Op>& layer_ops() {
  static const std::vector<Op> ops = {
      {Op::Kind::norm, Reg::x, Role::attn_norm},      {Op::Kind::attention},
      {Op::Kind::norm, Reg::h, Role::post_attn_norm}, {Op::Kind::add},
      {Op::Kind::norm, Reg::x, Role::ffn_norm},       {Op::Kind::mlp},
      {Op::Kind::norm, Reg::h, Role::post_ffn_norm},  {Op::Kind::add},
  };
  return ops;
}

// 1 / sqrt(query_pre_attn_scalar) in f32, as HF multiplies the scores.
float scale_of(double query_pre_attn_scalar) { return static_cast<float>(1.0 / std::sqrt(query_pre_attn_scalar)); }

}  // namespace

void parse_hf(const nlohmann::json& hf, ModelConfig& c, std::string_view source, int64_t pattern) {
  c.head_dim = json_int_or(hf, "head_dim", c.head_dim, source);
  // Gemma 2 configs carry both names, Gemma 3 only hidden_activation.
  const std::string act =
      json_string_or(hf, "hidden_activation", json_string_or(hf, "hidden_act", "gelu_pytorch_tanh", source), source);
  if (act != "gelu_pytorch_tanh")
    fail(Errc::unsupported, "[load_model] {}: hidden_activation '{}' is not supported (gelu_pytorch_tanh)", source,
         act);
  if (json_bool_or(hf, "attention_bias", false, source))
    fail(Errc::unsupported, "[load_model] {}: attention_bias true is not supported for {}", source, c.arch);
  const double scalar = json_number_or(hf, "query_pre_attn_scalar", 256.0, source);  // HF's default
  if (!(scalar > 0) || !std::isfinite(scalar))
    fail(Errc::format, "[load_model] {}: query_pre_attn_scalar {} is not positive", source, scalar);
  c.attn_scale = scale_of(scalar);
  c.sliding_window = json_int_or(hf, "sliding_window", 4096, source);  // HF's default
  c.sliding_layers.clear();
  if (const auto it = hf.find("layer_types"); it != hf.end() && !it->is_null()) {
    if (!it->is_array() || static_cast<int64_t>(it->size()) != c.n_layers)
      fail(Errc::format, "[load_model] {}: layer_types is not a list of {} layer types", source, c.n_layers);
    for (const auto& t : *it) {
      if (t == "sliding_attention")
        c.sliding_layers.push_back(true);
      else if (t == "full_attention")
        c.sliding_layers.push_back(false);
      else
        fail(Errc::format, "[load_model] {}: layer_types holds {} (sliding_attention or full_attention)", source,
             t.dump());
    }
  } else {
    if (pattern < 1) fail(Errc::format, "[load_model] {}: sliding_window_pattern {} is not positive", source, pattern);
    for (int64_t l = 0; l < c.n_layers; ++l) c.sliding_layers.push_back((l + 1) % pattern != 0);
  }
}

void parse_gguf(const io::GgufFile& f, const std::string& arch, ModelConfig& c, int64_t pattern,
                int64_t default_window) {
  const std::string window_key = arch + ".attention.sliding_window";
  c.sliding_window = static_cast<int64_t>(
      std::min<uint64_t>(f.get_uint(window_key).value_or(static_cast<uint64_t>(default_window)), uint64_t{1} << 40));
  const std::string pattern_key = arch + ".attention.sliding_window_pattern";
  c.sliding_layers.clear();
  if (const io::GgufValue* v = f.find(pattern_key); v && v->type == io::GgufValueType::array) {
    if (v->element_type != io::GgufValueType::boolean || static_cast<int64_t>(v->array.size()) != c.n_layers)
      fail(Errc::format, "[gguf] {}: {} is not an array of {} booleans", f.source(), pattern_key, c.n_layers);
    for (const auto& b : v->array) c.sliding_layers.push_back(std::get<bool>(b));
  } else {
    const auto period = static_cast<int64_t>(f.get_uint(pattern_key).value_or(static_cast<uint64_t>(pattern)));
    // llama.cpp's set_swa_pattern: period 0 puts every layer on the window.
    for (int64_t l = 0; l < c.n_layers; ++l) c.sliding_layers.push_back(period == 0 || l % period < period - 1);
  }
  // llama.cpp reads no query_pre_attn_scalar: its gemma2/gemma3 loaders (src/models/gemma2.cpp, gemma3.cpp)
  // use 1 / sqrt(head_dim), or 1 / sqrt(dim / heads) for the 27B models, which they recognise by layer count.
  const bool is_27b = (arch == "gemma2" && c.n_layers == 46) || (arch == "gemma3" && c.n_layers == 62);
  c.attn_scale = scale_of(is_27b ? static_cast<double>(c.dim / c.n_heads) : static_cast<double>(c.head_dim));
}

void write_hf(const ModelConfig& c, nlohmann::json& hf) {
  hf["head_dim"] = c.head_dim;
  hf["hidden_activation"] = "gelu_pytorch_tanh";
  hf.erase("hidden_act");
  // The scalar back from its scale: an integer in every Gemma config (and HF's Gemma configs type it int), so round
  // off the f32 rounding.
  const double scalar = 1.0 / (static_cast<double>(c.attn_scale) * c.attn_scale);
  if (std::abs(scalar - std::round(scalar)) < 1e-4 * scalar)
    hf["query_pre_attn_scalar"] = static_cast<int64_t>(std::round(scalar));
  else
    hf["query_pre_attn_scalar"] = scalar;
  hf["sliding_window"] = c.sliding_window;
  nlohmann::json types = nlohmann::json::array();
  for (int64_t l = 0; l < c.n_layers; ++l) types.push_back(c.is_sliding(l) ? "sliding_attention" : "full_attention");
  hf["layer_types"] = types;
  hf["final_logit_softcapping"] = c.final_softcap > 0 ? nlohmann::json(c.final_softcap) : nlohmann::json();
  hf["attn_logit_softcapping"] = c.attn_softcap > 0 ? nlohmann::json(c.attn_softcap) : nlohmann::json();
}

ModelDesc describe(const ModelConfig& c, bool qk_norm, int sliding_rope) {
  ModelDesc d;
  d.rope_style = c.rope_style;
  // HF multiplies by sqrt(hidden_size) as a tensor of the weights' dtype, llama.cpp by sqrtf(n_embd): in f32 the same.
  d.embed_scale = std::sqrt(static_cast<float>(c.dim));
  d.final_norm = NormKind::rms_unit_offset;
  d.final_softcap = c.final_softcap;
  d.norm_eps = c.norm_eps;
  d.rope_inv_freq.push_back(rope_inv_freq(c.rope_theta, c.head_dim, c.rope_scaling, c.max_seq));
  if (sliding_rope > 0)
    d.rope_inv_freq.push_back(rope_inv_freq(c.rope_local_theta > 0 ? c.rope_local_theta : c.rope_theta, c.head_dim,
                                            RopeScaling{}, c.max_seq));
  std::vector<TensorSpec> tensors = {kAttnNorm, kQ, kK, kV};
  if (qk_norm) tensors.insert(tensors.end(), {kQNorm, kKNorm});
  tensors.insert(tensors.end(), {kO, kPostAttnNorm, kFfnNorm, kGate, kUp, kDown, kPostFfnNorm});
  for (int64_t l = 0; l < c.n_layers; ++l) {
    LayerDesc layer;
    layer.tensors = tensors;
    layer.ops = layer_ops();
    layer.attention.scale = c.attn_scale > 0 ? c.attn_scale : 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    layer.attention.softcap = c.attn_softcap;
    layer.attention.window = c.is_sliding(l) ? c.sliding_window : 0;
    layer.attention.rope = c.is_sliding(l) ? sliding_rope : 0;
    layer.attention.rope_dims = c.head_dim;
    layer.activation = Activation::geglu_tanh;
    layer.norm = NormKind::rms_unit_offset;
    d.layers.push_back(std::move(layer));
  }
  return d;
}

}  // namespace lowbit::model::gemma
