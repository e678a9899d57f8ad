// A small random Llama-family model built in memory, for tests of the forward pass, conversion and eval.
#pragma once

#include <random>

#include <fmt/format.h>

#include "lowbit/model/model.h"

namespace lowbit::model::testing {

inline ModelConfig tiny_config() {
  ModelConfig c;
  c.dim = 16;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 4;
  c.hidden_dim = 24;
  c.vocab = 32;
  c.max_seq = 64;
  return c;
}

// Weights uniform in [-scale, scale] (norm weights near 1); `zero_head` zeroes the output projection so every
// position predicts the uniform distribution.
inline std::unique_ptr<Model> tiny_model(const ModelConfig& c, uint64_t seed = 1, bool zero_head = false) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-0.5f, 0.5f);
  ModelBuilder b;
  auto add = [&](const std::string& name, Shape shape, float offset = 0.0f, bool zero = false) {
    size_t n = 1;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    std::vector<float> v(n);
    for (float& x : v) x = zero ? 0.0f : offset + u(rng);
    b.add_f32(name, std::move(shape), std::move(v));
  };
  add("model.embed_tokens.weight", {c.vocab, c.dim});
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const auto n = [l](std::string_view s) { return fmt::format("model.layers.{}.{}", l, s); };
    add(n("input_layernorm.weight"), {c.dim}, 1.0f);
    add(n("post_attention_layernorm.weight"), {c.dim}, 1.0f);
    add(n("self_attn.q_proj.weight"), {c.q_dim(), c.dim});
    add(n("self_attn.k_proj.weight"), {c.kv_dim(), c.dim});
    add(n("self_attn.v_proj.weight"), {c.kv_dim(), c.dim});
    add(n("self_attn.o_proj.weight"), {c.dim, c.q_dim()});
    if (c.qkv_bias) {
      add(n("self_attn.q_proj.bias"), {c.q_dim()});
      add(n("self_attn.k_proj.bias"), {c.kv_dim()});
      add(n("self_attn.v_proj.bias"), {c.kv_dim()});
    }
    if (c.qk_norm) {
      add(n("self_attn.q_norm.weight"), {c.head_dim}, 1.0f);
      add(n("self_attn.k_norm.weight"), {c.head_dim}, 1.0f);
    }
    add(n("mlp.gate_proj.weight"), {c.hidden_dim, c.dim});
    add(n("mlp.up_proj.weight"), {c.hidden_dim, c.dim});
    add(n("mlp.down_proj.weight"), {c.dim, c.hidden_dim});
  }
  add("model.norm.weight", {c.dim}, 1.0f);
  if (!c.tied_embeddings) add("lm_head.weight", {c.vocab, c.dim}, 0.0f, zero_head);
  return b.finish(c, "tiny");
}

}  // namespace lowbit::model::testing
