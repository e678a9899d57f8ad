#include <gtest/gtest.h>

#include <set>

#include "lowbit/core/error.h"
#include "lowbit/model/sampler.h"

namespace lowbit::model {
namespace {

std::vector<float> logits() { return {0.5f, 2.0f, -1.0f, 1.9f, 0.0f, 2.0f}; }

TEST(Sampler, GreedyTakesTheFirstMaximum) {
  Sampler s({.temperature = 0});
  auto l = logits();
  EXPECT_EQ(s.sample(l, {}), 1);
}

TEST(Sampler, TopKOfOneIsGreedyAtAnyTemperature) {
  Sampler s({.temperature = 5.0f, .top_k = 1, .top_p = 1.0f, .min_p = 0.0f, .seed = 3});
  for (int i = 0; i < 50; ++i) {
    auto l = logits();
    EXPECT_EQ(s.sample(l, {}), 1);
  }
}

TEST(Sampler, SameSeedSameDrawsAndTemperatureSpreads) {
  const SamplerOptions o{.temperature = 2.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = 42};
  Sampler a(o), b(o);
  std::set<int32_t> seen;
  for (int i = 0; i < 200; ++i) {
    auto la = logits(), lb = logits();
    const int32_t x = a.sample(la, {});
    EXPECT_EQ(x, b.sample(lb, {}));
    seen.insert(x);
  }
  EXPECT_EQ(seen.size(), 6u);  // at temperature 2 every token turns up
}

TEST(Sampler, TopPAndMinPCutTheTail) {
  Sampler top_p({.temperature = 1.0f, .top_k = 0, .top_p = 0.5f, .min_p = 0.0f, .seed = 1});
  Sampler min_p({.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.5f, .seed = 1});
  for (int i = 0; i < 200; ++i) {
    auto l1 = logits(), l2 = logits();
    const int32_t a = top_p.sample(l1, {});
    EXPECT_TRUE(a == 1 || a == 5 || a == 3) << a;
    const int32_t b = min_p.sample(l2, {});  // p >= half of the best: logits >= 2 - ln 2
    EXPECT_TRUE(b == 1 || b == 5 || b == 3) << b;
  }
}

TEST(Sampler, RepeatPenaltyDemotesRecentTokens) {
  Sampler s({.temperature = 0, .repeat_penalty = 2.0f});
  auto l = logits();
  const std::vector<int32_t> history{1, 5};
  EXPECT_EQ(s.sample(l, history), 3);
  EXPECT_FLOAT_EQ(l[1], 1.0f);
}

TEST(Sampler, RejectsBadOptions) {
  EXPECT_THROW(Sampler({.temperature = -1}), Error);
  EXPECT_THROW(Sampler({.top_p = 0}), Error);
  EXPECT_THROW(Sampler({.repeat_penalty = 0}), Error);
}

}  // namespace
}  // namespace lowbit::model
