// The CPU forward pass: an interpreter of the model's description (family.h), llama2.c run.c style, shapes in
// comments. Each layer runs its op list over two registers, the residual stream x [m, dim] and the branch
// h [m, dim]. Each of the m rows has its place, a position in a KV cache: a prefill's rows are consecutive
// positions of one cache, a decode step's rows (forward_rows) one position each of their own sequences' caches.
// The linears run over all m rows at once; RoPE, the cache appends and attention run per row at its place. Norms
// reduce in run.c's order (sequential f32 sums); the linears and attention (kernels::attend_head) use vector sums. The
// KV cache keeps every position of every layer, sliding-window layers included (they only read the window); a ring
// cache for them is a later optimisation.
#include <algorithm>
#include <cmath>
#include <numbers>
#include <span>
#include <vector>

#include "lowbit/core/error.h"
#include "lowbit/core/thread_pool.h"
#include "lowbit/kernels/cpu_attention.h"
#include "lowbit/model/model.h"

namespace lowbit::model {

namespace {

// Where row i of a pass runs: position pos of `cache`, whose keys and values it appends and attends over.
struct RowPlace {
  KvCache* cache;
  int64_t pos;
};
using Rows = std::span<const RowPlace>;

// o (n,) = norm(x (n,)) with gain w (n,) and, for LayerNorm, bias b (n,) or none. o may be x.
void norm(float* o, const float* x, const float* w, const float* b, int64_t n, float eps, NormKind kind) {
  if (kind == NormKind::layer) {
    float mean = 0.0f;
    for (int64_t j = 0; j < n; ++j) mean += x[j];
    mean /= static_cast<float>(n);
    float var = 0.0f;
    for (int64_t j = 0; j < n; ++j) var += (x[j] - mean) * (x[j] - mean);
    var /= static_cast<float>(n);
    const float inv = 1.0f / std::sqrt(var + eps);
    for (int64_t j = 0; j < n; ++j) o[j] = (x[j] - mean) * inv * w[j] + (b ? b[j] : 0.0f);
    return;
  }
  float ss = 0.0f;
  for (int64_t j = 0; j < n; ++j) ss += x[j] * x[j];
  ss /= static_cast<float>(n);
  ss += eps;
  ss = 1.0f / std::sqrt(ss);
  if (kind == NormKind::rms_unit_offset)
    for (int64_t j = 0; j < n; ++j) o[j] = (1.0f + w[j]) * (ss * x[j]);
  else
    for (int64_t j = 0; j < n; ++j) o[j] = w[j] * (ss * x[j]);
}

// Rows of x [m, n] normalized into o [m, n] (o may be x); bias empty: none.
void norm_rows(float* o, const float* x, const std::vector<float>& w, const std::vector<float>& bias, int64_t m,
               int64_t n, float eps, NormKind kind) {
  for (int64_t i = 0; i < m; ++i)
    norm(o + i * n, x + i * n, w.data(), bias.empty() ? nullptr : bias.data(), n, eps, kind);
}

// y [m, n] += bias [n]; nothing when bias is empty.
void add_bias(float* y, const std::vector<float>& bias, int64_t m) {
  const auto n = static_cast<int64_t>(bias.size());
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) y[i * n + j] += bias[j];
}

// Rotates the first rope_dims dimensions of one head vec at position pos; the rest pass through.
void rope_head(float* vec, int64_t rope_dims, int64_t pos, const std::vector<float>& inv_freq, RopeStyle style) {
  const int64_t half = rope_dims / 2;
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

// The per-head norm (when head_norm is not empty), then RoPE, of rows x [m, heads * head_dim], each at its
// position.
void prepare_heads(float* x, Rows rows, int64_t heads, const ModelConfig& c, const ModelDesc& d, const LayerDesc& layer,
                   const std::vector<float>& head_norm) {
  const AttentionSpec& a = layer.attention;
  for (size_t i = 0; i < rows.size(); ++i)
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + (static_cast<int64_t>(i) * heads + h) * c.head_dim;
      if (!head_norm.empty()) norm(v, v, head_norm.data(), nullptr, c.head_dim, d.norm_eps, layer.norm);
      rope_head(v, a.rope_dims, rows[i].pos, d.rope_inv_freq[a.rope], d.rope_style);
    }
}

// out [m, q_dim]: GQA attention of q [m, q_dim], each row over its cache's keys/values up to its position (or,
// not causal, up to the pass's last position), with the layer's scale, logit soft-cap and window.
void attention(const ModelConfig& c, const AttentionSpec& spec, Rows rows, int64_t layer, const float* q, float* out,
               ThreadPool& pool) {
  const int64_t hd = c.head_dim, group = c.n_heads / c.n_kv_heads;
  int64_t last = 0;
  for (const RowPlace& r : rows) last = std::max(last, r.pos);
  pool.parallel_for(rows.size() * static_cast<size_t>(c.n_heads), 1, [&](size_t b, size_t e) {
    std::vector<float> att(static_cast<size_t>(last + 1));
    for (size_t task = b; task < e; ++task) {
      const int64_t i = static_cast<int64_t>(task) / c.n_heads, h = static_cast<int64_t>(task) % c.n_heads;
      const KvCache& cache = *rows[static_cast<size_t>(i)].cache;
      const int64_t p = rows[static_cast<size_t>(i)].pos, kv_off = (h / group) * hd;
      const int64_t first = spec.causal && spec.window > 0 ? std::max<int64_t>(0, p - spec.window + 1) : 0;
      const int64_t end = spec.causal ? p : last;  // the last key this row sees
      kernels::attend_head(q + (i * c.n_heads + h) * hd, cache.key(layer, first) + kv_off,
                           cache.value(layer, first) + kv_off, static_cast<size_t>(c.kv_dim()),
                           static_cast<size_t>(end - first + 1), static_cast<size_t>(hd), spec.scale, spec.softcap,
                           att.data(), out + (i * c.n_heads + h) * hd);
    }
  });
}

float gelu_tanh(float x) {
  const float k = std::sqrt(2.0f / std::numbers::pi_v<float>);
  return 0.5f * x * (1.0f + std::tanh(k * (x + 0.044715f * x * x * x)));
}

float gelu_erf(float x) { return 0.5f * x * (1.0f + std::erf(x / std::numbers::sqrt2_v<float>)); }

// gate [n] = act(gate) * up [n] for the gated activations (swiglu, geglu_tanh).
void gate_times_up(float* gate, const float* up, size_t n, Activation act) {
  if (act == Activation::swiglu) {
    for (size_t j = 0; j < n; ++j) {
      float val = gate[j];
      val *= 1.0f / (1.0f + std::exp(-val));
      gate[j] = val * up[j];
    }
  } else {
    for (size_t j = 0; j < n; ++j) gate[j] = gelu_tanh(gate[j]) * up[j];
  }
}

// Working memory for m rows, sized for the widest layer.
struct Scratch {
  std::vector<float> x, h, q, k, v, qkv, att, hb, hb2, fused;
  Scratch(const ModelConfig& c, int64_t m) {
    const auto n = [m](int64_t w) { return static_cast<size_t>(m * w); };
    x.resize(n(c.dim));
    h.resize(n(c.dim));
    q.resize(n(c.q_dim()));
    k.resize(n(c.kv_dim()));
    v.resize(n(c.kv_dim()));
    att.resize(n(c.q_dim()));
    hb.resize(n(c.hidden_dim));
    hb2.resize(n(c.hidden_dim));
  }
};

// Splits rows of a fused [m, sum(widths)] matrix into its parts.
void split_rows(const std::vector<float>& fused, int64_t m, std::initializer_list<std::pair<float*, int64_t>> parts) {
  int64_t width = 0;
  for (const auto& [dst, w] : parts) width += w;
  for (int64_t i = 0; i < m; ++i) {
    const float* row = fused.data() + i * width;
    for (const auto& [dst, w] : parts) {
      std::copy_n(row, w, dst + i * w);
      row += w;
    }
  }
}

// h [m, dim] = attention(h): projections, biases, q/k norms, RoPE, the cache, attention, output projection.
void attention_op(const Model& model, const LayerDesc& desc, const LayerWeights& w, int64_t l, Rows rows, Scratch& s,
                  ThreadPool& pool) {
  const ModelConfig& c = model.config;
  const auto m = static_cast<int64_t>(rows.size());
  // q [m, q_dim], k and v [m, kv_dim] = h [m, dim] @ W^T (or one fused [m, q_dim + 2 kv_dim] product, split)
  if (const kernels::CpuLinear* qkv = w.linear(Role::qkv)) {
    s.fused.resize(static_cast<size_t>(m * (c.q_dim() + 2 * c.kv_dim())));
    qkv->matmul(s.h.data(), m, s.fused.data(), pool);
    split_rows(s.fused, m, {{s.q.data(), c.q_dim()}, {s.k.data(), c.kv_dim()}, {s.v.data(), c.kv_dim()}});
  } else {
    w.linear(Role::q)->matmul(s.h.data(), m, s.q.data(), pool);
    w.linear(Role::k)->matmul(s.h.data(), m, s.k.data(), pool);
    w.linear(Role::v)->matmul(s.h.data(), m, s.v.data(), pool);
  }
  add_bias(s.q.data(), w.vector(Role::q_bias), m);
  add_bias(s.k.data(), w.vector(Role::k_bias), m);
  add_bias(s.v.data(), w.vector(Role::v_bias), m);
  prepare_heads(s.q.data(), rows, c.n_heads, c, model.desc, desc, w.vector(Role::q_norm));
  prepare_heads(s.k.data(), rows, c.n_kv_heads, c, model.desc, desc, w.vector(Role::k_norm));
  for (int64_t i = 0; i < m; ++i) {
    const RowPlace& r = rows[static_cast<size_t>(i)];
    std::copy_n(s.k.data() + i * c.kv_dim(), c.kv_dim(), r.cache->key(l, r.pos));
    std::copy_n(s.v.data() + i * c.kv_dim(), c.kv_dim(), r.cache->value(l, r.pos));
  }
  attention(c, desc.attention, rows, l, s.q.data(), s.att.data(), pool);
  // h [m, dim] = att [m, q_dim] @ Wo^T (+ o_bias)
  w.linear(Role::o)->matmul(s.att.data(), m, s.h.data(), pool);
  add_bias(s.h.data(), w.vector(Role::o_bias), m);
}

// h [m, dim] = mlp(h): gated (swiglu, geglu_tanh: act(h @ Wgate^T) * (h @ Wup^T)) or plain (gelu_erf:
// gelu(h @ Wup^T + up_bias)), then @ Wdown^T (+ down_bias).
void mlp_op(const ModelConfig& c, const LayerDesc& desc, const LayerWeights& w, Scratch& s, int64_t m,
            ThreadPool& pool) {
  const int64_t hidden = c.hidden_dim;
  if (desc.activation == Activation::gelu_erf) {
    w.linear(Role::up)->matmul(s.h.data(), m, s.hb.data(), pool);
    add_bias(s.hb.data(), w.vector(Role::up_bias), m);
    for (float& val : s.hb) val = gelu_erf(val);
  } else {
    // hb = gate [m, hidden], hb2 = up [m, hidden] (or one fused [m, 2 hidden] product, split)
    if (const kernels::CpuLinear* gate_up = w.linear(Role::gate_up)) {
      s.fused.resize(static_cast<size_t>(m * 2 * hidden));
      gate_up->matmul(s.h.data(), m, s.fused.data(), pool);
      split_rows(s.fused, m, {{s.hb.data(), hidden}, {s.hb2.data(), hidden}});
    } else {
      w.linear(Role::gate)->matmul(s.h.data(), m, s.hb.data(), pool);
      w.linear(Role::up)->matmul(s.h.data(), m, s.hb2.data(), pool);
    }
    gate_times_up(s.hb.data(), s.hb2.data(), s.hb.size(), desc.activation);
  }
  // h [m, dim] = hb [m, hidden] @ Wdown^T (+ down_bias)
  w.linear(Role::down)->matmul(s.hb.data(), m, s.h.data(), pool);
  add_bias(s.h.data(), w.vector(Role::down_bias), m);
}

// The experts a row of router logits [n_experts] picks and their weights, by the layer's MoeSpec: softmax over
// all experts, the top_k largest probabilities (ties: the lower index, as torch.topk), renormalised if asked.
struct Route {
  int64_t expert;
  float weight;
};
void route_row(const float* logits, const MoeSpec& spec, std::vector<float>& p, std::vector<int64_t>& order,
               std::vector<Route>& out) {
  const auto n = static_cast<size_t>(spec.n_experts);
  const float max = *std::max_element(logits, logits + n);
  float sum = 0.0f;
  for (size_t e = 0; e < n; ++e) sum += p[e] = std::exp(logits[e] - max);
  for (size_t e = 0; e < n; ++e) p[e] /= sum;
  for (size_t e = 0; e < n; ++e) order[e] = static_cast<int64_t>(e);
  std::partial_sort(order.begin(), order.begin() + spec.top_k, order.end(),
                    [&](int64_t a, int64_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
  float chosen = 0.0f;
  for (int64_t j = 0; j < spec.top_k; ++j) chosen += p[order[j]];
  out.clear();
  for (int64_t j = 0; j < spec.top_k; ++j)
    out.push_back({order[j], spec.renormalise ? p[order[j]] / chosen : p[order[j]]});
}

// h [m, dim] = moe(h): each row routed to its top-k experts; then, expert by expert, the rows routed to it are
// gathered [r, dim], run through its gated MLP as one batch (a prefill's tokens or a decode step's sequences: one
// matmul per expert, not per row; experts no row chose are not touched), and added into the output weighted, in
// expert order as transformers adds them.
void moe_op(const ModelConfig& c, const LayerDesc& desc, const LayerWeights& w, Scratch& s, int64_t m,
            ThreadPool& pool) {
  const MoeSpec& spec = desc.moe;
  const int64_t dim = c.dim, hidden = c.expert_hidden_dim;
  // logits [m, n_experts] = h [m, dim] @ Wrouter^T
  std::vector<float> logits(static_cast<size_t>(m * spec.n_experts));
  w.linear(Role::router)->matmul(s.h.data(), m, logits.data(), pool);
  struct RoutedRow {
    int64_t row;
    float weight;
  };
  std::vector<std::vector<RoutedRow>> rows_of(static_cast<size_t>(spec.n_experts));
  std::vector<float> p(static_cast<size_t>(spec.n_experts));
  std::vector<int64_t> order(static_cast<size_t>(spec.n_experts));
  std::vector<Route> picked;
  for (int64_t i = 0; i < m; ++i) {
    route_row(logits.data() + i * spec.n_experts, spec, p, order, picked);
    for (const Route& r : picked) rows_of[static_cast<size_t>(r.expert)].push_back({i, r.weight});
  }
  std::vector<float> out(static_cast<size_t>(m * dim), 0.0f), in, gate, up, y;
  for (size_t e = 0; e < rows_of.size(); ++e) {
    const std::vector<RoutedRow>& rows = rows_of[e];
    const ExpertWeights& ex = w.experts[e];
    if (rows.empty() || !ex.gate) continue;  // no row chose it, or another rank holds it (shard.h)
    const auto r = static_cast<int64_t>(rows.size());
    // in [r, dim] = the routed rows of h; gate, up [r, hidden]; y [r, dim] = act(gate) * up @ Wdown^T
    in.resize(static_cast<size_t>(r * dim));
    gate.resize(static_cast<size_t>(r * hidden));
    up.resize(gate.size());
    y.resize(in.size());
    for (int64_t j = 0; j < r; ++j) std::copy_n(s.h.data() + rows[j].row * dim, dim, in.data() + j * dim);
    ex.gate->matmul(in.data(), r, gate.data(), pool);
    ex.up->matmul(in.data(), r, up.data(), pool);
    gate_times_up(gate.data(), up.data(), gate.size(), desc.activation);
    ex.down->matmul(gate.data(), r, y.data(), pool);
    for (int64_t j = 0; j < r; ++j)
      for (int64_t d = 0; d < dim; ++d) out[rows[j].row * dim + d] += rows[j].weight * y[j * dim + d];
  }
  std::copy(out.begin(), out.end(), s.h.begin());
}

// data [n] <- its sum over the ranks of a sharded model (shard.h).
void all_reduce(const Model& model, float* data, size_t n) {
  if (!model.shard.comm) fail(Errc::internal, "[forward] an all_reduce op in a model that is not sharded");
  model.shard.comm->all_reduce(data, n);
}

void run_layer(const Model& model, int64_t l, Rows rows, Scratch& s, ThreadPool& pool) {
  const ModelConfig& c = model.config;
  const auto m = static_cast<int64_t>(rows.size());
  const LayerDesc& desc = model.desc.layers[l];
  const LayerWeights& w = model.layers[l];
  for (const Op& op : desc.ops) {
    switch (op.kind) {
      case Op::Kind::norm: {
        const std::vector<float>& in = op.in == Reg::x ? s.x : s.h;
        static const std::vector<float> kNone;
        const std::vector<float>& bias = op.bias == Role::count ? kNone : w.vector(op.bias);
        norm_rows(s.h.data(), in.data(), w.vector(op.weight), bias, m, c.dim, model.desc.norm_eps, desc.norm);
        break;
      }
      case Op::Kind::attention: attention_op(model, desc, w, l, rows, s, pool); break;
      case Op::Kind::mlp: mlp_op(c, desc, w, s, m, pool); break;
      case Op::Kind::moe: moe_op(c, desc, w, s, m, pool); break;
      case Op::Kind::add:
        for (size_t j = 0; j < s.x.size(); ++j) s.x[j] += s.h[j];
        break;
      case Op::Kind::all_reduce: all_reduce(model, s.h.data(), static_cast<size_t>(m * c.dim)); break;
    }
  }
}

// Runs hidden states x [m, dim] of rows at their places through layers [layer_begin, layer_end), in place.
void run_layers(const Model& model, Rows rows, float* x, int64_t layer_begin, int64_t layer_end, ThreadPool& pool) {
  const ModelConfig& c = model.config;
  if (layer_begin < 0 || layer_begin > layer_end || layer_end > c.n_layers)
    fail(Errc::internal, "[forward] layers {}..{} outside 0..{}", layer_begin, layer_end, c.n_layers);
  const auto m = static_cast<int64_t>(rows.size());
  Scratch s(c, m);
  std::copy_n(x, m * c.dim, s.x.data());
  for (int64_t l = layer_begin; l < layer_end; ++l) run_layer(model, l, rows, s, pool);
  std::copy_n(s.x.data(), m * c.dim, x);
}

// Consecutive positions pos..pos+m-1 of one cache: a prefill's rows.
std::vector<RowPlace> consecutive(KvCache& cache, int64_t m, int64_t pos) {
  if (m < 1 || pos < 0 || pos + m > cache.capacity())
    fail(Errc::limit, "[forward] positions {}..{} exceed the context of {}", pos, pos + m, cache.capacity());
  std::vector<RowPlace> rows(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) rows[static_cast<size_t>(i)] = {&cache, pos + i};
  return rows;
}

// logits [rows, vocab] = norm(x [rows, dim]) @ Wlm^T, soft-capped where the family says.
void head(const Model& model, const float* x, int64_t rows, float* logits, ThreadPool& pool) {
  const ModelConfig& c = model.config;
  const ModelDesc& d = model.desc;
  std::vector<float> xn(static_cast<size_t>(rows * c.dim));
  norm_rows(xn.data(), x, model.final_norm, model.final_norm_bias, rows, c.dim, d.norm_eps, d.final_norm);
  if (!model.shard.comm) {
    model.lm_head->matmul(xn.data(), rows, logits, pool);
  } else {
    // this rank's columns [vocab_begin, + head rows) of zeroed logits rows, summed over the ranks
    const int64_t n = model.lm_head->rows();
    std::vector<float> local(static_cast<size_t>(rows * n));
    model.lm_head->matmul(xn.data(), rows, local.data(), pool);
    std::fill_n(logits, rows * c.vocab, 0.0f);
    for (int64_t i = 0; i < rows; ++i)
      std::copy_n(local.data() + i * n, n, logits + i * c.vocab + model.shard.vocab_begin);
    all_reduce(model, logits, static_cast<size_t>(rows * c.vocab));
  }
  if (d.final_softcap > 0.0f)
    for (int64_t j = 0; j < rows * c.vocab; ++j) logits[j] = d.final_softcap * std::tanh(logits[j] / d.final_softcap);
}

}  // namespace

// x [m, dim] = the embeddings of tokens (scaled by the family's embed_scale). A rank of a sharded model holds the
// rows [vocab_begin, vocab_begin + rows): the others embed to zeros there, and the all-reduce sums the ranks' rows.
std::vector<float> embed(const Model& model, std::span<const int32_t> tokens) {
  const auto dim = static_cast<size_t>(model.config.dim);
  std::vector<float> x(tokens.size() * dim);
  if (!model.shard.comm) {
    model.embed->gather_rows(tokens, x.data());
  } else {
    const int64_t begin = model.shard.vocab_begin, end = begin + model.embed->rows();
    std::vector<int32_t> local;
    std::vector<size_t> at;
    for (size_t i = 0; i < tokens.size(); ++i)
      if (tokens[i] >= begin && tokens[i] < end) {
        local.push_back(static_cast<int32_t>(tokens[i] - begin));
        at.push_back(i);
      }
    std::vector<float> rows(local.size() * dim);
    if (!local.empty()) model.embed->gather_rows(local, rows.data());
    for (size_t j = 0; j < at.size(); ++j) std::copy_n(rows.data() + j * dim, dim, x.data() + at[j] * dim);
  }
  if (model.desc.embed_scale != 1.0f)
    for (float& val : x) val *= model.desc.embed_scale;
  if (model.shard.comm) all_reduce(model, x.data(), x.size());
  return x;
}

void forward_layers(const Model& model, KvCache& cache, float* x, int64_t m, int64_t pos, int64_t layer_begin,
                    int64_t layer_end, ThreadPool& pool) {
  run_layers(model, consecutive(cache, m, pos), x, layer_begin, layer_end, pool);
}

void forward(const Model& model, KvCache& cache, std::span<const int32_t> tokens, int64_t pos, float* logits,
             bool all_logits, ThreadPool& pool) {
  if (model.device) return model.device->forward(cache, tokens, pos, logits, all_logits);
  forward_embeddings(model, cache, embed(model, tokens), pos, logits, all_logits, pool);
}

void forward_embeddings(const Model& model, KvCache& cache, std::vector<float> x, int64_t pos, float* logits,
                        bool all_logits, ThreadPool& pool) {
  const auto m = static_cast<int64_t>(x.size()) / model.config.dim;
  if (m < 1 || m * model.config.dim != static_cast<int64_t>(x.size()))
    fail(Errc::internal, "[forward] {} input values are not whole rows of {}", x.size(), model.config.dim);
  if (model.device) return model.device->forward_embeddings(cache, x, pos, logits, all_logits);
  const std::vector<RowPlace> rows = consecutive(cache, m, pos);
  run_layers(model, rows, x.data(), 0, model.config.n_layers, pool);
  // every row's logits, or just the last one's
  const int64_t first = all_logits ? 0 : m - 1;
  head(model, x.data() + first * model.config.dim, m - first, logits, pool);
}

void forward_rows(const Model& model, std::span<KvCache* const> caches, std::span<const int32_t> tokens,
                  std::span<const int64_t> pos, float* logits, ThreadPool& pool) {
  if (model.device) fail(Errc::usage, "[forward_rows] runs on the CPU; the model runs through use_device()");
  if (tokens.empty() || caches.size() != tokens.size() || pos.size() != tokens.size())
    fail(Errc::internal, "[forward_rows] {} tokens, {} caches, {} positions: expected as many, at least one",
         tokens.size(), caches.size(), pos.size());
  std::vector<RowPlace> rows(tokens.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    if (!caches[i]) fail(Errc::internal, "[forward_rows] row {} has no cache", i);
    if (pos[i] < 0 || pos[i] >= caches[i]->capacity())
      fail(Errc::limit, "[forward_rows] row {}: position {} outside the context of {}", i, pos[i],
           caches[i]->capacity());
    rows[i] = {caches[i], pos[i]};
  }
  std::vector<float> x = embed(model, tokens);
  run_layers(model, rows, x.data(), 0, model.config.n_layers, pool);
  head(model, x.data(), static_cast<int64_t>(rows.size()), logits, pool);
}

}  // namespace lowbit::model
