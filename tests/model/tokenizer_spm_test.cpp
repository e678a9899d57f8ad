// SentencePiece: the Llama-2 tokenizer.model against the ids of the `sentencepiece` package
// (tests/model/fixtures/tokenizer_llama2.json), and the same vocabulary rebuilt from pieces, scores and types
// the way a GGUF "llama" tokenizer carries it.
#include <gtest/gtest.h>
#include <sentencepiece_processor.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "lowbit/core/error.h"
#include "lowbit/model/tokenizers.h"

namespace lowbit::model {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kLlama2 = fs::path(LOWBIT_SHARED_DIR) / "tokenizers/llama2/tokenizer.model";

json fixture() {
  return json::parse(std::ifstream(fs::path(LOWBIT_SOURCE_DIR) / "tests/model/fixtures/tokenizer_llama2.json"));
}

std::string concat_texts(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  std::string out;
  for (int32_t id : ids) out += tok.token_text(id);
  return out;
}

void expect_fixture_ids(const Tokenizer& tok, bool check_text) {
  const json f = fixture();
  for (const auto& [name, text] : f.at("texts").items()) {
    const auto& expected = f.at("expected").at(name);
    const auto ids = tok.encode(text.get<std::string>(), false, false);
    EXPECT_EQ(ids, expected.at("ids").get<std::vector<int32_t>>()) << name;
    if (!check_text) continue;
    // SentencePiece's decoder drops the space of the dummy prefix; token texts keep it.
    std::string decoded = concat_texts(tok, ids);
    if (!decoded.empty() && decoded[0] == ' ') decoded.erase(0, 1);
    EXPECT_EQ(decoded, expected.at("decoded").get<std::string>()) << name;
  }
}

TEST(SentencePiece, Llama2MatchesReferenceIds) {
  if (!fs::exists(kLlama2)) GTEST_SKIP() << kLlama2 << " absent (../shared not mounted)";
  auto tok = load_sentencepiece(kLlama2);
  EXPECT_EQ(tok->vocab_size(), 32000);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_ids(), (std::vector<int32_t>{2}));
  expect_fixture_ids(*tok, true);
}

TEST(SentencePiece, BosControlTokensAndByteFallback) {
  if (!fs::exists(kLlama2)) GTEST_SKIP() << kLlama2 << " absent (../shared not mounted)";
  auto tok = load_sentencepiece(kLlama2);
  EXPECT_EQ(tok->encode("Hi", true).front(), 1);
  const auto ids = tok->encode("a</s>", false, true);
  EXPECT_EQ(ids.back(), 2);
  EXPECT_NE(tok->encode("a</s>", false, false).back(), 2);
  // An emoji absent from the vocabulary falls back to its four UTF-8 bytes.
  const auto emoji = tok->encode("\xF0\x9F\xA6\x99", false);
  EXPECT_EQ(concat_texts(*tok, emoji), " \xF0\x9F\xA6\x99");
  EXPECT_EQ(tok->token_text(*tok->token_id("<0x0A>")), "\n");
}

TEST(SentencePiece, RebuiltFromPiecesMatchesTheModelFile) {
  if (!fs::exists(kLlama2)) GTEST_SKIP() << kLlama2 << " absent (../shared not mounted)";
  sentencepiece::SentencePieceProcessor sp;
  ASSERT_TRUE(sp.Load(kLlama2.string()).ok());
  std::vector<SpmPiece> pieces;
  for (int id = 0; id < sp.GetPieceSize(); ++id) {
    const int type = sp.IsUnknown(id) ? 2 : sp.IsControl(id) ? 3 : sp.IsUnused(id) ? 5 : sp.IsByte(id) ? 6 : 1;
    pieces.push_back({sp.IdToPiece(id), sp.GetScore(id), type});
  }
  auto tok = make_sentencepiece(pieces, 1, {2}, true, "test");
  expect_fixture_ids(*tok, true);
  EXPECT_EQ(tok->encode("x", true).front(), 1);
}

// Gemma's GGUF vocabulary in small: no space prefix, and user-defined pieces (runs of newlines and spaces, HTML
// tags) matched in the raw text, special tokens parsed or not, as llama.cpp does. Scores make "ab" and "▁b" merge.
TEST(SentencePiece, UserDefinedPiecesAndNoSpacePrefix) {
  const std::vector<SpmPiece> pieces = {{"<unk>", 0, 2}, {"<bos>", 0, 3}, {"\n\n", 0, 4}, {"  ", 0, 4},
                                        {"<b>", 0, 4},   {"a", -1, 1},    {"b", -1, 1},    {"ab", -0.5f, 1},
                                        {"\xE2\x96\x81", -1, 1}, {"\xE2\x96\x81" "b", -0.5f, 1}};
  auto gemma = make_sentencepiece(pieces, 1, {}, true, "test", false);
  for (bool special : {false, true})
    EXPECT_EQ(gemma->encode("ab\n\nab  b<b>a b", true, special), (std::vector<int32_t>{1, 7, 2, 7, 3, 6, 4, 5, 9}));
  EXPECT_EQ(gemma->token_text_after(1, 9), " b");  // no dummy prefix to drop
  auto llama = make_sentencepiece(pieces, 1, {}, true, "test");
  EXPECT_EQ(llama->encode("ab", false), (std::vector<int32_t>{8, 7}));  // "▁ab": the dummy prefix
}

TEST(SentencePiece, RejectsVocabularyWithoutUnknownPiece) {
  try {
    make_sentencepiece({{"a", 0, 1}, {"b", 0, 1}}, std::nullopt, {}, false, "test");
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::format);
  }
}

}  // namespace
}  // namespace lowbit::model
