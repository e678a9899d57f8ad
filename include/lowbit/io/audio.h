// Audio files for speech models: WAV (PCM 16/24/32-bit, 32/64-bit float) and FLAC read through libsndfile, mixed
// down to mono (the mean of the channels) and resampled with libsoxr's high-quality resampler.
#pragma once

#include <filesystem>
#include <vector>

namespace lowbit::io {

struct AudioLimits {
  double max_seconds = 3600;  // longer inputs are refused (Errc::limit)
};

// The samples of `path` as mono float in [-1, 1) at `rate` Hz. Errors are one line, "[read_audio] path: ...":
// Errc::io when the file cannot be opened, Errc::format for a container or encoding other than the ones above or
// a header libsndfile cannot parse, Errc::truncated when the file ends before its declared frames, Errc::shape
// for zero frames, Errc::limit beyond limits.max_seconds, Errc::non_finite for a NaN or Inf float sample.
std::vector<float> read_audio(const std::filesystem::path& path, int rate, const AudioLimits& limits = {});

}  // namespace lowbit::io
