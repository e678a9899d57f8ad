// Gemma-3-270M from its public GGUF against llama.cpp (tests/model/gemma3_reference.h): the vocabulary gives
// llama.cpp's ids, and greedy decoding gives llama.cpp's 64 tokens after each reference prompt.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "lowbit/core/thread_pool.h"
#include "lowbit/model/gguf_model.h"
#include "lowbit/model/model.h"
#include "model/gemma3_reference.h"

namespace lowbit::model {
namespace {

namespace fs = std::filesystem;

class Gemma3Gguf : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!fs::exists(testing::gemma3_gguf())) return;
    model_ = load_model(testing::gemma3_gguf(), {.max_seq = 512}).release();
    tokenizer_ = load_gguf_tokenizer(testing::gemma3_gguf()).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    delete tokenizer_;
  }
  void SetUp() override {
    if (!model_) GTEST_SKIP() << testing::gemma3_gguf() << testing::kGemma3Absent;
  }
  static const Model* model_;
  static const Tokenizer* tokenizer_;
  const nlohmann::json reference_ = testing::gemma3_llama_cpp_reference();
};
const Model* Gemma3Gguf::model_ = nullptr;
const Tokenizer* Gemma3Gguf::tokenizer_ = nullptr;

TEST_F(Gemma3Gguf, ConfigIsGemma3WithFiveWindowLayersToOneFull) {
  const ModelConfig& c = model_->config;
  EXPECT_EQ(c.arch, "gemma3");
  EXPECT_EQ(c.n_layers, 18);
  EXPECT_EQ(c.sliding_window, 512);
  for (int64_t l = 0; l < c.n_layers; ++l) EXPECT_EQ(c.is_sliding(l), l % 6 != 5) << "layer " << l;
}

TEST_F(Gemma3Gguf, TokenizesAsLlamaCpp) {
  for (const auto& p : reference_["prompts"])
    EXPECT_EQ(tokenizer_->encode(p["prompt"].get<std::string>(), true, false), p["prompt_ids"].get<std::vector<int32_t>>())
        << p["prompt"];
  const auto& wiki = reference_["wikitext"];
  const fs::path file = fs::path(LOWBIT_SHARED_DIR) / wiki["file"].get<std::string>();
  if (!fs::exists(file)) GTEST_SKIP() << file << " absent (../shared not mounted)";
  std::stringstream text;
  text << std::ifstream(file, std::ios::binary).rdbuf();
  const std::vector<int32_t> ids = tokenizer_->encode(text.str(), true, false);
  EXPECT_EQ(ids.size(), wiki["tokens"].get<size_t>());
  const auto first = wiki["first_ids"].get<std::vector<int32_t>>();
  ASSERT_GE(ids.size(), first.size());
  EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(first.size())), first);
}

// The prompt as one batch (prefill), then one token at a time (decode), argmax each time.
TEST_F(Gemma3Gguf, GreedyDecodingMatchesLlamaCpp) {
  ThreadPool pool(0);
  for (const auto& p : reference_["prompts"]) {
    const auto prompt = p["prompt_ids"].get<std::vector<int32_t>>();
    const auto expected = p["greedy_ids"].get<std::vector<int32_t>>();
    KvCache cache(model_->config, model_->config.max_seq);
    std::vector<float> logits(static_cast<size_t>(model_->config.vocab));
    forward(*model_, cache, prompt, 0, logits.data(), false, pool);
    std::vector<int32_t> ids;
    while (ids.size() < expected.size()) {
      ids.push_back(static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
      forward(*model_, cache, std::span(&ids.back(), 1), static_cast<int64_t>(prompt.size() + ids.size() - 1),
              logits.data(), false, pool);
    }
    const auto same = std::mismatch(ids.begin(), ids.end(), expected.begin()).first - ids.begin();
    std::cout << "[ gemma3   ] " << p["prompt"] << ": " << same << " of " << expected.size()
              << " greedy tokens as llama.cpp\n";
    EXPECT_EQ(ids, expected) << p["prompt"];
  }
}

}  // namespace
}  // namespace lowbit::model
