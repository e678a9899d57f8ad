// The forward pass, loaders, conversion and generation, on small random models and on stories260K.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "lowbit/core/error.h"
#include "lowbit/core/thread_pool.h"
#include "lowbit/model/family.h"
#include "lowbit/model/generate.h"
#include "lowbit/model/hf.h"
#include "lowbit/model/llama2c.h"
#include "model/tiny_model.h"

namespace lowbit::model {
namespace {

namespace fs = std::filesystem;

const fs::path kStories = fs::path(LOWBIT_SHARED_DIR) / "models" / "stories260K";

#define SKIP_WITHOUT_STORIES()                                                                        \
  if (!fs::exists(kStories / "stories260K.bin")) GTEST_SKIP() << "../shared/models/stories260K is absent"

fs::path temp_dir(std::string_view name) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("lowbit_model_test_{}_{}", name, ::getpid());
  fs::remove_all(dir);
  return dir;
}

using testing::prefill_logits;
using testing::stepwise_logits;

void expect_near(const std::vector<float>& a, const std::vector<float>& b, float tol) {
  ASSERT_EQ(a.size(), b.size());
  float worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  EXPECT_LE(worst, tol);
}

const std::vector<int32_t> kTokens{1, 5, 9, 30, 2, 17, 17, 4, 0, 31, 12};

TEST(Forward, PrefillMatchesDecodeForEveryArchitectureFlag) {
  ThreadPool pool(3);
  for (int variant = 0; variant < 4; ++variant) {
    ModelConfig c = testing::tiny_config();
    c.qkv_bias = variant == 1;
    if (variant == 2) c.arch = "qwen3";  // q/k norms
    c.tied_embeddings = variant == 3;
    c.rope_style = variant == 3 ? RopeStyle::interleaved : RopeStyle::half;
    const auto m = testing::tiny_model(c, 7 + variant);
    expect_near(prefill_logits(*m, kTokens, pool), stepwise_logits(*m, kTokens, pool), 1e-5f);
  }
}

TEST(Forward, RowsTogetherEqualEachAloneForEveryArchitectureFlag) {
  ThreadPool pool(3);
  // rows at positions 11, 1, 4 and 11 of their own caches, then 5 decode steps
  const std::vector<std::vector<int32_t>> prompts{kTokens, {3}, {8, 8, 1, 6}, {31, 0, 4, 4, 9, 2, 7, 1, 1, 5, 20}};
  for (int variant = 0; variant < 4; ++variant) {
    ModelConfig c = testing::tiny_config();
    c.qkv_bias = variant == 1;
    if (variant == 2) c.arch = "qwen3";  // q/k norms
    c.tied_embeddings = variant == 3;
    c.rope_style = variant == 3 ? RopeStyle::interleaved : RopeStyle::half;
    const auto m = testing::tiny_model(c, 7 + variant);
    const testing::RowsAndAlone r = testing::decode_rows_and_alone(*m, prompts, 5, pool);
    expect_near(r.rows, r.alone, 1e-5f);
    // One row is forward() itself: the same kernels, the same sums.
    const testing::RowsAndAlone one = testing::decode_rows_and_alone(*m, {{1, 2}}, 2, pool);
    EXPECT_EQ(one.rows, one.alone);
  }
}

TEST(Forward, RowsRejectPositionsBeyondTheirCacheAndMismatchedSpans) {
  ThreadPool pool(1);
  const auto m = testing::tiny_model(testing::tiny_config());
  KvCache a(m->config, 4), b(m->config, 2);
  std::vector<KvCache*> caches{&a, &b};
  std::vector<float> logits(2 * static_cast<size_t>(m->config.vocab));
  const std::vector<int32_t> tokens{1, 2};
  const auto code = [&](std::vector<KvCache*> cs, std::vector<int64_t> pos) -> std::optional<Errc> {
    try {
      forward_rows(*m, cs, tokens, pos, logits.data(), pool);
    } catch (const Error& e) {
      return e.code();
    }
    return std::nullopt;
  };
  EXPECT_EQ(code(caches, {3, 1}), std::nullopt);
  EXPECT_EQ(code(caches, {3, 2}), Errc::limit);  // b holds positions 0..1
  EXPECT_EQ(code(caches, {-1, 0}), Errc::limit);
  EXPECT_EQ(code(caches, {0}), Errc::internal);
  EXPECT_EQ(code({&a, nullptr}, {0, 0}), Errc::internal);
}

TEST(Forward, LogitsDependOnContext) {
  ThreadPool pool(1);
  const auto m = testing::tiny_model(testing::tiny_config());
  const auto a = prefill_logits(*m, {1, 2, 3}, pool);
  const auto b = prefill_logits(*m, {4, 2, 3}, pool);
  EXPECT_NE(std::vector<float>(a.end() - 32, a.end()), std::vector<float>(b.end() - 32, b.end()));
}

TEST(Forward, RejectsPositionsBeyondTheCache) {
  ThreadPool pool(1);
  const auto m = testing::tiny_model(testing::tiny_config());
  KvCache cache(m->config, 2);
  std::vector<float> logits(m->config.vocab);
  const std::vector<int32_t> three{1, 2, 3};
  try {
    forward(*m, cache, three, 0, logits.data(), false, pool);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::limit);
  }
  const std::vector<int32_t> bad{99};
  EXPECT_THROW(forward(*m, cache, bad, 0, logits.data(), false, pool), Error);
}

