#include "family/qwen3_asr_encoder.h"

#include <cmath>

namespace lowbit::model {

namespace {

// Names relative to the layer prefix ("<tower>layers.N."), as both transformers and mlx_audio store them.
constexpr TensorSpec kTensors[] = {
    {Role::attn_norm, "self_attn_layer_norm.weight", "", Dim::dim},
    {Role::attn_norm_bias, "self_attn_layer_norm.bias", "", Dim::dim},
    {Role::q, "self_attn.q_proj.weight", "", Dim::q_dim, Dim::dim},
    {Role::q_bias, "self_attn.q_proj.bias", "", Dim::q_dim},
    {Role::k, "self_attn.k_proj.weight", "", Dim::kv_dim, Dim::dim},
    {Role::k_bias, "self_attn.k_proj.bias", "", Dim::kv_dim},
    {Role::v, "self_attn.v_proj.weight", "", Dim::kv_dim, Dim::dim},
    {Role::v_bias, "self_attn.v_proj.bias", "", Dim::kv_dim},
    {Role::o, "self_attn.out_proj.weight", "", Dim::dim, Dim::q_dim},
    {Role::o_bias, "self_attn.out_proj.bias", "", Dim::dim},
    {Role::ffn_norm, "final_layer_norm.weight", "", Dim::dim},
    {Role::ffn_norm_bias, "final_layer_norm.bias", "", Dim::dim},
    {Role::up, "fc1.weight", "", Dim::hidden, Dim::dim},
    {Role::up_bias, "fc1.bias", "", Dim::hidden},
    {Role::down, "fc2.weight", "", Dim::dim, Dim::hidden},
    {Role::down_bias, "fc2.bias", "", Dim::dim},
};

}  // namespace

ModelConfig audio_encoder_config(const AudioEncoderConfig& a) {
  ModelConfig c;
  c.arch = "qwen3_asr_encoder";
  c.dim = a.d_model;
  c.n_layers = a.layers;
  c.n_heads = c.n_kv_heads = a.heads;
  c.head_dim = a.d_model / a.heads;
  c.hidden_dim = a.ffn_dim;
  c.max_seq = a.window_tokens();
  c.norm_eps = 1e-5f;  // torch.nn.LayerNorm's default
  return c;
}

ModelDesc describe_audio_encoder(const AudioEncoderConfig& a) {
  const ModelConfig c = audio_encoder_config(a);
  LayerDesc layer;
  layer.tensors.assign(std::begin(kTensors), std::end(kTensors));
  layer.ops = {
      {Op::Kind::norm, Reg::x, Role::attn_norm, Role::attn_norm_bias}, {Op::Kind::attention}, {Op::Kind::add},
      {Op::Kind::norm, Reg::x, Role::ffn_norm, Role::ffn_norm_bias},   {Op::Kind::mlp},       {Op::Kind::add},
  };
  layer.attention = {.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim)),
                     .softcap = 0.0f,
                     .window = 0,
                     .rope = 0,
                     .rope_dims = 0,
                     .causal = false};
  layer.activation = Activation::gelu_erf;
  layer.norm = NormKind::layer;
  ModelDesc d;
  d.layers.assign(static_cast<size_t>(a.layers), layer);
  d.rope_inv_freq = {{}};
  d.final_norm = NormKind::layer;  // ln_post
  d.norm_eps = c.norm_eps;
  return d;
}

}  // namespace lowbit::model
