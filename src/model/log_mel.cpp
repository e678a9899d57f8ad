#include "lowbit/model/log_mel.h"

#include <algorithm>
#include <cmath>
#include <complex>
#include <numbers>

#include "lowbit/core/error.h"
#include "lowbit/core/fft.h"

namespace lowbit::model {

namespace {

using nlohmann::json;

// transformers' audio_utils.hertz_to_mel / mel_to_hertz, mel_scale "slaney".
double hz_to_mel(double hz) {
  return hz < 1000.0 ? 3.0 * hz / 200.0 : 15.0 + std::log(hz / 1000.0) * (27.0 / std::log(6.4));
}
double mel_to_hz(double mel) {
  return mel < 15.0 ? 200.0 * mel / 3.0 : 1000.0 * std::exp(std::log(6.4) / 27.0 * (mel - 15.0));
}

// mel_filter_bank(1 + n_fft / 2, bins, 0, rate / 2, rate, norm="slaney", mel_scale="slaney"): [freqs, bins], as
// transformers computes it in float64 and the extractor then uses in float32.
std::vector<float> mel_filters(const MelOptions& o) {
  const int64_t freqs = o.n_fft / 2 + 1, n = o.bins;
  const double mel_max = hz_to_mel(static_cast<double>(o.sample_rate) / 2);
  std::vector<double> edges(static_cast<size_t>(n + 2));
  for (int64_t i = 0; i < n + 2; ++i)
    edges[static_cast<size_t>(i)] = mel_to_hz(mel_max * static_cast<double>(i) / static_cast<double>(n + 1));
  std::vector<float> out(static_cast<size_t>(freqs * n));
  const int64_t nyquist = o.sample_rate / 2;  // linspace(0, sampling_rate // 2, freqs), as transformers
  for (int64_t f = 0; f < freqs; ++f) {
    const double hz = static_cast<double>(nyquist) * static_cast<double>(f) / static_cast<double>(freqs - 1);
    for (int64_t m = 0; m < n; ++m) {
      const auto e = [&](int64_t k) { return edges[static_cast<size_t>(m + k)]; };
      const double down = (hz - e(0)) / (e(1) - e(0)), up = (e(2) - hz) / (e(2) - e(1));
      out[static_cast<size_t>(f * n + m)] =
          static_cast<float>(std::max(0.0, std::min(down, up)) * (2.0 / (e(2) - e(0))));
    }
  }
  return out;
}

int64_t field(const json& j, const char* key, int64_t fallback, int64_t lo, int64_t hi, std::string_view source) {
  if (!j.contains(key)) return fallback;
  const json& v = j.at(key);
  if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > hi)
    fail(Errc::format, "[log_mel] {}: {} must be an integer in [{}, {}]", source, key, lo, hi);
  return v.get<int64_t>();
}

}  // namespace

MelOptions parse_mel_options(const json& p, std::string_view source) {
  if (!p.is_object()) fail(Errc::format, "[log_mel] {}: not a JSON object", source);
  if (p.contains("feature_extractor_type")) {
    const json& type = p.at("feature_extractor_type");
    if (!type.is_string() ||
        (type.get<std::string>() != "WhisperFeatureExtractor" && type.get<std::string>() != "Qwen3ASRFeatureExtractor"))
      fail(Errc::unsupported,
           "[log_mel] {}: feature_extractor_type {} (WhisperFeatureExtractor or "
           "Qwen3ASRFeatureExtractor expected)",
           source, type.dump());
  }
  if (p.contains("dither") && (!p.at("dither").is_number() || p.at("dither").get<double>() != 0.0))
    fail(Errc::unsupported, "[log_mel] {}: dither {} (lowbit computes features without dither)", source,
         p.at("dither").dump());
  MelOptions o;
  o.bins = field(p, "feature_size", o.bins, 1, 1024, source);
  o.sample_rate = field(p, "sampling_rate", o.sample_rate, 1000, 384000, source);
  o.n_fft = field(p, "n_fft", o.n_fft, 2, 1 << 16, source);
  o.hop = field(p, "hop_length", o.hop, 1, o.n_fft, source);
  o.min_samples = field(p, "min_length", o.min_samples, 0, int64_t{1} << 32, source);
  o.chunk_frames = 2 * field(p, "n_window", o.chunk_frames / 2, 0, 1 << 16, source);
  return o;
}

LogMel log_mel(std::span<const float> samples, const MelOptions& o) {
  std::vector<double> wave(samples.begin(), samples.end());
  if (static_cast<int64_t>(wave.size()) < o.min_samples) wave.resize(static_cast<size_t>(o.min_samples), 0.0);
  const auto n = static_cast<int64_t>(wave.size()), half = o.n_fft / 2;
  if (n <= half) fail(Errc::shape, "[log_mel] {} samples: fewer than n_fft / 2 + 1 = {}", n, half + 1);
  // torch.stft(center=True) frames 0..n/hop over the reflect-padded signal; the extractor drops the last.
  const int64_t frames = n / o.hop, freqs = o.n_fft / 2 + 1;
  const auto at = [&](int64_t i) {  // the reflect-padded signal
    if (i < 0) i = -i;
    if (i >= n) i = 2 * (n - 1) - i;
    return wave[static_cast<size_t>(i)];
  };
  std::vector<double> window(static_cast<size_t>(o.n_fft));  // periodic Hann
  for (int64_t t = 0; t < o.n_fft; ++t)
    window[static_cast<size_t>(t)] =
        0.5 - 0.5 * std::cos(2 * std::numbers::pi * static_cast<double>(t) / static_cast<double>(o.n_fft));
  const Fft fft(static_cast<size_t>(o.n_fft));
  const std::vector<float> filters = mel_filters(o);
  LogMel out{.bins = o.bins, .frames = frames, .padded_frames = frames, .values = {}};
  if (o.chunk_frames > 1) out.padded_frames = (frames + o.chunk_frames - 1) / o.chunk_frames * o.chunk_frames;
  out.values.assign(static_cast<size_t>(o.bins * out.padded_frames), 0.0f);
  std::vector<std::complex<double>> frame(static_cast<size_t>(o.n_fft));
  std::vector<double> power(static_cast<size_t>(freqs));
  double max_log = -HUGE_VAL;
  for (int64_t f = 0; f < frames; ++f) {
    for (int64_t t = 0; t < o.n_fft; ++t)
      frame[static_cast<size_t>(t)] = at(f * o.hop - half + t) * window[static_cast<size_t>(t)];
    fft.forward(frame);
    for (int64_t k = 0; k < freqs; ++k) power[static_cast<size_t>(k)] = std::norm(frame[static_cast<size_t>(k)]);
    for (int64_t m = 0; m < o.bins; ++m) {
      double mel = 0;
      for (int64_t k = 0; k < freqs; ++k)
        mel += filters[static_cast<size_t>(k * o.bins + m)] * power[static_cast<size_t>(k)];
      const double v = std::log10(std::max(mel, 1e-10));
      out.values[static_cast<size_t>(m * out.padded_frames + f)] = static_cast<float>(v);
      max_log = std::max(max_log, v);
    }
  }
  const auto floor = static_cast<float>(max_log - 8.0);
  for (int64_t m = 0; m < o.bins; ++m)
    for (int64_t f = 0; f < frames; ++f) {
      float& v = out.values[static_cast<size_t>(m * out.padded_frames + f)];
      v = (std::max(v, floor) + 4.0f) / 4.0f;
    }
  return out;
}

}  // namespace lowbit::model
