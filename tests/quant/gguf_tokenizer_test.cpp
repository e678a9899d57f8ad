// Quantizing a GGUF source stores its tokenizer in the artifact: the runtime reads it back without --tokenizer and
// generates the same tokens as with the source's tokenizer.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "lowbit/model/model.h"
#include "lowbit/model/tokenizers.h"
#include "lowbit/quant/pipeline.h"
#include "quant/quant_fixture.h"
#include "quant/tiny_gguf.h"

namespace lowbit::quant {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;
using testing::write_gguf;

std::string stdout_of(const std::string& command) {
  std::string out;
  FILE* p = ::popen(command.c_str(), "r");
  if (!p) return out;
  char buffer[512];
  for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, p)) > 0;) out.append(buffer, n);
  EXPECT_EQ(::pclose(p), 0) << command;
  return out;
}

TEST(GgufTokenizer, StoredInTheArtifactAndReadBackWithoutTokenizerOption) {
  TempDir tmp;
  QuantizeOptions o;
  o.source = write_gguf(tmp.path);
  o.destination = tmp.path / "out";
  o.recipe = preset("affine4");
  quantize(o);
  EXPECT_TRUE(fs::exists(o.destination / "tokenizer.gguf"));
  EXPECT_TRUE(fs::exists(o.destination / "tokenizer_config.json"));  // the chat template
  EXPECT_LT(fs::file_size(o.destination / "tokenizer.gguf"), fs::file_size(o.source));

  const auto source = model::load_tokenizer(o.source, std::nullopt);
  const auto stored = model::load_tokenizer(o.destination, std::nullopt);
  EXPECT_EQ(stored->vocab_size(), source->vocab_size());
  EXPECT_EQ(stored->bos_id(), source->bos_id());
  EXPECT_EQ(stored->eos_ids(), source->eos_ids());
  for (const char* text : {"ab ba", " a b ab", "b\xc3\xa9 z"})
    EXPECT_EQ(stored->encode(text, true), source->encode(text, true)) << text;

  const std::string generate =
      fmt::format("'{}' generate '{}' -p 'ab ba ab' -n 12 --temp 0 2>/dev/null", LOWBIT_CLI, o.destination.string());
  const std::string without = stdout_of(generate);
  EXPECT_FALSE(without.empty());
  EXPECT_EQ(without, stdout_of(generate + fmt::format(" --tokenizer '{}'", o.source.string())));
}

}  // namespace
}  // namespace lowbit::quant
