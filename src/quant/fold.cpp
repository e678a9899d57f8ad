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

// The input whose linears read the output of a pre-norm op (the op after it), by the description.
model::LinearInput norm_reader(const model::LayerDesc& layer, size_t op, std::string_view arch) {
  const model::Op::Kind next = op + 1 < layer.ops.size() ? layer.ops[op + 1].kind : model::Op::Kind::add;
  if (next == model::Op::Kind::attention) return model::LinearInput::attn_in;
  if (next == model::Op::Kind::mlp || next == model::Op::Kind::moe) return model::LinearInput::ffn_in;
  fail(Errc::unsupported, "[fold] {}: a norm of the residual stream that feeds no attention or MLP cannot be folded",
       arch);
}

// The gain a norm applies, given its stored weight: w for RMSNorm, 1 + w for Gemma's unit-offset RMSNorm.
// After the fold the stored weight becomes the one that applies a gain of 1.
float applied_gain(model::NormKind kind, float w) { return kind == model::NormKind::rms_unit_offset ? 1.0f + w : w; }
float unit_gain_weight(model::NormKind kind) { return kind == model::NormKind::rms_unit_offset ? 0.0f : 1.0f; }

void refuse_unfoldable(model::NormKind kind, std::string_view arch, std::string_view what) {
  if (kind == model::NormKind::layer)
    fail(Errc::unsupported, "[fold] {}: the {} is a LayerNorm, which subtracts the mean and so does not commute "
         "with the rotation; quantize without rotation", arch, what);
}

}  // namespace

FoldResult fold_and_rotate(const model::Model& source, uint64_t seed) {
  const model::ModelConfig& c = source.config;
  const model::ModelDesc& d = source.desc;
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
  const std::string head(model::kLmHeadTensor), embed(model::kEmbedTensor), final_norm(model::kFinalNormTensor);
  // The head needs the final norm's gain, the embedding must not: a tied pair becomes two tensors.
  if (c.tied_embeddings) {
    w[head] = at(w, embed);
    order.emplace_back(head, Shape{c.vocab, c.dim});
    out.deviations.push_back("embedding and head untied: the head carries the folded final norm gain");
  }
  // gain [n] applied to the norm's output, then the stored weight set to apply 1.
  const auto take_gain = [&](const std::string& name, model::NormKind kind) {
    std::vector<float>& stored = at(w, name);
    std::vector<float> gain(stored.size());
    for (size_t j = 0; j < stored.size(); ++j) gain[j] = applied_gain(kind, stored[j]);
    std::fill(stored.begin(), stored.end(), unit_gain_weight(kind));
    return gain;
  };
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const model::LayerDesc& layer = d.layers[static_cast<size_t>(l)];
    const auto name = [&](model::Role r) { return model::hf_tensor_name(l, *layer.find(r)); };
    // Pre-norms (of the stream x) fold into the linears that read them; a norm of the branch h (Gemma's post
    // norms) would have to commute with the rotation with its gain in place, which it does not.
    for (size_t i = 0; i < layer.ops.size(); ++i) {
      const model::Op& op = layer.ops[i];
      if (op.kind != model::Op::Kind::norm) continue;
      refuse_unfoldable(layer.norm, c.arch, model::role_name(op.weight));
      if (op.in == model::Reg::h)
        fail(Errc::unsupported, "[fold] {}: the {} normalizes the branch before the residual add, which does not "
             "commute with the rotation; quantize without rotation", c.arch, model::role_name(op.weight));
      const model::LinearInput reader = norm_reader(layer, i, c.arch);
      const std::vector<float> gain = take_gain(name(op.weight), layer.norm);
      // An MoE block's router and experts all read the ffn norm's output.
      const auto reads_norm = [&](model::Role r) {
        const auto input = model::linear_input(r);
        return input == reader || (reader == model::LinearInput::ffn_in && input == model::LinearInput::expert_in);
      };
      for (const model::TensorSpec& t : layer.tensors)
        if (reads_norm(t.role)) scale_columns(at(w, model::hf_tensor_name(l, t)), gain);
    }
    // Readers of the stream store W R^T; writers (and their biases) store R W.
    for (const model::TensorSpec& t : layer.tensors) {
      const std::string n = model::hf_tensor_name(l, t);
      const auto input = model::linear_input(t.role);
      if (input == model::LinearInput::attn_in || input == model::LinearInput::ffn_in ||
          input == model::LinearInput::expert_in)
        rotate_rows(at(w, n), rot);
      if (input == model::LinearInput::attn_out || input == model::LinearInput::ffn_mid ||
          input == model::LinearInput::expert_mid)
        rotate_columns(at(w, n), rot);
      if (t.role == model::Role::o_bias || t.role == model::Role::down_bias) rotate_rows(at(w, n), rot);
    }
  }
  refuse_unfoldable(d.final_norm, c.arch, "final norm");
  scale_columns(at(w, head), take_gain(final_norm, d.final_norm));
  rotate_rows(at(w, head), rot);
  rotate_rows(at(w, embed), rot);

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
