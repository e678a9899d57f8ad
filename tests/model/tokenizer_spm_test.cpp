// SentencePiece: the Llama-2 tokenizer.model against the ids of the `sentencepiece` package
// (tests/model/fixtures/tokenizer_llama2.json), and the same vocabulary rebuilt from pieces, scores and types
// the way a GGUF "llama" tokenizer carries it.
#include <gtest/gtest.h>
#include <sentencepiece_processor.h>

#include <unistd.h>
#include <filesystem>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include <fmt/format.h>

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

TEST(SentencePiece, RejectsByteLikePieceWithoutHexDigits) {
  try {
    make_sentencepiece({{"<unk>", 0, 2}, {"<0xZZ>", 0, 6}}, std::nullopt, {}, false, "test");
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::format) << e.what();
  }
}

// Hostile SentencePiece models: tests/model/fixtures/spm_charsmap.model (make_spm_charsmap.py) is a real model whose
// NormalizerSpec carries a precompiled_charsmap (A -> a, B -> b, U+FF21 -> aa). A second NormalizerSpec appended to
// it replaces that charsmap (protobuf merges a repeated message field, the last bytes field wins), which is how a
// crafted table reaches libsentencepiece.

const fs::path kCharsmapModel = fs::path(LOWBIT_SOURCE_DIR) / "tests/model/fixtures/spm_charsmap.model";

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void put_varint(std::string& out, uint64_t v) {
  for (; v >= 0x80; v >>= 7) out += static_cast<char>((v & 0x7F) | 0x80);
  out += static_cast<char>(v);
}

void put_bytes_field(std::string& out, int field, std::string_view bytes) {
  put_varint(out, static_cast<uint64_t>(field) << 3 | 2);
  put_varint(out, bytes.size());
  out += bytes;
}

// A charsmap blob: [u32 trie bytes][units][replacements]; `trie_bytes` may lie.
std::string charsmap(const std::vector<uint32_t>& units, std::string_view replacements, uint32_t trie_bytes) {
  std::string blob(4, '\0');
  std::memcpy(blob.data(), &trie_bytes, 4);
  blob.append(reinterpret_cast<const char*>(units.data()), units.size() * 4);
  blob += replacements;
  return blob;
}

fs::path model_with_charsmap(std::string_view blob, const std::string& name) {
  std::string spec;
  put_bytes_field(spec, 2, blob);
  std::string model = read_bytes(kCharsmapModel);
  put_bytes_field(model, 3, spec);
  const fs::path p = fs::temp_directory_path() / fmt::format("lowbit-spm-{}-{}.model", name, ::getpid());
  std::ofstream(p, std::ios::binary) << model;
  return p;
}

TEST(SentencePiece, ModelWithARealCharsmapLoadsAndNormalizes) {
  const auto tok = load_sentencepiece(kCharsmapModel);
  // The sentencepiece package encodes "AB \uFF21" as ["\u2581ab", "\u2581a", "a"] (make_spm_charsmap.py prints it).
  EXPECT_EQ(concat_texts(*tok, tok->encode("AB \xEF\xBC\xA1", false)), " ab aa");
}

TEST(SentencePiece, CraftedCharsmapIsRefusedBeforeTheLibrarySeesIt) {
  std::vector<uint32_t> units(256, 0);  // all-zero units: a valid trie that maps nothing
  const std::string strings("x\0", 2);
  struct Case {
    std::string name;
    std::string blob;
  };
  std::vector<uint32_t> far_root = units;
  far_root[0] = (0x3FFFFFu << 10) | (1u << 9);  // root offset 2^30 units: children 4 GiB past the trie
  std::vector<uint32_t> bad_leaf = units;
  bad_leaf['A'] = 'A' | (1u << 8);  // a leaf for "A" whose value (the unit itself, 0x141) is past the strings
  std::vector<uint32_t> leaf_outside = units;
  leaf_outside['A'] = 'A' | (1u << 8) | (0x1000u << 10);  // the leaf's value unit lies outside the trie
  const std::vector<Case> cases = {
      {"trie-size-past-blob",
       charsmap(units, strings, static_cast<uint32_t>(4 + units.size() * 4 + strings.size() - 1))},
      {"trie-size-unaligned", charsmap(units, strings, 1022)},
      {"empty-trie", charsmap({}, strings, 0)},
      {"root-offset-outside", charsmap(far_root, strings, 1024)},
      {"leaf-value-outside-strings", charsmap(bad_leaf, strings, 1024)},
      {"leaf-unit-outside-trie", charsmap(leaf_outside, strings, 1024)},
      {"short-blob", std::string("\x01\x00", 2)},
  };
  for (const auto& c : cases) {
    const fs::path p = model_with_charsmap(c.blob, c.name);
    try {
      const auto tok = load_sentencepiece(p);
      tok->encode("AAAA BBBB", false);
      ADD_FAILURE() << c.name << ": accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::format) << c.name << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find(p.string()), std::string::npos) << e.what();
    }
    fs::remove(p);
  }
  // The all-zero trie itself is valid: it maps nothing, so text passes through unchanged (no A -> a).
  const fs::path p = model_with_charsmap(charsmap(units, strings, 1024), "zero-trie");
  EXPECT_EQ(concat_texts(*load_sentencepiece(p), load_sentencepiece(p)->encode("ab", false)), " ab");
  fs::remove(p);
}

TEST(SentencePiece, TruncatedOrMalformedProtobufIsAFormatError) {
  const std::string model = read_bytes(kCharsmapModel);
  for (const size_t cut : {size_t{1}, size_t{7}, model.size() / 2, model.size() - 1}) {
    const fs::path p = fs::temp_directory_path() / fmt::format("lowbit-spm-cut-{}.model", ::getpid());
    std::ofstream(p, std::ios::binary) << model.substr(0, cut);
    try {
      load_sentencepiece(p);
      ADD_FAILURE() << "cut at " << cut << ": accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::format) << e.what();
    }
    fs::remove(p);
  }
}

// fuzz_sentencepiece's finding (CI, 2026-12-04): pieces go into libsentencepiece's darts-clone trie as C strings,
// and a piece starting with a NUL became an empty key that darts threw out of the library (the process aborted).
// The model is the fuzzer's input: <unk>, <s>, </s>, then the NORMAL piece "\0\0\x81a".
TEST(SentencePiece, PieceWithANulByteIsRefusedBeforeTheLibrarySeesIt) {
  const std::string model("\x0a\x0e\x0a\x05<unk>\x15\0\0\0\0\x18\x02"
                          "\x0a\x0c\x0a\x03<s>\x15\0\0\0\0\x40\x03"
                          "\x0a\x0d\x0a\x04</s>\x15\0\0\0\0\x18\x03"
                          "\x0a\x0b\x0a\x04\0\0\x81" "a\x15\0\0\0\x80",
                          58);
  const fs::path p = fs::temp_directory_path() / fmt::format("lowbit-spm-nul-{}.model", ::getpid());
  std::ofstream(p, std::ios::binary) << model;
  try {
    load_sentencepiece(p);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::format) << e.what();
    EXPECT_NE(std::string(e.what()).find("holds a NUL byte"), std::string::npos) << e.what();
  }
  fs::remove(p);
  // The same piece from a GGUF vocabulary.
  try {
    make_sentencepiece({{"<unk>", 0, 2}, {std::string("a\0b", 3), 0, 1}}, std::nullopt, {}, false, "test");
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::format) << e.what();
  }
}

}  // namespace
}  // namespace lowbit::model
