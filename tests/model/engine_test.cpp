// The serving engine on stories260K: greedy results do not depend on what else is batched, cancellation frees a
// slot, the queue is bounded, stop strings and logprobs.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <thread>

#include "lowbit/core/error.h"
#include "lowbit/core/thread_pool.h"
#include "lowbit/model/engine.h"

namespace lowbit::model {
namespace {

namespace fs = std::filesystem;

const fs::path kStories = fs::path(LOWBIT_SHARED_DIR) / "models" / "stories260K";

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kStories / "stories260K.bin")) GTEST_SKIP() << "../shared/models/stories260K is absent";
    model_ = load_model(kStories / "stories260K.bin");
    tokenizer_ = load_tokenizer(kStories / "stories260K.bin", kStories / "tok512.bin");
  }

  GenerationRequest request(std::string_view prompt, int64_t max_tokens, float temperature = 0) const {
    GenerationRequest r;
    r.prompt = tokenizer_->encode(prompt, true);
    r.max_tokens = max_tokens;
    r.sampler.temperature = temperature;
    r.sampler.seed = 7;
    r.stop_tokens = tokenizer_->eos_ids();
    return r;
  }

  std::unique_ptr<Engine> engine(int parallel, size_t max_queue = 64, std::function<void(int)> after_step = {}) {
    EngineOptions o;
    o.parallel = parallel;
    o.max_queue = max_queue;
    o.prefill_chunk = 4;  // several passes per prompt, so prefills interleave with the others' decoding
    o.after_step = std::move(after_step);
    return std::make_unique<Engine>(*model_, *tokenizer_, o, pool_);
  }

  // Reads a stream to its end: the whole text, every token, the last event.
  static GenerationEvent drain(GenerationStream& stream) {
    GenerationEvent all, e;
    while (all.finish == FinishReason::none) {
      if (!stream.next(e, std::chrono::seconds(30))) ADD_FAILURE() << "no event in 30 s";
      all.text += e.text;
      all.tokens.insert(all.tokens.end(), e.tokens.begin(), e.tokens.end());
      all.finish = e.finish;
      all.prompt_tokens = e.prompt_tokens;
      all.completion_tokens = e.completion_tokens;
    }
    return all;
  }

  // The engine retires a finished sequence at the end of the step that finished it, just after its last event.
  static bool idle_soon(const Engine& e) {
    for (int i = 0; i < 3000 && e.metrics().active > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return e.metrics().active == 0;
  }

  static std::vector<int32_t> ids(const GenerationEvent& e) {
    std::vector<int32_t> out;
    for (const auto& t : e.tokens) out.push_back(t.token);
    return out;
  }

  ThreadPool pool_{2};
  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
};

const std::vector<std::string> kPrompts = {"Once upon a time", "The dog", "Lily and Tom went to the park. They",
                                           "One day, a little bird", "Sam", "The sun was hot and the",
                                           "Mom said", "There was a big red ball"};

TEST_F(EngineTest, GreedyIsTheSameAloneAndBatched) {
  std::vector<GenerationEvent> alone;
  {
    auto e = engine(1);
    e->start();
    for (const auto& p : kPrompts) alone.push_back(drain(*e->submit(request(p, 40))));
  }
  std::atomic<int> widest{0};
  auto e = engine(4, 64, [&](int decoded) { widest = std::max(widest.load(), decoded); });
  std::vector<std::shared_ptr<GenerationStream>> streams;
  for (const auto& p : kPrompts) streams.push_back(e->submit(request(p, 40)));
  e->start();
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    const auto batched = drain(*streams[i]);
    EXPECT_EQ(ids(batched), ids(alone[i])) << kPrompts[i];
    EXPECT_EQ(batched.text, alone[i].text) << kPrompts[i];
    EXPECT_EQ(batched.finish, alone[i].finish);
    EXPECT_GT(batched.completion_tokens, 0);
  }
  EXPECT_EQ(widest.load(), 4) << "the sequences were never decoded together";
  EXPECT_EQ(e->metrics().requests, kPrompts.size());
  EXPECT_TRUE(idle_soon(*e)) << "slots still held after every stream ended";
}

TEST_F(EngineTest, GreedyMatchesForwardByHand) {
  auto e = engine(2);
  e->start();
  const auto r = request("Once upon a time", 12);
  const auto got = drain(*e->submit(r));
  // The same tokens by forward() and argmax directly.
  KvCache cache(model_->config, 64);
  std::vector<int32_t> tokens = r.prompt;
  std::vector<float> logits(static_cast<size_t>(model_->config.vocab));
  forward(*model_, cache, tokens, 0, logits.data(), false, pool_);
  std::vector<int32_t> expected;
  for (int i = 0; i < 12; ++i) {
    const int32_t next = argmax(logits);
    expected.push_back(next);
    tokens.push_back(next);
    forward(*model_, cache, std::span(&tokens.back(), 1), static_cast<int64_t>(tokens.size() - 1), logits.data(), false,
            pool_);
  }
  EXPECT_EQ(ids(got), expected);
  EXPECT_EQ(got.finish, FinishReason::length);
  EXPECT_EQ(got.completion_tokens, 12);
  EXPECT_EQ(got.prompt_tokens, static_cast<int64_t>(r.prompt.size()));
}

