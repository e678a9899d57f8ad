// Qwen3-ASR against transformers' qwen3_asr (scripts/make_qwen3_asr_fixtures.py): the log-mel features of the
// committed speech (espeak-ng), the projected encoder output of a random-weight model, and lowbit's greedy ids.
// Tolerances: max |lowbit - reference| over a slice within 1e-4 of the slice's largest |reference|.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "lowbit/io/audio.h"
#include "lowbit/model/log_mel.h"

namespace lowbit::model {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kFixtures = fs::path(LOWBIT_SOURCE_DIR) / "tests/model/fixtures/qwen3_asr";

json expected() {
  std::ifstream in(kFixtures / "expected.json");
  return json::parse(in);
}

// max |got - want| / max |want| over the slice.
double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(got[i]) - want[i]));
    scale = std::max(scale, std::abs(static_cast<double>(want[i])));
  }
  return diff / scale;
}

TEST(Qwen3Asr, LogMelMatchesTheReferenceExtractor) {
  const json e = expected();
  const std::vector<float> audio = io::read_audio(kFixtures / e.at("audio").get<std::string>(), 16000);
  ASSERT_EQ(audio.size(), e.at("samples").get<size_t>());
  const LogMel mel = log_mel(audio, MelOptions{});
  const json& m = e.at("mel");
  ASSERT_EQ(mel.bins, m.at("bins").get<int64_t>());
  ASSERT_EQ(mel.frames, m.at("frames").get<int64_t>());
  ASSERT_EQ(mel.padded_frames, m.at("padded_frames").get<int64_t>());
  const auto first = m.at("slice_frames")[0].get<int64_t>(), last = m.at("slice_frames")[1].get<int64_t>();
  std::vector<float> got;  // [frames, bins] as the fixture stores it
  for (int64_t f = first; f < last; ++f)
    for (int64_t b = 0; b < mel.bins; ++b) got.push_back(mel.values[static_cast<size_t>(b * mel.padded_frames + f)]);
  EXPECT_LT(relative_error(got, m.at("slice").get<std::vector<float>>()), 1e-4);
  double sum = 0;
  for (float v : mel.values) sum += v;
  EXPECT_NEAR(sum, m.at("sum").get<double>(), 1e-4 * std::abs(m.at("sum").get<double>()));
}

}  // namespace
}  // namespace lowbit::model
