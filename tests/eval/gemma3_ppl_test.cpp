// Gemma-3-270M's perplexity on WikiText-2 (ctx 512, the windows llama-perplexity scores) within 0.5% of
// llama-perplexity's on the same text (tests/model/gemma3_reference.h; skips without the GGUF).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "lowbit/core/thread_pool.h"
#include "lowbit/eval/perplexity.h"
#include "lowbit/model/gguf_model.h"
#include "model/gemma3_reference.h"

namespace lowbit::eval {
namespace {

namespace fs = std::filesystem;

TEST(Gemma3Perplexity, WithinHalfAPercentOfLlamaCpp) {
  if (!fs::exists(testing::gemma3_gguf())) GTEST_SKIP() << testing::gemma3_gguf() << testing::kGemma3Absent;
  const auto reference = testing::gemma3_llama_cpp_reference()["perplexity"];
  const fs::path file = fs::path(LOWBIT_SHARED_DIR) / reference["file"].get<std::string>();
  if (!fs::exists(file)) GTEST_SKIP() << file << " absent (../shared not mounted)";
  std::string text(reference["prefix_bytes"].get<size_t>(), '\0');
  std::ifstream(file, std::ios::binary).read(text.data(), static_cast<std::streamsize>(text.size()));
  const int64_t ctx = reference["ctx"];
  const auto model = model::load_model(testing::gemma3_gguf(), {.max_seq = ctx});
  const auto tokenizer = model::load_gguf_tokenizer(testing::gemma3_gguf());
  const std::vector<int32_t> tokens = tokenizer->encode(text, true, false);
  ThreadPool pool(0);
  const PerplexityResult r = perplexity(*model, tokens, {.ctx = ctx, .bos = tokenizer->bos_id()}, pool);
  const double expected = reference["llama_perplexity"];
  std::cout << "[ gemma3   ] perplexity " << r.ppl << " over " << r.windows << " windows; llama-perplexity "
            << expected << " (" << 100 * (r.ppl / expected - 1) << "%)\n";
  EXPECT_EQ(r.windows, reference["windows"].get<int64_t>());
  EXPECT_NEAR(r.ppl / expected, 1.0, 0.005);
}

}  // namespace
}  // namespace lowbit::eval
