// The Llama-family forward pass, llama2.c run.c style: every step spelled out, shapes in comments.
// Reductions run in the same order as run.c (sequential f32 sums) so that a llama2.c checkpoint reproduces
// run.c's greedy output.
#include <algorithm>
#include <cmath>
#include <vector>

#include "lowbit/core/error.h"
#include "lowbit/core/thread_pool.h"
#include "lowbit/model/model.h"

namespace lowbit::model {

namespace {

// o (n,) = weight (n,) * x (n,) / rms(x)
void rmsnorm(float* o, const float* x, const float* weight, int64_t n, float eps) {
  float ss = 0.0f;
  for (int64_t j = 0; j < n; ++j) ss += x[j] * x[j];
  ss /= static_cast<float>(n);
  ss += eps;
  ss = 1.0f / std::sqrt(ss);
  for (int64_t j = 0; j < n; ++j) o[j] = weight[j] * (ss * x[j]);
}

// Rows of x [m, n] normalized in place or into o [m, n].
void rmsnorm_rows(float* o, const float* x, const std::vector<float>& weight, int64_t m, int64_t n, float eps) {
  for (int64_t i = 0; i < m; ++i) rmsnorm(o + i * n, x + i * n, weight.data(), n, eps);
}

void add_bias(float* y, const std::vector<float>& bias, int64_t m) {
  const auto n = static_cast<int64_t>(bias.size());
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) y[i * n + j] += bias[j];
}

// Rotates one head vec (head_dim,) at position pos.
void rope_head(float* vec, int64_t head_dim, int64_t pos, const std::vector<float>& inv_freq, RopeStyle style) {
  const int64_t half = head_dim / 2;
  for (int64_t j = 0; j < half; ++j) {
    const float angle = static_cast<float>(pos) * inv_freq[j];
    const float c = std::cos(angle), s = std::sin(angle);
    float& a = style == RopeStyle::half ? vec[j] : vec[2 * j];
    float& b = style == RopeStyle::half ? vec[j + half] : vec[2 * j + 1];
    const float a0 = a, b0 = b;
    a = a0 * c - b0 * s;
    b = a0 * s + b0 * c;
  }
}

// Per-head RMSNorm (qwen3) then RoPE for rows x [m, heads * head_dim] at positions pos..pos+m-1.
void prepare_heads(float* x, int64_t m, int64_t heads, int64_t pos, const ModelConfig& c,
                   const std::vector<float>& head_norm, const std::vector<float>& inv_freq) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + (i * heads + h) * c.head_dim;
      if (!head_norm.empty()) rmsnorm(v, v, head_norm.data(), c.head_dim, c.norm_eps);
      rope_head(v, c.head_dim, pos + i, inv_freq, c.rope_style);
    }
}

// out [m, q_dim]: causal GQA attention of q [m, q_dim] at positions pos.. over the cached keys/values.
void attention(const ModelConfig& c, const KvCache& cache, int64_t layer, const float* q, int64_t m, int64_t pos,
               float* out, ThreadPool& pool) {
  const int64_t hd = c.head_dim, group = c.n_heads / c.n_kv_heads;
  const float scale = std::sqrt(static_cast<float>(hd));
  pool.parallel_for(static_cast<size_t>(m * c.n_heads), 1, [&](size_t b, size_t e) {
    std::vector<float> att(static_cast<size_t>(pos + m));
    for (size_t task = b; task < e; ++task) {
      const int64_t i = static_cast<int64_t>(task) / c.n_heads, h = static_cast<int64_t>(task) % c.n_heads;
      const int64_t p = pos + i, kv_off = (h / group) * hd;
      const float* qh = q + (i * c.n_heads + h) * hd;
      float max = -INFINITY;
      for (int64_t t = 0; t <= p; ++t) {
        const float* k = cache.key(layer, t) + kv_off;
        float score = 0.0f;
        for (int64_t d = 0; d < hd; ++d) score += qh[d] * k[d];
        att[t] = score / scale;
        max = std::max(max, att[t]);
      }
      float sum = 0.0f;
      for (int64_t t = 0; t <= p; ++t) {
        att[t] = std::exp(att[t] - max);
        sum += att[t];
      }
      for (int64_t t = 0; t <= p; ++t) att[t] /= sum;
      float* o = out + (i * c.n_heads + h) * hd;
      std::fill(o, o + hd, 0.0f);
      for (int64_t t = 0; t <= p; ++t) {
        const float* v = cache.value(layer, t) + kv_off;
        for (int64_t d = 0; d < hd; ++d) o[d] += att[t] * v[d];
      }
    }
  });
}

struct Scratch {
  std::vector<float> x, xb, q, k, v, att, hb, hb2;
  Scratch(const ModelConfig& c, int64_t m) {
    const auto n = [m](int64_t w) { return static_cast<size_t>(m * w); };
    x.resize(n(c.dim));
    xb.resize(n(c.dim));
    q.resize(n(c.q_dim()));
    k.resize(n(c.kv_dim()));
    v.resize(n(c.kv_dim()));
    att.resize(n(c.q_dim()));
    hb.resize(n(c.hidden_dim));
    hb2.resize(n(c.hidden_dim));
  }
};

