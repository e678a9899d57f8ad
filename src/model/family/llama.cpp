// Llama (1, 2, 3.x) and the many models that reuse its layout (SmolLM, TinyLlama, llama2.c checkpoints): RoPE
// scaling (linear, llama3), optional attention bias, an optional explicit head_dim.
#include "family/llama.h"
#include "family/moe.h"

#include <cmath>

#include "lowbit/core/error.h"
#include "lowbit/io/gguf.h"
#include "json_fields.h"

namespace lowbit::model {

namespace {

constexpr TensorSpec kAttnNorm{Role::attn_norm, "input_layernorm.weight", "attn_norm.weight", Dim::dim};
constexpr TensorSpec kQ{Role::q, "self_attn.q_proj.weight", "attn_q.weight", Dim::q_dim, Dim::dim};
constexpr TensorSpec kK{Role::k, "self_attn.k_proj.weight", "attn_k.weight", Dim::kv_dim, Dim::dim};
constexpr TensorSpec kV{Role::v, "self_attn.v_proj.weight", "attn_v.weight", Dim::kv_dim, Dim::dim};
constexpr TensorSpec kQBias{Role::q_bias, "self_attn.q_proj.bias", "attn_q.bias", Dim::q_dim};
constexpr TensorSpec kKBias{Role::k_bias, "self_attn.k_proj.bias", "attn_k.bias", Dim::kv_dim};
constexpr TensorSpec kVBias{Role::v_bias, "self_attn.v_proj.bias", "attn_v.bias", Dim::kv_dim};
constexpr TensorSpec kQNorm{Role::q_norm, "self_attn.q_norm.weight", "attn_q_norm.weight", Dim::head_dim};
constexpr TensorSpec kKNorm{Role::k_norm, "self_attn.k_norm.weight", "attn_k_norm.weight", Dim::head_dim};
constexpr TensorSpec kO{Role::o, "self_attn.o_proj.weight", "attn_output.weight", Dim::dim, Dim::q_dim};
constexpr TensorSpec kFfnNorm{Role::ffn_norm, "post_attention_layernorm.weight", "ffn_norm.weight", Dim::dim};
constexpr TensorSpec kGate{Role::gate, "mlp.gate_proj.weight", "ffn_gate.weight", Dim::hidden, Dim::dim};
constexpr TensorSpec kUp{Role::up, "mlp.up_proj.weight", "ffn_up.weight", Dim::hidden, Dim::dim};
constexpr TensorSpec kDown{Role::down, "mlp.down_proj.weight", "ffn_down.weight", Dim::dim, Dim::hidden};

void parse_hf(const nlohmann::json& hf, ModelConfig& c, std::string_view source) {
  require_silu(hf, source);
  c.rope_scaling = parse_rope_scaling(hf, source);
  c.qkv_bias = json_bool_or(hf, "attention_bias", false, source);
  c.head_dim = json_int_or(hf, "head_dim", c.head_dim, source);
}

// GGUF has no attention_bias key; a llama with biases carries them as tensors.
// llama.cpp's converter writes Mixtral under architecture "llama" with an expert count: that file is a mixtral.
void parse_gguf(const io::GgufFile& f, const std::string& arch, ModelConfig& c) {
  c.qkv_bias = f.tensor(gguf_tensor_name(0, kQBias)) != nullptr;
  if (f.get_uint(arch + ".expert_count").value_or(0) > 0) {
    c.arch = "mixtral";
    parse_mixtral_gguf(f, arch, c);
  }
}

void write_hf(const ModelConfig&, nlohmann::json& hf) { hf["hidden_act"] = "silu"; }

ModelDesc describe(const ModelConfig& c, std::string_view) { return llama_model(c, {.qkv_bias = c.qkv_bias}); }

constexpr std::string_view kGgufArchs[] = {"llama"};

}  // namespace

void require_silu(const nlohmann::json& hf, std::string_view source) {
  if (const auto it = hf.find("hidden_act"); it != hf.end() && *it != "silu")
    fail(Errc::unsupported, "[load_model] {}: hidden_act {} is not supported (silu only)", source, it->dump());
}

ModelDesc llama_model(const ModelConfig& c, const LlamaLayerOptions& options) {
  LayerDesc layer;
  layer.tensors = {kAttnNorm, kFfnNorm, kQ, kK, kV, kO};
  if (options.qkv_bias) layer.tensors.insert(layer.tensors.end(), {kQBias, kKBias, kVBias});
  if (options.qk_norm) layer.tensors.insert(layer.tensors.end(), {kQNorm, kKNorm});
  layer.tensors.insert(layer.tensors.end(), {kGate, kUp, kDown});
  layer.ops = {
      {Op::Kind::norm, Reg::x, Role::attn_norm}, {Op::Kind::attention}, {Op::Kind::add},
      {Op::Kind::norm, Reg::x, Role::ffn_norm},  {Op::Kind::mlp},       {Op::Kind::add},
  };
  layer.attention = {.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim)),
                     .window = options.window,
                     .rope = 0,
                     .rope_dims = c.head_dim};
  layer.activation = Activation::swiglu;
  layer.norm = NormKind::rms;
  ModelDesc d;
  d.layers.assign(static_cast<size_t>(c.n_layers), layer);
  d.rope_inv_freq = {rope_inv_freq(c)};
  d.rope_style = c.rope_style;
  d.norm_eps = c.norm_eps;
  return d;
}

extern const Family kLlamaFamily{
    .name = "llama",
    .hf_class = "LlamaForCausalLM",
    .hf_aliases = {},
    .gguf_archs = kGgufArchs,
    .gguf_rope_style = RopeStyle::interleaved,
    .chat_template = "",
    .parse_hf = parse_hf,
    .parse_gguf = parse_gguf,
    .write_hf = write_hf,
    .describe = describe,
};

}  // namespace lowbit::model
