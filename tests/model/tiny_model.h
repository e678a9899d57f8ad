// A small random model of any family, built in memory from its description, for tests of the forward pass,
// conversion and eval.
#pragma once

#include <memory>
#include <random>
#include <span>

#include <fmt/format.h>

#include "lowbit/core/thread_pool.h"
#include "lowbit/model/model.h"

namespace lowbit::model::testing {

// Logits [tokens, vocab] of every position from one prefill pass (the batched matmul kernels).
inline std::vector<float> prefill_logits(const Model& m, const std::vector<int32_t>& tokens, ThreadPool& pool) {
  KvCache cache(m.config, static_cast<int64_t>(tokens.size()));
  std::vector<float> out(tokens.size() * static_cast<size_t>(m.config.vocab));
  forward(m, cache, tokens, 0, out.data(), true, pool);
  return out;
}

// The same one decode step at a time (matvec kernels, keys and values read back from the cache).
inline std::vector<float> stepwise_logits(const Model& m, const std::vector<int32_t>& tokens, ThreadPool& pool) {
  KvCache cache(m.config, static_cast<int64_t>(tokens.size()));
  const auto vocab = static_cast<size_t>(m.config.vocab);
  std::vector<float> out(tokens.size() * vocab);
  for (size_t i = 0; i < tokens.size(); ++i)
    forward(m, cache, std::span(tokens).subspan(i, 1), static_cast<int64_t>(i), out.data() + i * vocab, false, pool);
  return out;
}

// The logits [steps, sequences, vocab] of `steps` decode steps of several sequences, two ways: all sequences in
// one forward_rows() per step (one batched matmul per linear) and each alone in forward() (m = 1, matvec). Each
// prompt is first prefilled into a cache of its own for either way, so rows sit at different positions of
// different caches; in step s row i runs token (7 s + 3 i + 1) mod vocab, the same both ways.
struct RowsAndAlone {
  std::vector<float> rows, alone;
};
inline RowsAndAlone decode_rows_and_alone(const Model& m, const std::vector<std::vector<int32_t>>& prompts, int steps,
                                          ThreadPool& pool) {
  const auto vocab = static_cast<size_t>(m.config.vocab);
  const size_t n = prompts.size();
  std::vector<std::unique_ptr<KvCache>> together, alone;
  std::vector<KvCache*> caches;
  std::vector<float> last(vocab);
  for (const auto& p : prompts) {
    together.push_back(std::make_unique<KvCache>(m.config, m.config.max_seq));
    alone.push_back(std::make_unique<KvCache>(m.config, m.config.max_seq));
    forward(m, *together.back(), p, 0, last.data(), false, pool);
    forward(m, *alone.back(), p, 0, last.data(), false, pool);
    caches.push_back(together.back().get());
  }
  RowsAndAlone out{std::vector<float>(static_cast<size_t>(steps) * n * vocab),
                   std::vector<float>(static_cast<size_t>(steps) * n * vocab)};
  std::vector<int32_t> tokens(n);
  std::vector<int64_t> pos(n);
  for (int s = 0; s < steps; ++s) {
    for (size_t i = 0; i < n; ++i) {
      tokens[i] = static_cast<int32_t>((7 * static_cast<size_t>(s) + 3 * i + 1) % vocab);
      pos[i] = static_cast<int64_t>(prompts[i].size()) + s;
    }
    const size_t step = static_cast<size_t>(s) * n * vocab;
    forward_rows(m, caches, tokens, pos, out.rows.data() + step, pool);
    for (size_t i = 0; i < n; ++i)
      forward(m, *alone[i], std::span(tokens).subspan(i, 1), pos[i], out.alone.data() + step + i * vocab, false, pool);
  }
  return out;
}

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

// A norm gain (near 1 in a random model) rather than a linear or a bias (near 0).
inline bool is_gain(Role r) {
  return r == Role::attn_norm || r == Role::ffn_norm || r == Role::q_norm || r == Role::k_norm ||
         r == Role::post_attn_norm || r == Role::post_ffn_norm;
}

// The stored gain weight that applies a gain of 1 (Gemma's norms apply 1 + w).
inline float unit_gain(NormKind kind) { return kind == NormKind::rms_unit_offset ? 0.0f : 1.0f; }

// Every tensor of the config's family description, weights uniform in [-0.5, 0.5] (norm gains near a gain of 1);
// `zero_head` zeroes the output projection so every position predicts the uniform distribution.
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
  add(std::string(kEmbedTensor), {c.vocab, c.dim});
  const ModelDesc d = describe_model(c, "tiny");
  for (int64_t l = 0; l < c.n_layers; ++l)
    for (const TensorSpec& t : d.layers[static_cast<size_t>(l)].tensors) {
      const int64_t rows = dim_size(t.rows, c);
      const Shape shape = t.linear() ? Shape{rows, dim_size(t.cols, c)} : Shape{rows};
      add(hf_tensor_name(l, t), shape, is_gain(t.role) ? unit_gain(d.layers[static_cast<size_t>(l)].norm) : 0.0f);
    }
  add(std::string(kFinalNormTensor), {c.dim}, unit_gain(d.final_norm));
  if (d.final_norm == NormKind::layer) add(std::string(kFinalNormBiasTensor), {c.dim});
  if (!c.tied_embeddings) add(std::string(kLmHeadTensor), {c.vocab, c.dim}, 0.0f, zero_head);
  return b.finish(c, "tiny");
}

}  // namespace lowbit::model::testing
