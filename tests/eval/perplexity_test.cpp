#include <gtest/gtest.h>

#include <cmath>

#include "lowbit/core/error.h"
#include "lowbit/core/thread_pool.h"
#include "lowbit/eval/perplexity.h"
#include "model/tiny_model.h"

namespace lowbit::eval {
namespace {

std::vector<int32_t> some_tokens(size_t n) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>((i * 7 + 3) % 32);
  return t;
}

TEST(Perplexity, UniformModelScoresTheVocabularySize) {
  ThreadPool pool(2);
  const auto m = model::testing::tiny_model(model::testing::tiny_config(), 1, /*zero_head=*/true);
  WindowOptions o;
  o.ctx = 16;
  o.bos = 1;
  const auto r = perplexity(*m, some_tokens(50), o, pool);  // 3 windows, the tail of 2 dropped
  EXPECT_EQ(r.windows, 3);
  EXPECT_EQ(r.tokens, 3 * (16 - 1 - 8));
  EXPECT_NEAR(r.ppl, 32.0, 1e-9);
  EXPECT_NEAR(r.ppl_stderr, 0.0, 1e-9);
}

TEST(Perplexity, BatchSizeDoesNotChangeTheResult) {
  ThreadPool pool(2);
  const auto m = model::testing::tiny_model(model::testing::tiny_config(), 5);
  WindowOptions o;
  o.ctx = 20;
  const auto whole = perplexity(*m, some_tokens(60), o, pool);
  o.batch = 3;
  const auto pieces = perplexity(*m, some_tokens(60), o, pool);
  EXPECT_NEAR(whole.ppl, pieces.ppl, 1e-4 * whole.ppl);
  EXPECT_GT(whole.ppl, 1.0);
}

TEST(Perplexity, NeedsOneWindow) {
  ThreadPool pool(1);
  const auto m = model::testing::tiny_model(model::testing::tiny_config());
  WindowOptions o;
  o.ctx = 16;
  try {
    perplexity(*m, some_tokens(15), o, pool);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::usage);
  }
}

TEST(KlDivergence, AModelAgainstItselfIsZero) {
  ThreadPool pool(2);
  const auto m = model::testing::tiny_model(model::testing::tiny_config(), 3);
  WindowOptions o;
  o.ctx = 16;
  o.bos = 1;
  const auto r = kl_divergence(*m, *m, some_tokens(40), o, pool);
  EXPECT_EQ(r.tokens, 2 * 7);
  EXPECT_NEAR(r.kld_mean, 0.0, 1e-12);
  EXPECT_NEAR(r.kld_p99, 0.0, 1e-12);
  EXPECT_EQ(r.top1_agreement, 1.0);
  EXPECT_NEAR(r.delta_p_mean, 0.0, 1e-12);
  EXPECT_DOUBLE_EQ(r.base.ppl, r.other.ppl);
}

TEST(KlDivergence, DifferentModelsDiverge) {
  ThreadPool pool(2);
  const auto a = model::testing::tiny_model(model::testing::tiny_config(), 3);
  const auto b = model::testing::tiny_model(model::testing::tiny_config(), 4);
  WindowOptions o;
  o.ctx = 16;
  const auto r = kl_divergence(*a, *b, some_tokens(40), o, pool);
  EXPECT_GT(r.kld_mean, 0.0);
  EXPECT_GE(r.kld_p99, r.kld_median);
  EXPECT_LE(r.top1_agreement, 1.0);
  EXPECT_NE(r.base.ppl, r.other.ppl);
}

}  // namespace
}  // namespace lowbit::eval
