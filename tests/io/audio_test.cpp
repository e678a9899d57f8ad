#include "lowbit/io/audio.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sndfile.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <numbers>

#include "lowbit/core/error.h"

namespace lowbit::io {
namespace {

namespace fs = std::filesystem;

class AudioTest : public ::testing::Test {
 protected:
  fs::path dir = fs::temp_directory_path() / fmt::format("lowbit-audio-test-{}", ::getpid());
  void SetUp() override { fs::create_directories(dir); }
  void TearDown() override { fs::remove_all(dir); }

  // `frames` frames of `channels` channels written by libsndfile; channel c holds sine(hz) * (c + 1) / channels.
  fs::path write(const std::string& name, int format, int rate, int channels, sf_count_t frames, double hz = 440) {
    fs::path path = dir / name;
    SF_INFO info{.frames = 0, .samplerate = rate, .channels = channels, .format = format, .sections = 0, .seekable = 0};
    SNDFILE* f = sf_open(path.c_str(), SFM_WRITE, &info);
    EXPECT_NE(f, nullptr) << sf_strerror(nullptr);
    std::vector<double> data(static_cast<size_t>(frames * channels));
    for (sf_count_t i = 0; i < frames; ++i)
      for (int c = 0; c < channels; ++c)
        data[static_cast<size_t>(i * channels + c)] = sine(i, rate, hz) * (c + 1) / channels;
    EXPECT_EQ(sf_writef_double(f, data.data(), frames), frames);
    sf_close(f);
    return path;
  }
  static double sine(sf_count_t i, int rate, double hz) {
    return 0.5 * std::sin(2 * std::numbers::pi * hz * static_cast<double>(i) / rate);
  }
  fs::path write_bytes(const std::string& name, const std::string& bytes) {
    fs::path path = dir / name;
    std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return path;
  }
};

Errc code_of(const fs::path& path, const AudioLimits& limits = {}) {
  try {
    read_audio(path, 16000, limits);
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
    return e.code();
  }
  ADD_FAILURE() << path << " was accepted";
  return Errc::internal;
}

TEST_F(AudioTest, ReadsEveryAcceptedEncodingAt16kHz) {
  const std::pair<int, double> encodings[] = {
      {SF_FORMAT_WAV | SF_FORMAT_PCM_16, 1.0 / 32768},   {SF_FORMAT_WAV | SF_FORMAT_PCM_24, 1.0 / 8388608},
      {SF_FORMAT_WAV | SF_FORMAT_PCM_32, 1e-7},          {SF_FORMAT_WAV | SF_FORMAT_FLOAT, 1e-7},
      {SF_FORMAT_WAVEX | SF_FORMAT_PCM_16, 1.0 / 32768}, {SF_FORMAT_FLAC | SF_FORMAT_PCM_16, 1.0 / 32768},
      {SF_FORMAT_FLAC | SF_FORMAT_PCM_24, 1.0 / 8388608}};
  for (const auto& [format, step] : encodings) {
    const fs::path path =
        write(fmt::format("a{:x}.{}", format, (format & SF_FORMAT_FLAC) ? "flac" : "wav"), format, 16000, 1, 1600);
    const std::vector<float> got = read_audio(path, 16000);
    ASSERT_EQ(got.size(), 1600u) << path;
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], sine(static_cast<sf_count_t>(i), 16000, 440), step) << path;
  }
}

TEST_F(AudioTest, MixesChannelsDownToTheirMean) {
  const std::vector<float> got = read_audio(write("stereo.wav", SF_FORMAT_WAV | SF_FORMAT_FLOAT, 16000, 2, 800), 16000);
  ASSERT_EQ(got.size(), 800u);
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], 0.75 * sine(static_cast<sf_count_t>(i), 16000, 440), 1e-7);
}

TEST_F(AudioTest, ResamplesToTheRequestedRate) {
  for (const int rate : {8000, 22050, 44100, 48000}) {
    const std::vector<float> got =
        read_audio(write(fmt::format("r{}.wav", rate), SF_FORMAT_WAV | SF_FORMAT_FLOAT, rate, 1, rate), 16000);
    ASSERT_NEAR(static_cast<double>(got.size()), 16000, 1) << rate;
    // Away from the edges the resampled tone is the same tone at the new rate.
    for (size_t i = 1000; i + 1000 < got.size(); ++i)
      ASSERT_NEAR(got[i], sine(static_cast<sf_count_t>(i), 16000, 440), 2e-3) << rate << " at " << i;
  }
}

TEST_F(AudioTest, RefusesOtherFormatsCorruptEmptyAndLongInputs) {
  EXPECT_EQ(code_of(write("a.aiff", SF_FORMAT_AIFF | SF_FORMAT_PCM_16, 16000, 1, 100)), Errc::format);
  EXPECT_EQ(code_of(write("u8.wav", SF_FORMAT_WAV | SF_FORMAT_PCM_U8, 16000, 1, 100)), Errc::format);
  EXPECT_EQ(code_of(write_bytes("junk.wav", std::string("RIFF\x10\0\0\0WAVEjunk-not-a-chunk", 28))), Errc::format);
  EXPECT_EQ(code_of(write_bytes("text.wav", "hello, this is not audio\n")), Errc::format);
  EXPECT_EQ(code_of(write("empty.wav", SF_FORMAT_WAV | SF_FORMAT_PCM_16, 16000, 1, 0)), Errc::shape);
  EXPECT_EQ(code_of(write("long.wav", SF_FORMAT_WAV | SF_FORMAT_PCM_16, 16000, 1, 16000), {.max_seconds = 0.5}),
            Errc::limit);
  EXPECT_EQ(code_of(dir / "absent.wav"), Errc::io);
}

}  // namespace
}  // namespace lowbit::io