void attention_block(const Model& model, const LayerWeights& w, int64_t l, KvCache& cache, Scratch& s, int64_t m,
                     int64_t pos, ThreadPool& pool) {
  const ModelConfig& c = model.config;
  rmsnorm_rows(s.xb.data(), s.x.data(), w.attn_norm, m, c.dim, c.norm_eps);
  // q [m, q_dim], k and v [m, kv_dim] = xb [m, dim] @ W^T
  w.wq->matmul(s.xb.data(), m, s.q.data(), pool);
  w.wk->matmul(s.xb.data(), m, s.k.data(), pool);
  w.wv->matmul(s.xb.data(), m, s.v.data(), pool);
  if (c.qkv_bias) {
    add_bias(s.q.data(), w.q_bias, m);
    add_bias(s.k.data(), w.k_bias, m);
    add_bias(s.v.data(), w.v_bias, m);
  }
  prepare_heads(s.q.data(), m, c.n_heads, pos, c, w.q_norm, model.rope_inv_freq);
  prepare_heads(s.k.data(), m, c.n_kv_heads, pos, c, w.k_norm, model.rope_inv_freq);
  for (int64_t i = 0; i < m; ++i) {
    std::copy_n(s.k.data() + i * c.kv_dim(), c.kv_dim(), cache.key(l, pos + i));
    std::copy_n(s.v.data() + i * c.kv_dim(), c.kv_dim(), cache.value(l, pos + i));
  }
  attention(c, cache, l, s.q.data(), m, pos, s.att.data(), pool);
  // x [m, dim] += att [m, q_dim] @ Wo^T
  w.wo->matmul(s.att.data(), m, s.xb.data(), pool);
  for (size_t j = 0; j < s.x.size(); ++j) s.x[j] += s.xb[j];
}

void mlp_block(const ModelConfig& c, const LayerWeights& w, Scratch& s, int64_t m, ThreadPool& pool) {
  rmsnorm_rows(s.xb.data(), s.x.data(), w.ffn_norm, m, c.dim, c.norm_eps);
  // hb = silu(xb @ Wgate^T) * (xb @ Wup^T)   [m, hidden]
  w.gate->matmul(s.xb.data(), m, s.hb.data(), pool);
  w.up->matmul(s.xb.data(), m, s.hb2.data(), pool);
  for (size_t j = 0; j < s.hb.size(); ++j) {
    float val = s.hb[j];
    val *= 1.0f / (1.0f + std::exp(-val));
    s.hb[j] = val * s.hb2[j];
  }
  // x [m, dim] += hb [m, hidden] @ Wdown^T
  w.down->matmul(s.hb.data(), m, s.xb.data(), pool);
  for (size_t j = 0; j < s.x.size(); ++j) s.x[j] += s.xb[j];
}

}  // namespace

void forward_layers(const Model& model, KvCache& cache, float* x, int64_t m, int64_t pos, int64_t layer_begin,
                    int64_t layer_end, ThreadPool& pool) {
  const ModelConfig& c = model.config;
  if (m < 1 || pos < 0 || pos + m > cache.capacity())
    fail(Errc::limit, "[forward] positions {}..{} exceed the context of {}", pos, pos + m, cache.capacity());
  if (layer_begin < 0 || layer_begin > layer_end || layer_end > c.n_layers)
    fail(Errc::internal, "[forward] layers {}..{} outside 0..{}", layer_begin, layer_end, c.n_layers);
  Scratch s(c, m);
  std::copy_n(x, m * c.dim, s.x.data());
  for (int64_t l = layer_begin; l < layer_end; ++l) {
    attention_block(model, model.layers[l], l, cache, s, m, pos, pool);
    mlp_block(c, model.layers[l], s, m, pool);
  }
  std::copy_n(s.x.data(), m * c.dim, x);
}

void forward(const Model& model, KvCache& cache, std::span<const int32_t> tokens, int64_t pos, float* logits,
             bool all_logits, ThreadPool& pool) {
  if (model.device) return model.device->forward(cache, tokens, pos, logits, all_logits);
  const ModelConfig& c = model.config;
  const auto m = static_cast<int64_t>(tokens.size());
  std::vector<float> x(static_cast<size_t>(m * c.dim));
  model.embed->gather_rows(tokens, x.data());  // x [m, dim]
  forward_layers(model, cache, x.data(), m, pos, 0, c.n_layers, pool);
  // logits [rows, vocab] = rmsnorm(x)[rows] @ Wlm^T, for every row or just the last one
  const int64_t first = all_logits ? 0 : m - 1, rows = m - first;
  std::vector<float> xn(static_cast<size_t>(rows * c.dim));
  rmsnorm_rows(xn.data(), x.data() + first * c.dim, model.final_norm, rows, c.dim, c.norm_eps);
  model.lm_head->matmul(xn.data(), rows, logits, pool);
}

}  // namespace lowbit::model
