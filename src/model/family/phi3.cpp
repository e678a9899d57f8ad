// Phi-3 (HF Phi3ForCausalLM; GGUF "phi3"): Llama's layer with q, k and v in one fused projection (qkv_proj, rows
// [q | k | v]) and the gate and up projections in one (gate_up_proj, rows [gate | up]), optional partial rotary,
// a sliding window on every layer when the config has one, and LongRoPE (the 128k models).
#include <algorithm>
#include <cmath>

#include "lowbit/core/error.h"
#include "lowbit/io/gguf.h"
#include "lowbit/model/family.h"
#include "json_fields.h"

namespace lowbit::model {

namespace {

const std::vector<TensorSpec> kTensors = {
    {Role::attn_norm, "input_layernorm.weight", "attn_norm.weight", Dim::dim},
    {Role::qkv, "self_attn.qkv_proj.weight", "attn_qkv.weight", Dim::qkv_dim, Dim::dim},
    {Role::o, "self_attn.o_proj.weight", "attn_output.weight", Dim::dim, Dim::q_dim},
    {Role::ffn_norm, "post_attention_layernorm.weight", "ffn_norm.weight", Dim::dim},
    {Role::gate_up, "mlp.gate_up_proj.weight", "ffn_up.weight", Dim::gate_up_dim, Dim::dim},
    {Role::down, "mlp.down_proj.weight", "ffn_down.weight", Dim::dim, Dim::hidden},
};

const std::vector<Op> kOps = {
    {Op::Kind::norm, Reg::x, Role::attn_norm}, {Op::Kind::attention}, {Op::Kind::add},
    {Op::Kind::norm, Reg::x, Role::ffn_norm},  {Op::Kind::mlp},       {Op::Kind::add},
};

// Phi-3's published windows may exceed the context (Phi-3-mini-128k: 262144 of 131072), which limits nothing:
// such a window is none.
int64_t window_within_context(int64_t window, int64_t context) { return window >= context ? 0 : window; }

// HF's _compute_longrope_parameters: the attention factor when the config names none, from the ratio of the
// context to the pretraining context.
double default_attention_factor(double factor, int64_t original_max_position) {
  return factor <= 1.0 ? 1.0 : std::sqrt(1.0 + std::log(factor) / std::log(static_cast<double>(original_max_position)));
}

std::vector<float> factors(const nlohmann::json& rope, std::string_view key, std::string_view source) {
  const auto it = rope.find(key);
  if (it == rope.end() || !it->is_array())
    fail(Errc::format, "[load_model] {}: rope_scaling.{} is not a list of numbers", source, key);
  std::vector<float> out;
  for (const auto& v : *it) {
    if (!v.is_number()) fail(Errc::format, "[load_model] {}: rope_scaling.{} holds {}", source, key, v.dump());
    out.push_back(v.get<float>());
  }
  return out;
}

// rope_parameters (transformers >= 5) or rope_scaling: default or longrope ("su" and "yarn" are its old names).
void parse_rope(const nlohmann::json& hf, ModelConfig& c, std::string_view source) {
  const nlohmann::json* rope = nullptr;
  for (const char* key : {"rope_parameters", "rope_scaling"})
    if (const auto it = hf.find(key); !rope && it != hf.end() && !it->is_null()) rope = &*it;
  const double partial = json_number_or(rope ? *rope : hf, "partial_rotary_factor",
                                        json_number_or(hf, "partial_rotary_factor", 1.0, source), source);
  if (!(partial > 0 && partial <= 1))
    fail(Errc::format, "[load_model] {}: partial_rotary_factor {} is not in (0, 1]", source, partial);
  if (partial < 1) c.rope_dims = static_cast<int64_t>(static_cast<double>(c.head_dim) * partial);  // HF's int()
  if (!rope) return;
  if (!rope->is_object()) fail(Errc::format, "[load_model] {}: rope_scaling is not an object", source);
  c.rope_theta = json_number_or(*rope, "rope_theta", c.rope_theta, source);
  std::string type = json_string_or(*rope, "rope_type", "", source);
  if (type.empty()) type = json_string_or(*rope, "type", "default", source);
  if (type == "default") return;
  if (type != "longrope" && type != "su" && type != "yarn")
    fail(Errc::unsupported, "[load_model] {}: rope_scaling type '{}' is not supported for phi3 (longrope)", source,
         type);
  RopeScaling& s = c.rope_scaling;
  s.kind = RopeScaling::Kind::longrope;
  s.short_factor = factors(*rope, "short_factor", source);
  s.long_factor = factors(*rope, "long_factor", source);
  s.original_max_position = json_int_or(*rope, "original_max_position_embeddings",
                                        json_int(hf, "original_max_position_embeddings", source), source);
  s.factor = json_number_or(*rope, "factor",
                            static_cast<double>(c.max_seq) / static_cast<double>(s.original_max_position), source);
  s.attention_factor =
      json_number_or(*rope, "attention_factor", default_attention_factor(s.factor, s.original_max_position), source);
}

void parse_hf(const nlohmann::json& hf, ModelConfig& c, std::string_view source) {
  c.head_dim = json_int_or(hf, "head_dim", c.head_dim, source);
  const std::string act = json_string_or(hf, "hidden_act", "silu", source);
  if (act != "silu")
    fail(Errc::unsupported, "[load_model] {}: hidden_act '{}' is not supported for phi3 (silu)", source, act);
  parse_rope(hf, c, source);
  c.sliding_window = window_within_context(json_int_or(hf, "sliding_window", 0, source), c.max_seq);
}

const io::GgufTensorInfo* rope_factor_tensor(const io::GgufFile& f, std::string_view name, int64_t pairs) {
  const auto* t = f.tensor(name);
  if (t && static_cast<int64_t>(t->numel) != pairs)
    fail(Errc::shape, "[gguf] {}: {} has {} values for {} rotated pairs", f.source(), name, t->numel, pairs);
  return t;
}

// llama.cpp's convert_hf_to_gguf.py (Phi3MiniModel) writes partial rotary as rope.dimension_count and LongRoPE
// as the tensors rope_factors_long/short.weight plus rope.scaling.attn_factor. llama.cpp's loader turns the sliding
// window off for phi3 (src/models/phi3.cpp, "Phi SWA is currently disabled"); lowbit keeps it, as HF runs it.
void parse_gguf(const io::GgufFile& f, const std::string& arch, ModelConfig& c) {
  if (const auto dims = f.get_uint(arch + ".rope.dimension_count"); dims && static_cast<int64_t>(*dims) != c.head_dim)
    c.rope_dims = static_cast<int64_t>(*dims);
  c.sliding_window =
      window_within_context(static_cast<int64_t>(std::min<uint64_t>(
                                f.get_uint(arch + ".attention.sliding_window").value_or(0), uint64_t{1} << 40)),
                            c.max_seq);
  const int64_t pairs = c.rotary_dims() / 2;
  const auto* long_factors = rope_factor_tensor(f, "rope_factors_long.weight", pairs);
  const auto* short_factors = rope_factor_tensor(f, "rope_factors_short.weight", pairs);
  if (!long_factors && !short_factors) return;
  if (!long_factors || !short_factors)
    fail(Errc::format, "[gguf] {}: one of rope_factors_long.weight and rope_factors_short.weight is missing",
         f.source());
  RopeScaling& s = c.rope_scaling;
  s.kind = RopeScaling::Kind::longrope;
  s.long_factor = f.dequantize(*long_factors);
  s.short_factor = f.dequantize(*short_factors);
  s.original_max_position = static_cast<int64_t>(
      f.get_uint(arch + ".rope.scaling.original_context_length").value_or(static_cast<uint64_t>(c.max_seq)));
  s.factor = static_cast<double>(c.max_seq) / static_cast<double>(s.original_max_position);
  s.attention_factor = f.get_float(arch + ".rope.scaling.attn_factor")
                           .value_or(default_attention_factor(s.factor, s.original_max_position));
}

void write_hf(const ModelConfig& c, nlohmann::json& hf) {
  hf["hidden_act"] = "silu";
  // HF's Phi3Config defaults pad_token_id to 32000, which a smaller vocabulary refuses; lowbit keeps no pad id.
  hf["pad_token_id"] = nullptr;
  hf["sliding_window"] = c.sliding_window > 0 ? nlohmann::json(c.sliding_window) : nlohmann::json();
  if (c.rope_dims > 0) hf["partial_rotary_factor"] = static_cast<double>(c.rope_dims) / static_cast<double>(c.head_dim);
  const RopeScaling& s = c.rope_scaling;
  if (s.kind != RopeScaling::Kind::longrope) return;
  hf["original_max_position_embeddings"] = s.original_max_position;
  hf["rope_scaling"] = {{"type", "longrope"},
                        {"short_factor", s.short_factor},
                        {"long_factor", s.long_factor},
                        {"factor", s.factor},
                        {"attention_factor", s.attention_factor}};
}

ModelDesc describe(const ModelConfig& c, std::string_view source) {
  const RopeScaling& s = c.rope_scaling;
  const double attention_factor = s.kind == RopeScaling::Kind::longrope ? s.attention_factor : 1.0;
  // LongRoPE scales cos and sin by the attention factor, that is q and k on the rotated dimensions: with every
  // dimension rotated that is the scores times its square, which the scale takes. Not so with partial rotary.
  if (attention_factor != 1.0 && c.rotary_dims() != c.head_dim)
    fail(Errc::unsupported,
         "[load_model] {}: LongRoPE with partial rotary (rope_dims {} of head_dim {}) is not supported", source,
         c.rotary_dims(), c.head_dim);
  ModelDesc d;
  d.rope_style = c.rope_style;
  d.norm_eps = c.norm_eps;
  d.rope_inv_freq.push_back(rope_inv_freq(c));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    LayerDesc layer;
    layer.tensors = kTensors;
    layer.ops = kOps;
    layer.attention.scale =
        static_cast<float>(attention_factor * attention_factor / std::sqrt(static_cast<double>(c.head_dim)));
    layer.attention.window = c.sliding_window;
    layer.attention.rope_dims = c.rotary_dims();
    d.layers.push_back(std::move(layer));
  }
  return d;
}

constexpr std::string_view kGgufArchs[] = {"phi3"};

}  // namespace

extern const Family kPhi3Family{
    .name = "phi3",
    .hf_class = "Phi3ForCausalLM",
    .hf_aliases = {},
    .gguf_archs = kGgufArchs,
    .gguf_rope_style = RopeStyle::half,  // llama.cpp runs phi3 with NEOX (half) RoPE: rows as in HF
    .chat_template = "phi3",
    .parse_hf = parse_hf,
    .parse_gguf = parse_gguf,
    .write_hf = write_hf,
    .describe = describe,
};

}  // namespace lowbit::model
