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
  if (c.sliding_window < 0) fail(Errc::format, "[load_model] {}: sliding_window {} is negative", source, c.sliding_window);
  for (int32_t id : c.eos_ids)
    if (id < 0 || id >= c.vocab) fail(Errc::format, "[load_model] {}: eos id {} outside the vocabulary", source, id);
}

std::vector<float> rope_inv_freq(const ModelConfig& c) {
  const int64_t half = c.head_dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  for (int64_t j = 0; j < half; ++j)
    inv[j] = 1.0f / std::pow(static_cast<float>(c.rope_theta), static_cast<float>(2 * j) / static_cast<float>(c.head_dim));
  const auto& s = c.rope_scaling;
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

}  // namespace lowbit::model
