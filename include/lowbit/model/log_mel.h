// The log-mel front end of Whisper-style speech encoders (Qwen3-ASR's Qwen3ASRFeatureExtractor): a centred STFT
// (reflect padding, periodic Hann window), power spectrum, Slaney mel filters, log10 clamped at 1e-10, a dynamic
// range of 8 below the maximum, then (x + 4) / 4; the time axis right-padded with zeros to whole encoder chunks.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace lowbit::model {

struct MelOptions {
  int64_t bins = 128;           // feature_size
  int64_t sample_rate = 16000;  // sampling_rate
  int64_t n_fft = 400;
  int64_t hop = 160;           // hop_length
  int64_t min_samples = 8000;  // min_length: shorter audio is zero-padded to it first
  int64_t chunk_frames = 100;  // 2 * n_window: the time axis is padded to a multiple of it
};

// preprocessor_config.json's values over the defaults; Errc::format naming `source` and the field for values out
// of range, Errc::unsupported for a feature extractor or dither lowbit does not compute.
MelOptions parse_mel_options(const nlohmann::json& preprocessor, std::string_view source);

struct LogMel {
  int64_t bins = 0;
  int64_t frames = 0;         // valid frames
  int64_t padded_frames = 0;  // frames, rounded up to whole chunks (zeros beyond `frames`)
  std::vector<float> values;  // [bins, padded_frames]
};

LogMel log_mel(std::span<const float> samples, const MelOptions& options);

}  // namespace lowbit::model
