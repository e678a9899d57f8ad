#include "lowbit/quant/fold.h"

#include <cmath>
#include <map>

#include "lowbit/codec/hadamard.h"
#include "lowbit/core/error.h"
#include "lowbit/core/thread_pool.h"

namespace lowbit::quant {

namespace {

using Weights = std::map<std::string, std::vector<float>, std::less<>>;

std::vector<float>& at(Weights& w, const std::string& name) {
  const auto it = w.find(name);
  if (it == w.end()) fail(Errc::format, "[fold] tensor '{}' missing", name);
  return it->second;
}

// W [rows, cols] <- W diag(g): the gain folded into the columns that read the normalized stream.
void scale_columns(std::vector<float>& w, const std::vector<float>& g) {
  const size_t cols = g.size();
  for (size_t i = 0; i < w.size(); ++i) w[i] *= g[i % cols];
}

// Each row r of W [rows, n] <- R r: for readers (W R^T has rows R w_r) and for the embedding (rows are tokens).
void rotate_rows(std::vector<float>& w, const codec::hadamard::RandomizedHadamard& r) {
  const int64_t n = r.size();
  const auto rows = static_cast<int64_t>(w.size()) / n;
  default_pool().parallel_for(static_cast<size_t>(rows), 16, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) r.forward(w.data() + i * n);
  });
}

// W [n, cols] <- R W: for the writers, whose output lands in the stream.
void rotate_columns(std::vector<float>& w, const codec::hadamard::RandomizedHadamard& r) {
  const int64_t n = r.size();
  const auto cols = static_cast<int64_t>(w.size()) / n;
  default_pool().parallel_for(static_cast<size_t>(cols), 16, [&](size_t b, size_t e) {
    std::vector<float> col(static_cast<size_t>(n));
    for (size_t c = b; c < e; ++c) {
      for (int64_t i = 0; i < n; ++i) col[i] = w[i * cols + c];
      r.forward(col.data());
      for (int64_t i = 0; i < n; ++i) w[i * cols + c] = col[i];
    }
  });
}

}  // namespace

FoldResult fold_and_rotate(const model::Model& source, uint64_t seed) {
  const model::ModelConfig& c = source.config;
  if (c.rope_style != model::RopeStyle::half) fail(Errc::internal, "[fold] expects HF's half RoPE layout");
  if (!codec::hadamard::is_supported(c.dim))
    fail(Errc::unsupported, "[fold] no Hadamard matrix of order {} (the model width)", c.dim);
  const codec::hadamard::RandomizedHadamard rot(c.dim, seed);
  FoldResult out;
  out.seed = seed;

  Weights w;
  std::vector<std::pair<std::string, Shape>> order;
  for (const auto& t : source.tensors) {
    w.emplace(t.name, codec::decode_all(t.ref));
    order.emplace_back(t.name, t.ref.shape);
  }
  // The head needs the final norm's gain, the embedding must not: a tied pair becomes two tensors.
  if (c.tied_embeddings) {
    w["lm_head.weight"] = at(w, "model.embed_tokens.weight");
    order.emplace_back("lm_head.weight", Shape{c.vocab, c.dim});
    out.deviations.push_back("embedding and head untied: the head carries the folded final norm gain");
  }
  const auto ones = [&](const std::string& name) { std::fill(at(w, name).begin(), at(w, name).end(), 1.0f); };
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const auto n = [l](const char* s) { return fmt::format("model.layers.{}.{}", l, s); };
    const std::vector<float> g_attn = at(w, n("input_layernorm.weight"));
    const std::vector<float> g_ffn = at(w, n("post_attention_layernorm.weight"));
    for (const char* p : {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"}) {
      scale_columns(at(w, n(p)), g_attn);
      rotate_rows(at(w, n(p)), rot);
    }
    for (const char* p : {"mlp.gate_proj.weight", "mlp.up_proj.weight"}) {
      scale_columns(at(w, n(p)), g_ffn);
      rotate_rows(at(w, n(p)), rot);
    }
    rotate_columns(at(w, n("self_attn.o_proj.weight")), rot);
    rotate_columns(at(w, n("mlp.down_proj.weight")), rot);
    ones(n("input_layernorm.weight"));
    ones(n("post_attention_layernorm.weight"));
  }
  scale_columns(at(w, "lm_head.weight"), at(w, "model.norm.weight"));
  rotate_rows(at(w, "lm_head.weight"), rot);
  ones("model.norm.weight");
  rotate_rows(at(w, "model.embed_tokens.weight"), rot);

  model::ModelBuilder b;
  for (auto& [name, shape] : order) b.add_f32(name, shape, std::move(at(w, name)));
  model::ModelConfig folded = c;
  folded.tied_embeddings = false;
  out.model = b.finish(folded, "fold");
  return out;
}

double mean_kld(const model::Model& a, const model::Model& b, const std::vector<std::vector<int32_t>>& windows) {
  const int64_t vocab = a.config.vocab;
  double total = 0;
  int64_t count = 0;
  for (const auto& tokens : windows) {
    const auto m = static_cast<int64_t>(tokens.size());
    std::vector<float> la(static_cast<size_t>(m * vocab)), lb(la.size());
    model::KvCache ca(a.config, m), cb(b.config, m);
    model::forward(a, ca, tokens, 0, la.data(), true, default_pool());
    model::forward(b, cb, tokens, 0, lb.data(), true, default_pool());
    for (int64_t i = 0; i < m; ++i) {
      const float* pa = la.data() + i * vocab;
      const float* pb = lb.data() + i * vocab;
      double ma = -INFINITY, mb = -INFINITY;
      for (int64_t v = 0; v < vocab; ++v) {
        ma = std::max<double>(ma, pa[v]);
        mb = std::max<double>(mb, pb[v]);
      }
      double za = 0, zb = 0;
      for (int64_t v = 0; v < vocab; ++v) {
        za += std::exp(pa[v] - ma);
        zb += std::exp(pb[v] - mb);
      }
      const double lza = std::log(za) + ma, lzb = std::log(zb) + mb;
      double kl = 0;
      for (int64_t v = 0; v < vocab; ++v) {
        const double lpa = pa[v] - lza, lpb = pb[v] - lzb;
        kl += std::exp(lpa) * (lpa - lpb);
      }
      total += std::max(0.0, kl);
      ++count;
    }
  }
  return count ? total / static_cast<double>(count) : 0.0;
}

}  // namespace lowbit::quant