TEST(Rope, PermutationRoundTripsAndMovesPairs) {
  std::vector<float> w(2 * 4 * 3);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i);
  const auto half = permute_rope_rows(w, 2, 4, 3, RopeStyle::interleaved, RopeStyle::half);
  // Head 0: interleaved rows (0,1),(2,3) are pairs; in half layout pair i sits at rows i and i + 2.
  EXPECT_EQ(half[1 * 3], w[2 * 3]);  // half row 1 = interleaved row 2
  EXPECT_EQ(half[2 * 3], w[1 * 3]);  // half row 2 = interleaved row 1
  EXPECT_EQ(permute_rope_rows(half, 2, 4, 3, RopeStyle::half, RopeStyle::interleaved), w);
}

TEST(Config, ParsesArchitectureRows) {
  nlohmann::json hf = {{"model_type", "qwen3"}, {"hidden_size", 64}, {"num_hidden_layers", 2},
                       {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 32},
                       {"intermediate_size", 96}, {"vocab_size", 100}, {"rope_theta", 1e6},
                       {"tie_word_embeddings", true}, {"eos_token_id", 5}};
  ModelConfig c = parse_hf_config(hf, "test");
  EXPECT_EQ(c.arch, "qwen3");
  EXPECT_TRUE(describe_model(c, "test").layers[0].has(Role::q_norm));
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.q_dim(), 128);
  EXPECT_EQ(c.eos_ids, std::vector<int32_t>{5});
  hf["model_type"] = "qwen2";
  EXPECT_TRUE(parse_hf_config(hf, "test").qkv_bias);
  hf["model_type"] = "gpt2";
  hf["architectures"] = {"GPT2LMHeadModel"};
  try {
    parse_hf_config(hf, "test");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::unsupported);
  }
  hf["model_type"] = "llama";
  hf["num_key_value_heads"] = 3;
  EXPECT_THROW(parse_hf_config(hf, "test"), Error);
}

TEST(Config, Llama3RopeScalingKeepsHighAndScalesLowFrequencies) {
  ModelConfig c = testing::tiny_config();
  c.head_dim = 128;
  c.rope_theta = 500000;
  const auto plain = rope_inv_freq(c);
  c.rope_scaling.kind = RopeScaling::Kind::llama3;
  c.rope_scaling.factor = 8.0;
  c.rope_scaling.original_max_position = 8192;  // low_freq_factor 1, high_freq_factor 4: the defaults
  const auto scaled = rope_inv_freq(c);
  EXPECT_EQ(scaled.front(), plain.front());                       // wavelength 2*pi: untouched
  EXPECT_FLOAT_EQ(scaled.back(), plain.back() / 8.0f);            // longest wavelength: divided by factor
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_LE(scaled[i], plain[i]);
}

TEST(Llama2c, TokenizerRoundTripsText) {
  SKIP_WITHOUT_STORIES();
  const auto tok = load_llama2c_tokenizer(kStories / "tok512.bin");
  EXPECT_EQ(tok->vocab_size(), 512);
  const std::string text = "Once upon a time, Lily saw a big red ball. \xc3\xa9\xe2\x9c\x93!";
  const auto ids = tok->encode(text, true);
  ASSERT_GT(ids.size(), 2u);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(tok->decode(ids), text);
  EXPECT_EQ(tok->encode("", true), std::vector<int32_t>{1});
}

