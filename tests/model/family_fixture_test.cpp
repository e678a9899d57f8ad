// Every model family against Hugging Face transformers: a tiny random model per family
// (tests/model/fixtures/families/<family>/, written by scripts/make_family_fixtures.py, which says what each one
// exercises) runs through lowbit's CPU forward pass; the logits of all positions must be within 1e-4 of
// transformers' (max abs difference over the largest logit) and greedy decoding must give transformers' ids.
// Each model written back as an HF directory must give the same logits again. A directory that also holds
// model.gguf (the same weights as llama.cpp's converter writes them) must give the
// same logits from the GGUF, or those of expected_gguf.safetensors where llama.cpp reads the GGUF as a slightly
// different model (the gemmas: no query_pre_attn_scalar in GGUF, gemma3's default layer pattern).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "lowbit/core/thread_pool.h"
#include "lowbit/io/safetensors.h"
#include "lowbit/model/family.h"
#include "lowbit/model/hf.h"
#include "lowbit/model/model.h"

namespace lowbit::model {
namespace {

namespace fs = std::filesystem;

const fs::path kFamilies = fs::path(LOWBIT_SOURCE_DIR) / "tests/model/fixtures/families";
constexpr double kTolerance = 1e-4;

std::vector<std::string> family_dirs() {
  std::vector<std::string> names;
  if (fs::is_directory(kFamilies))
    for (const auto& e : fs::directory_iterator(kFamilies))
      if (e.is_directory()) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

template <class T>
std::vector<T> values(const io::SafetensorsFile& f, std::string_view name, DType dtype) {
  const TensorView v = f.tensor(name);
  EXPECT_EQ(v.dtype, dtype) << name;
  return {v.as<T>(), v.as<T>() + v.bytes.size() / sizeof(T)};
}

struct Expected {
  std::vector<int32_t> tokens, greedy;
  std::vector<float> logits;  // [tokens, vocab]
};

Expected read_expected(const fs::path& file) {
  const auto f = io::SafetensorsFile::open(file);
  return {values<int32_t>(f, "tokens", DType::I32), values<int32_t>(f, "greedy", DType::I32),
          values<float>(f, "logits", DType::F32)};
}

// max |a - b| / max |b|
double relative_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return diff / scale;
}

int32_t argmax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// Prefill of every token (the batched path), then greedy decoding one token at a time (the decode path, with
// the KV cache and, past the window, the sliding window).
void check_model(const Model& m, const Expected& e, const std::string& what) {
  ThreadPool pool(2);
  const int64_t vocab = m.config.vocab;
  ASSERT_EQ(e.logits.size(), e.tokens.size() * static_cast<size_t>(vocab)) << what;
  KvCache cache(m.config, m.config.max_seq);
  std::vector<float> logits(e.logits.size());
  forward(m, cache, e.tokens, 0, logits.data(), true, pool);
  const double rel = relative_diff(logits, e.logits);
  std::cout << "[ family   ] " << what << ": max |logit diff| / max |logit| = " << rel << "\n";
  EXPECT_LE(rel, kTolerance) << what;

  std::vector<int32_t> greedy;
  std::vector<float> last(logits.end() - vocab, logits.end());
  for (size_t i = 0; i < e.greedy.size(); ++i) {
    greedy.push_back(argmax(last));
    forward(m, cache, std::span(&greedy.back(), 1), static_cast<int64_t>(e.tokens.size() + i), last.data(), false,
            pool);
  }
  EXPECT_EQ(greedy, e.greedy) << what;
}

class FamilyFixture : public testing::TestWithParam<std::string> {};

TEST_P(FamilyFixture, MatchesTransformers) {
  const fs::path dir = kFamilies / GetParam();
  const Expected e = read_expected(dir / "expected.safetensors");
  // The context is exactly what the check uses: phi3's LongRoPE picks its short factors for a context within
  // original_max_position_embeddings, as transformers does for sequences that short.
  const LoadOptions options{static_cast<int64_t>(e.tokens.size() + e.greedy.size())};
  const auto hf = load_model(dir, options);
  check_model(*hf, e, GetParam() + " (HF)");
  // Written back as an HF directory (the family's write_hf: config.json must describe the same model) and read
  // again, as artifacts store their config.
  const fs::path written =
      fs::temp_directory_path() / ("lowbit_family_" + GetParam() + "_" + std::to_string(::getpid()));
  fs::remove_all(written);
  write_hf(*hf, written);
  check_model(*load_model(written, options), e, GetParam() + " (HF written back)");
  fs::remove_all(written);
  if (!fs::exists(dir / "model.gguf")) return;
  const fs::path gguf_view = dir / "expected_gguf.safetensors";
  check_model(*load_model(dir / "model.gguf", options), fs::exists(gguf_view) ? read_expected(gguf_view) : e,
              GetParam() + " (GGUF)");
}

INSTANTIATE_TEST_SUITE_P(Families, FamilyFixture, testing::ValuesIn(family_dirs()),
                         [](const testing::TestParamInfo<std::string>& info) { return info.param; });

TEST(FamilyFixtures, EveryFamilyHasOne) {
  const std::vector<std::string> dirs = family_dirs();
  for (const Family* f : families())
    EXPECT_NE(std::find(dirs.begin(), dirs.end(), f->name), dirs.end()) << "no fixture for family " << f->name;
}

}  // namespace
}  // namespace lowbit::model
