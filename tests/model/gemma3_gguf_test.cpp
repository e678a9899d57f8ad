// Gemma-3-270M from its public GGUF against llama.cpp and a float64 forward of the same weights
// (tests/model/gemma3_reference.h): the vocabulary gives llama.cpp's ids, the logits are float64's, greedy
// decoding departs from llama.cpp's only at near ties that llama.cpp's rounding decides, and it is llama.cpp's
// exactly when llama.cpp computes in float32 too.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "lowbit/core/thread_pool.h"
#include "lowbit/model/chat.h"
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

// The GGUF stores no chat template: chat uses the family's built-in Gemma format, ending turns at <end_of_turn>.
TEST_F(Gemma3Gguf, ChatUsesTheGemmaTemplateTheFamilyNames) {
  const ChatTemplate tmpl = chat_template_for(*model_, testing::gemma3_gguf(), *tokenizer_);
  EXPECT_EQ(tmpl.jinja->name(), "builtin gemma");
  EXPECT_EQ(render_chat(tmpl, {{"system", "Be brief."}, {"user", " Hi "}}, true),
            "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n");
}

TEST_F(Gemma3Gguf, TokenizesAsLlamaCpp) {
  for (const auto& p : reference_["prompts"])
    EXPECT_EQ(tokenizer_->encode(p["prompt"].get<std::string>(), true, false),
              p["prompt_ids"].get<std::vector<int32_t>>())
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

// lowbit computes in f32 on the dequantized weights, and so matches a float64 forward of them
// (scripts/gemma3_f64_reference.py) to kFloat64. llama.cpp's CPU path rounds the activations of every quantized
// matmul to 8 bits (Q8_0 / Q8_K blocks), q, k and v to f16 and GELU through an fp16 table: its logits here are up
// to 0.37 from float64's (after "def fibonacci(n):"), and the float64 forward with those roundings emulated moves
// by up to 0.31 (another draw of the same noise). kLlamaCppRounding bounds it.
constexpr double kFloat64 = 2e-3;
constexpr double kLlamaCppRounding = 0.5;

// Logits after each prompt (one prefill) for llama.cpp's top-5 ids: within kFloat64 of float64, within
// kLlamaCppRounding of llama.cpp.
TEST_F(Gemma3Gguf, LogitsMatchFloat64AndLlamaCppUpToItsRounding) {
  ThreadPool pool(0);
  const auto& f64 = reference_["float64"]["top5_logits"];
  for (size_t i = 0; i < reference_["prompts"].size(); ++i) {
    const auto& p = reference_["prompts"][i];
    const auto prompt = p["prompt_ids"].get<std::vector<int32_t>>();
    KvCache cache(model_->config, model_->config.max_seq);
    std::vector<float> logits(static_cast<size_t>(model_->config.vocab));
    forward(*model_, cache, prompt, 0, logits.data(), false, pool);
    for (const auto& t : p["top5"]) {
      const int32_t id = t["id"];
      EXPECT_NEAR(logits[id], f64[i][std::to_string(id)].get<double>(), kFloat64) << p["prompt"] << " id " << id;
      EXPECT_NEAR(logits[id], t["logit"].get<double>(), kLlamaCppRounding) << p["prompt"] << " id " << id;
    }
  }
}

// Greedy decoding fed llama.cpp's 64 tokens (prefill, then one token at a time): wherever lowbit's argmax is not
// llama.cpp's token, llama.cpp's token must be within kLlamaCppRounding of lowbit's best (a near tie its rounding
// can flip). Up to the first such step lowbit's own greedy output is llama.cpp's; that count is printed.
TEST_F(Gemma3Gguf, GreedyDecodingFollowsLlamaCppUpToItsRounding) {
  ThreadPool pool(0);
  for (const auto& p : reference_["prompts"]) {
    const auto prompt = p["prompt_ids"].get<std::vector<int32_t>>();
    const auto expected = p["greedy_ids"].get<std::vector<int32_t>>();
    KvCache cache(model_->config, model_->config.max_seq);
    std::vector<float> logits(static_cast<size_t>(model_->config.vocab));
    forward(*model_, cache, prompt, 0, logits.data(), false, pool);
    std::optional<size_t> first_difference;
    for (size_t i = 0; i < expected.size(); ++i) {
      const auto best = std::max_element(logits.begin(), logits.end());
      if (best - logits.begin() != expected[i]) {
        if (!first_difference) first_difference = i;
        EXPECT_LE(*best - logits[expected[i]], kLlamaCppRounding) << p["prompt"] << " step " << i;
      }
      forward(*model_, cache, std::span(&expected[i], 1), static_cast<int64_t>(prompt.size() + i), logits.data(),
              false, pool);
    }
    std::cout << "[ gemma3   ] " << p["prompt"] << ": greedy output as llama.cpp's for "
              << first_difference.value_or(expected.size()) << " of " << expected.size() << " tokens\n";
  }
}

// llama.cpp computing in float32 (greedy_f32_ids: its greedy decoding of the all-F32 GGUF llama-quantize dequantizes
// from this one, with an f32 KV cache and flash attention off) rounds only GELU, through its fp16 table: its logits
// stay within 0.01 of float64's (lowbit's within kFloat64), and every step of these prompts goes the same way in
// both, the closest being step 25 after "The capital of France is" (lead 0.0043 in llama.cpp, 0.0048 in lowbit and
// float64). lowbit's own greedy output must be llama.cpp's 64 tokens.
TEST_F(Gemma3Gguf, GreedyOutputIsLlamaCppsInFloat32) {
  ThreadPool pool(0);
  for (const auto& p : reference_["prompts"]) {
    const auto prompt = p["prompt_ids"].get<std::vector<int32_t>>();
    const auto expected = p["greedy_f32_ids"].get<std::vector<int32_t>>();
    KvCache cache(model_->config, model_->config.max_seq);
    std::vector<float> logits(static_cast<size_t>(model_->config.vocab));
    forward(*model_, cache, prompt, 0, logits.data(), false, pool);
    std::vector<int32_t> generated;
    while (generated.size() < expected.size()) {
      generated.push_back(static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
      forward(*model_, cache, std::span(&generated.back(), 1),
              static_cast<int64_t>(prompt.size() + generated.size() - 1), logits.data(), false, pool);
    }
    EXPECT_EQ(generated, expected) << p["prompt"];
  }
}

}  // namespace
}  // namespace lowbit::model
