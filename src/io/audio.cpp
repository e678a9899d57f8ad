#include "lowbit/io/audio.h"

#include <fmt/format.h>
#include <sndfile.h>
#include <soxr.h>

#include <cmath>
#include <memory>
#include <string>
#include <system_error>

#include "lowbit/core/error.h"

namespace lowbit::io {

namespace {

namespace fs = std::filesystem;

struct SndfileCloser {
  void operator()(SNDFILE* f) const { sf_close(f); }
};

// The encodings read_audio accepts, by container: WAV (and WAVE_FORMAT_EXTENSIBLE) PCM or float, FLAC's PCM.
bool accepted(int format) {
  const int major = format & SF_FORMAT_TYPEMASK, sub = format & SF_FORMAT_SUBMASK;
  if (major == SF_FORMAT_WAV || major == SF_FORMAT_WAVEX)
    return sub == SF_FORMAT_PCM_16 || sub == SF_FORMAT_PCM_24 || sub == SF_FORMAT_PCM_32 || sub == SF_FORMAT_FLOAT ||
           sub == SF_FORMAT_DOUBLE;
  if (major == SF_FORMAT_FLAC) return sub == SF_FORMAT_PCM_S8 || sub == SF_FORMAT_PCM_16 || sub == SF_FORMAT_PCM_24;
  return false;
}

std::string format_name(int format) {
  SF_FORMAT_INFO major{.format = format & SF_FORMAT_TYPEMASK, .name = nullptr, .extension = nullptr};
  SF_FORMAT_INFO sub{.format = format & SF_FORMAT_SUBMASK, .name = nullptr, .extension = nullptr};
  const bool has_major = sf_command(nullptr, SFC_GET_FORMAT_INFO, &major, sizeof(major)) == 0 && major.name;
  const bool has_sub = sf_command(nullptr, SFC_GET_FORMAT_INFO, &sub, sizeof(sub)) == 0 && sub.name;
  return fmt::format("{} / {}", has_major ? major.name : "?", has_sub ? sub.name : "?");
}

}  // namespace

std::vector<float> read_audio(const fs::path& path, int rate, const AudioLimits& limits) {
  const std::string source = path.string();
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) fail(Errc::io, "[read_audio] {}: not a readable file", source);
  SF_INFO info{};
  std::unique_ptr<SNDFILE, SndfileCloser> file(sf_open(source.c_str(), SFM_READ, &info));
  if (!file)
    fail(Errc::format, "[read_audio] {}: not a WAV or FLAC file libsndfile can read ({})", source,
         sf_strerror(nullptr));
  if (!accepted(info.format))
    fail(Errc::format, "[read_audio] {}: format {} is not WAV (PCM 16/24/32-bit or float) or FLAC", source,
         format_name(info.format));
  if (info.samplerate <= 0 || info.channels <= 0)
    fail(Errc::format, "[read_audio] {}: sample rate {} and channels {} in the header", source, info.samplerate,
         info.channels);
  if (info.frames <= 0) fail(Errc::shape, "[read_audio] {}: no audio frames", source);
  const double seconds = static_cast<double>(info.frames) / info.samplerate;
  if (seconds > limits.max_seconds)
    fail(Errc::limit, "[read_audio] {}: {:.1f} s of audio, more than the {:.0f} s allowed", source, seconds,
         limits.max_seconds);

  const auto frames = static_cast<size_t>(info.frames), channels = static_cast<size_t>(info.channels);
  std::vector<float> interleaved(frames * channels);
  const sf_count_t got = sf_readf_float(file.get(), interleaved.data(), info.frames);
  if (got != info.frames)
    fail(Errc::truncated, "[read_audio] {}: {} of {} frames readable ({})", source, got, info.frames,
         sf_strerror(file.get()));
  std::vector<float> mono(frames);
  for (size_t i = 0; i < frames; ++i) {
    double sum = 0;
    for (size_t c = 0; c < channels; ++c) sum += interleaved[i * channels + c];
    mono[i] = static_cast<float>(sum / static_cast<double>(channels));
    if (!std::isfinite(mono[i])) fail(Errc::non_finite, "[read_audio] {}: sample {} is not finite", source, i);
  }
  if (info.samplerate == rate) return mono;

  const double ratio = static_cast<double>(rate) / info.samplerate;
  std::vector<float> out(static_cast<size_t>(std::ceil(static_cast<double>(frames) * ratio)) + 1);
  size_t written = 0;
  const soxr_io_spec_t io = soxr_io_spec(SOXR_FLOAT32_I, SOXR_FLOAT32_I);
  const soxr_quality_spec_t quality = soxr_quality_spec(SOXR_HQ, 0);
  if (const soxr_error_t err = soxr_oneshot(info.samplerate, rate, 1, mono.data(), frames, nullptr, out.data(),
                                            out.size(), &written, &io, &quality, nullptr))
    fail(Errc::internal, "[read_audio] {}: resampling {} Hz to {} Hz failed: {}", source, info.samplerate, rate, err);
  out.resize(written);
  if (out.empty()) fail(Errc::shape, "[read_audio] {}: no samples left at {} Hz", source, rate);
  return out;
}

}  // namespace lowbit::io