TEST_F(EngineTest, CancellationFreesTheSlotAtOnce) {
  std::shared_ptr<GenerationStream> first;
  int steps = 0, steps_after_cancel = -1;
  // One slot: the second request can only start once the first gives its slot back. The first is cancelled
  // from the engine thread after its fifth step (two prefill passes, the second also sampling, so four tokens), a point the test controls.
  auto e = engine(1, 64, [&](int) {
    if (steps_after_cancel >= 0) {
      ++steps_after_cancel;
    } else if (++steps == 5) {
      first->cancel();
      steps_after_cancel = 0;
    }
  });
  first = e->submit(request("Once upon a time", 400));
  auto second = e->submit(request("The dog", 5));
  e->start();
  const auto a = drain(*first);
  EXPECT_EQ(a.finish, FinishReason::cancelled);
  EXPECT_EQ(a.completion_tokens, 4);
  const auto b = drain(*second);
  EXPECT_EQ(b.finish, FinishReason::length);
  EXPECT_EQ(b.completion_tokens, 5);
  e->stop();
  // The second request's prompt (one pass of 4 positions per step) and its 5 tokens took a few steps; the first
  // gave its slot back in the step right after cancel().
  EXPECT_LE(steps_after_cancel, 1 + 2 + 5 + 1);
}

TEST_F(EngineTest, QueueIsBounded) {
  auto e = engine(2, 3);
  std::vector<std::shared_ptr<GenerationStream>> accepted;
  // Before start() nothing holds a slot: 2 free slots plus 3 queued places.
  for (int i = 0; i < 5; ++i) {
    accepted.push_back(e->submit(request("Sam", 3)));
    ASSERT_NE(accepted.back(), nullptr) << i;
  }
  EXPECT_EQ(e->submit(request("Sam", 3)), nullptr);
  EXPECT_EQ(e->metrics().rejected, 1u);
  EXPECT_EQ(e->metrics().queued, 5u);
  e->start();
  for (auto& s : accepted) EXPECT_EQ(drain(*s).completion_tokens, 3);
  EXPECT_NE(e->submit(request("Sam", 3)), nullptr) << "the queue drained";
}

TEST_F(EngineTest, QueuedRequestCancelledNeverStarts) {
  auto e = engine(1);
  auto a = e->submit(request("Sam", 3));
  a->cancel();
  auto b = e->submit(request("Sam", 3));
  e->start();
  const auto got = drain(*a);
  EXPECT_EQ(got.finish, FinishReason::cancelled);
  EXPECT_EQ(got.completion_tokens, 0);
  EXPECT_EQ(drain(*b).finish, FinishReason::length);
}

TEST_F(EngineTest, StopStringEndsTheTextBeforeIt) {
  auto e = engine(2);
  e->start();
  const auto full = drain(*e->submit(request("Once upon a time", 30)));
  const size_t at = full.text.find("little");
  ASSERT_NE(at, std::string::npos) << full.text;
  auto r = request("Once upon a time", 30);
  r.stop = {"zzz-never", "little"};
  const auto cut = drain(*e->submit(r));
  EXPECT_EQ(cut.text, full.text.substr(0, at));
  EXPECT_EQ(cut.finish, FinishReason::stop);
}

TEST_F(EngineTest, LogprobsAreTheModelsLogSoftmax) {
  auto e = engine(1);
  e->start();
  auto r = request("Once upon a time", 3);
  r.top_logprobs = 3;
  const auto got = drain(*e->submit(r));
  ASSERT_EQ(got.tokens.size(), 3u);
  for (const auto& t : got.tokens) {
    ASSERT_EQ(t.top.size(), 3u);
    EXPECT_EQ(t.top[0].first, t.token) << "greedy takes the most likely token";
    EXPECT_FLOAT_EQ(t.top[0].second, t.logprob);
    EXPECT_LE(t.logprob, 0.0f);
    EXPECT_GE(t.top[0].second, t.top[1].second);
    EXPECT_GE(t.top[1].second, t.top[2].second);
    double mass = 0;
    for (const auto& [id, lp] : t.top) mass += std::exp(lp);
    EXPECT_LE(mass, 1.0 + 1e-5);
  }
}

TEST_F(EngineTest, RefusesBadRequests) {
  auto e = engine(1);
  GenerationRequest empty;
  EXPECT_THROW(e->submit(empty), Error);
  auto too_long = request("Sam", 3);
  too_long.prompt.assign(static_cast<size_t>(e->context()), too_long.prompt[0]);
  try {
    e->submit(too_long);
    ADD_FAILURE() << "a prompt filling the context was accepted";
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), Errc::limit);
  }
  auto bad_token = request("Sam", 3);
  bad_token.prompt.push_back(model_->config.vocab);
  EXPECT_THROW(e->submit(bad_token), Error);
}

}  // namespace
}  // namespace lowbit::model