TEST(Llama2c, RejectsTruncatedCheckpoint) {
  SKIP_WITHOUT_STORIES();
  const fs::path dir = temp_dir("trunc");
  fs::create_directories(dir);
  std::ifstream in(kStories / "stories260K.bin", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  for (size_t keep : {size_t{10}, size_t{1000}, bytes.size() - 4}) {
    std::ofstream(dir / "cut.bin", std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(keep));
    EXPECT_THROW(load_model(dir / "cut.bin"), Error) << keep;
  }
  fs::remove_all(dir);
}

TEST(Stories260K, GreedyGenerationMatchesReference) {
  SKIP_WITHOUT_STORIES();
  std::ifstream ref_file(kStories / "REFERENCE.md");
  std::stringstream ref_text;
  ref_text << ref_file.rdbuf();
  const std::string ref = ref_text.str();
  const size_t open = ref.find("```\n");
  const size_t close = ref.find("```", open + 4);
  ASSERT_NE(close, std::string::npos);
  const std::string expected = ref.substr(open + 4, close - open - 4);

  const auto model = load_model(kStories / "stories260K.bin");
  const auto tok = load_tokenizer(kStories / "stories260K.bin", kStories / "tok512.bin");
  GenerateOptions options;
  options.steps = 255;
  options.sampler.temperature = 0;
  std::string out;
  ThreadPool pool(2);
  const auto stats = generate(*model, *tok, options, pool, [&](std::string_view s) { out += s; });
  EXPECT_EQ(out, expected);
  EXPECT_EQ(stats.generated_tokens, 256);
}

// One token per lowercase letter, no BOS (as Qwen's tokenizers): the echoed prompt must keep its first token.
class LetterTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text, bool, bool) const override {
    std::vector<int32_t> ids;
    for (char ch : text) ids.push_back(ch - 'a');
    return ids;
  }
  std::string token_text(int32_t id) const override { return std::string(1, static_cast<char>('a' + id % 26)); }
  int32_t vocab_size() const override { return 32; }
  std::optional<int32_t> bos_id() const override { return std::nullopt; }
  std::vector<int32_t> eos_ids() const override { return {}; }
  std::optional<int32_t> token_id(std::string_view) const override { return std::nullopt; }
};

TEST(Generate, EchoKeepsTheFirstTokenWithoutBos) {
  const auto model = testing::tiny_model(testing::tiny_config());
  GenerateOptions options;
  options.prompt = "abc";
  options.steps = 2;
  options.sampler.temperature = 0;
  std::string out;
  ThreadPool pool(1);
  generate(*model, LetterTokenizer(), options, pool, [&](std::string_view s) { out += s; });
  EXPECT_EQ(out.substr(0, 3), "abc") << out;
  EXPECT_EQ(out.size(), 3u + 3u + 1u) << out;  // the prompt, steps + 1 tokens, the final newline
}

TEST(Stories260K, HfConversionGivesTheSameLogits) {
  SKIP_WITHOUT_STORIES();
  const auto original = load_model(kStories / "stories260K.bin");
  EXPECT_EQ(original->config.rope_style, RopeStyle::interleaved);
  const fs::path dir = temp_dir("convert");
  write_hf(*original, dir);
  const auto converted = load_model(dir);
  EXPECT_EQ(converted->config.rope_style, RopeStyle::half);
  EXPECT_TRUE(converted->config.tied_embeddings);
  ThreadPool pool(2);
  const std::vector<int32_t> tokens{1, 403, 407, 261, 378, 44, 343, 290, 280, 15, 300};
  // The permuted q/k rows sum in another order: logits near 10 differ by a few float ulp (1.1e-5 in the
  // one-lane build the debug preset compiles), not by a conversion error, which moves them by far more.
  expect_near(prefill_logits(*original, tokens, pool), prefill_logits(*converted, tokens, pool), 3e-5f);
  EXPECT_THROW(write_hf(*original, dir), Error);  // refuses an existing directory
  fs::remove_all(dir);
}

}  // namespace
}  // namespace lowbit::model
