#include "lowbit/model/config.h"

#include <cmath>
#include <numbers>

#include "lowbit/core/error.h"

namespace lowbit::model {

namespace {

// Bounds that keep every derived size far from overflow and refuse nonsense headers early.
constexpr int64_t kMaxDim = 1 << 16;
constexpr int64_t kMaxLayers = 1024;
constexpr int64_t kMaxVocab = 1 << 22;
constexpr int64_t kMaxSeq = 1 << 20;
constexpr int64_t kMaxHidden = 1 << 18;

void check_range(int64_t v, int64_t lo, int64_t hi, std::string_view field, std::string_view source) {
  if (v < lo || v > hi) fail(Errc::limit, "[load_model] {}: {} = {} outside [{}, {}]", source, field, v, lo, hi);
}

}  // namespace

void validate_config(const ModelConfig& c, std::string_view source) {
  check_range(c.dim, 1, kMaxDim, "dim", source);
  check_range(c.n_layers, 1, kMaxLayers, "n_layers", source);
  check_range(c.n_heads, 1, kMaxDim, "n_heads", source);
  check_range(c.n_kv_heads, 1, c.n_heads, "n_kv_heads", source);
  check_range(c.head_dim, 2, kMaxDim, "head_dim", source);
  check_range(c.hidden_dim, 1, kMaxHidden, "hidden_dim", source);
  check_range(c.vocab, 1, kMaxVocab, "vocab", source);
  check_range(c.max_seq, 1, kMaxSeq, "max_seq", source);
  check_range(c.q_dim(), 1, kMaxHidden, "n_heads * head_dim", source);
  if (c.n_heads % c.n_kv_heads != 0)
    fail(Errc::format, "[load_model] {}: n_heads {} is not a multiple of n_kv_heads {}", source, c.n_heads, c.n_kv_heads);
  if (c.head_dim % 2 != 0) fail(Errc::format, "[load_model] {}: head_dim {} is odd", source, c.head_dim);
  if (!(c.rope_theta > 0) || !std::isfinite(c.rope_theta))
    fail(Errc::format, "[load_model] {}: rope_theta {} is not positive", source, c.rope_theta);
  if (!(c.norm_eps >= 0) || !std::isfinite(c.norm_eps))
    fail(Errc::format, "[load_model] {}: norm eps {} is not a finite non-negative number", source, c.norm_eps);
  const auto& s = c.rope_scaling;
  if (s.kind != RopeScaling::Kind::none && (!(s.factor > 0) || !std::isfinite(s.factor)))
    fail(Errc::format, "[load_model] {}: rope_scaling.factor {} is not positive", source, s.factor);
  if (s.kind == RopeScaling::Kind::llama3 &&
      (!(s.high_freq_factor > s.low_freq_factor) || !(s.low_freq_factor > 0) || s.original_max_position <= 0))
    fail(Errc::format, "[load_model] {}: rope_scaling needs 0 < low_freq_factor < high_freq_factor and a positive "
         "original_max_position_embeddings", source);
  if (c.rope_dims < 0 || c.rope_dims > c.head_dim || c.rope_dims % 2 != 0)
    fail(Errc::format, "[load_model] {}: rope_dims {} is not an even number up to head_dim {}", source, c.rope_dims,
         c.head_dim);
  if (s.kind == RopeScaling::Kind::longrope &&
      (static_cast<int64_t>(s.short_factor.size()) * 2 != c.rotary_dims() ||
       static_cast<int64_t>(s.long_factor.size()) * 2 != c.rotary_dims() || s.original_max_position <= 0))
    fail(Errc::format, "[load_model] {}: rope_scaling longrope needs short_factor and long_factor of {} values and a "
         "positive original_max_position_embeddings", source, c.rotary_dims() / 2);
  if (c.sliding_window < 0) fail(Errc::format, "[load_model] {}: sliding_window {} is negative", source, c.sliding_window);
  if (!c.sliding_layers.empty() && static_cast<int64_t>(c.sliding_layers.size()) != c.n_layers)
    fail(Errc::format, "[load_model] {}: {} layer types for {} layers", source, c.sliding_layers.size(), c.n_layers);
  if (c.rope_local_theta < 0 || !std::isfinite(c.rope_local_theta))
    fail(Errc::format, "[load_model] {}: local rope_theta {} is not positive", source, c.rope_local_theta);
  for (const auto& [value, field] : {std::pair{c.attn_scale, "attention scale"}, {c.attn_softcap, "attn_logit_softcapping"},
                                     {c.final_softcap, "final_logit_softcapping"}})
    if (!(value >= 0) || !std::isfinite(value))
      fail(Errc::format, "[load_model] {}: {} {} is not a finite non-negative number", source, field, value);
  for (int32_t id : c.eos_ids)
    if (id < 0 || id >= c.vocab) fail(Errc::format, "[load_model] {}: eos id {} outside the vocabulary", source, id);
}

std::vector<float> rope_inv_freq(double theta, int64_t dims, const RopeScaling& s, int64_t context) {
  const int64_t half = dims / 2;
  const bool longrope = s.kind == RopeScaling::Kind::longrope;
  const std::vector<float>& ext = context > s.original_max_position ? s.long_factor : s.short_factor;
  if (longrope && static_cast<int64_t>(ext.size()) != half)
    fail(Errc::internal, "[rope] longrope has {} factors for {} rotated dimensions", ext.size(), dims);
  std::vector<float> inv(static_cast<size_t>(half));
  for (int64_t j = 0; j < half; ++j) {
    const float base = std::pow(static_cast<float>(theta), static_cast<float>(2 * j) / static_cast<float>(dims));
    // HF's _compute_longrope_parameters: 1 / (ext * base^(2j/dims)), in that order.
    inv[j] = 1.0f / (longrope ? ext[j] * base : base);
  }
  const float factor = static_cast<float>(s.factor);
  if (s.kind == RopeScaling::Kind::linear) {
    for (float& f : inv) f /= factor;
  } else if (s.kind == RopeScaling::Kind::llama3) {
    // HF's _compute_llama3_parameters: long wavelengths are scaled, short ones kept, the band between blended.
    const double old_ctx = static_cast<double>(s.original_max_position);
    const double low_wavelen = old_ctx / s.low_freq_factor;
    const double high_wavelen = old_ctx / s.high_freq_factor;
    for (float& f : inv) {
      const double wavelen = 2.0 * std::numbers::pi / f;
      if (wavelen > low_wavelen) {
        f /= factor;
      } else if (wavelen >= high_wavelen) {
        const float smooth = static_cast<float>((old_ctx / wavelen - s.low_freq_factor) /
                                                (s.high_freq_factor - s.low_freq_factor));
        f = (1.0f - smooth) * f / factor + smooth * f;
      }
    }
  }
  return inv;
}

std::vector<float> rope_inv_freq(const ModelConfig& c) {
  return rope_inv_freq(c.rope_theta, c.rotary_dims(), c.rope_scaling, c.max_seq);
}

}  // namespace lowbit::model
