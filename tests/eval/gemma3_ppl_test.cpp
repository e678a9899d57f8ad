// Gemma-3-270M's perplexity on WikiText-2's first two windows (ctx 512, scored as llama-perplexity scores them)
// against a float64 forward of the same weights and against llama-perplexity (tests/model/gemma3_reference.h;
// skips without the GGUF). lowbit's f32 matches float64; llama.cpp's rounding of activations to 8 bits, of the KV
// cache to f16 and of GELU to fp16 moves its perplexity by 0.7-0.8% on these windows (11.1128 against float64's
// 11.1918 on the first), so the bound against llama.cpp on two windows is 1%. Over llama-perplexity's 20 windows
// (its --chunks 20; lowbit on the file's first 45000 bytes, 20 whole windows, 2026-12-04) the rounding averages
// out: lowbit 18.6005 against 18.6171 (-0.09%), inside issue 16's 0.5%, but too slow for a test on the CPU.
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

TEST(Gemma3Perplexity, MatchesFloat64AndLlamaCppUpToItsRounding) {
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
  WindowOptions options;
  options.ctx = ctx;
  options.bos = tokenizer->bos_id();
  const PerplexityResult r = perplexity(*model, tokens, options, pool);
  const double llama_cpp = reference["llama_perplexity"];
  const double f64 = testing::gemma3_llama_cpp_reference()["float64"]["perplexity"];
  std::cout << "[ gemma3   ] perplexity " << r.ppl << " over " << r.windows << " windows; float64 " << f64
            << ", llama-perplexity " << llama_cpp << " (" << 100 * (r.ppl / llama_cpp - 1) << "%)\n";
  EXPECT_EQ(r.windows, reference["windows"].get<int64_t>());
  EXPECT_NEAR(r.ppl / f64, 1.0, 1e-4);
  EXPECT_NEAR(r.ppl / llama_cpp, 1.0, 0.01);
}

}  // namespace
}  // namespace lowbit::eval
