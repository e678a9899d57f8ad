// Every model family against Hugging Face transformers: a tiny random model per family
// (tests/model/fixtures/families/<family>/, written by scripts/make_family_fixtures.py, which says what each one
// exercises) runs through lowbit's CPU forward pass; the logits of all positions must be within 1e-4 of
// transformers' (max abs difference over the largest logit) and greedy decoding must give transformers' ids.
// Each model written back as an HF directory must give the same logits again. A directory that also holds
// model.gguf (the same weights as llama.cpp's converter writes them) must give the
// same logits from the GGUF, or those of expected_gguf.safetensors where llama.cpp reads the GGUF as a slightly
// different model (the gemmas: no query_pre_attn_scalar in GGUF, gemma3's default layer pattern). Sequences decoded
// together through forward_rows() must equal each one decoded alone.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "lowbit/core/thread_pool.h"
#include "lowbit/model/family.h"
#include "lowbit/model/hf.h"
#include "lowbit/model/model.h"
#include "model/family_fixtures.h"
#include "model/tiny_model.h"

namespace lowbit::model {
namespace {

namespace fs = std::filesystem;
using testing::FamilyExpected;
using testing::kFamilyFixtures;
using testing::kFamilyTolerance;

// Prefill of every token (the batched path), then greedy decoding one token at a time (the decode path, with
// the KV cache and, past the window, the sliding window).
void check_model(const Model& m, const FamilyExpected& e, const std::string& what) {
  ThreadPool pool(2);
  const int64_t vocab = m.config.vocab;
  ASSERT_EQ(e.logits.size(), e.tokens.size() * static_cast<size_t>(vocab)) << what;
  KvCache cache(m.config, m.config.max_seq);
  std::vector<float> logits(e.logits.size());
  forward(m, cache, e.tokens, 0, logits.data(), true, pool);
  const double rel = testing::max_relative_diff(logits, e.logits);
  std::cout << "[ family   ] " << what << ": max |logit diff| / max |logit| = " << rel << "\n";
  EXPECT_LE(rel, kFamilyTolerance) << what;

  std::vector<int32_t> greedy;
  std::vector<float> last(logits.end() - vocab, logits.end());
  for (size_t i = 0; i < e.greedy.size(); ++i) {
    greedy.push_back(testing::argmax_of(last));
    forward(m, cache, std::span(&greedy.back(), 1), static_cast<int64_t>(e.tokens.size() + i), last.data(), false,
            pool);
  }
  EXPECT_EQ(greedy, e.greedy) << what;
}

class FamilyFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(FamilyFixture, MatchesTransformers) {
  const fs::path dir = kFamilyFixtures / GetParam();
  const FamilyExpected e = testing::family_expected_for(dir, false);
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
  check_model(*load_model(dir / "model.gguf", options), testing::family_expected_for(dir, true),
              GetParam() + " (GGUF)");
}

// A serving engine's decode step: sequences at different positions of their own caches in one forward_rows()
// (batched matmuls over the rows), each row equal to its sequence run alone (forward() of one token: matvec),
// step after step, so each row's keys and values went to its own cache at its own position.
TEST_P(FamilyFixture, DecodeRowsTogetherEqualEachAlone) {
  const FamilyExpected e = testing::family_expected_for(kFamilyFixtures / GetParam(), false);
  const auto ctx = static_cast<int64_t>(e.tokens.size() + e.greedy.size());
  const auto m = load_model(kFamilyFixtures / GetParam(), LoadOptions{ctx});
  ThreadPool pool(2);
  const auto prefix = [&](size_t n) { return std::vector<int32_t>(e.tokens.begin(), e.tokens.begin() + n); };
  const size_t n = e.tokens.size();
  // the whole prompt, half of it, one token, and the whole prompt again (two rows at one position)
  const std::vector<std::vector<int32_t>> prompts{prefix(n), prefix(n / 2), prefix(1), prefix(n)};
  const int steps = static_cast<int>(e.greedy.size());
  ASSERT_GE(steps, 2) << GetParam();
  const testing::RowsAndAlone r = testing::decode_rows_and_alone(*m, prompts, steps, pool);
  const double rel = testing::max_relative_diff(r.rows, r.alone);
  std::cout << "[ rows     ] " << GetParam() << ": max |rows - alone| / max |alone| = " << rel << "\n";
  EXPECT_LE(rel, 1e-5) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Families, FamilyFixture, ::testing::ValuesIn(testing::family_fixture_dirs()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

TEST(FamilyFixtures, EveryFamilyHasOne) {
  const std::vector<std::string> dirs = testing::family_fixture_dirs();
  for (const Family* f : families())
    EXPECT_NE(std::find(dirs.begin(), dirs.end(), f->name), dirs.end()) << "no fixture for family " << f->name;
}

}  // namespace
}  // namespace lowbit::model
