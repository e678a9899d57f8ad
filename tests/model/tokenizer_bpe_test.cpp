// Byte-level BPE: hand-built vocabularies for the mechanics (merge ranks, merge formats, added tokens, NFC,
// split patterns), and the Qwen3 tokenizer.json against the ids of Hugging Face `tokenizers`
// (tests/model/fixtures/tokenizer_qwen3.json, written by scripts/make_tokenizer_fixtures.py).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "lowbit/core/error.h"
#include "lowbit/model/tokenizers.h"

namespace lowbit::model {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string concat_texts(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  std::string out;
  for (int32_t id : ids) out += tok.token_text(id);
  return out;
}

// GPT-2's byte alphabet, written out independently of the implementation: printable bytes stay, the others
// take U+0100.. in byte order.
std::string byte_char(unsigned char b) {
  static const auto table = [] {
    std::vector<uint32_t> t(256);
    uint32_t n = 0;
    for (int c = 0; c < 256; ++c) {
      const bool keep = (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255);
      t[c] = keep ? c : 256 + n++;
    }
    return t;
  }();
  const uint32_t cp = table[b];
  std::string s;
  if (cp < 0x80) s += static_cast<char>(cp);
  else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// Vocabulary: ids 0..255 are the bytes, then the given merged tokens in order.
BpeSpec byte_spec(const std::vector<std::pair<std::string, std::string>>& merges) {
  BpeSpec spec;
  for (int b = 0; b < 256; ++b) spec.vocab.emplace_back(byte_char(static_cast<unsigned char>(b)), b);
  int32_t next = 256;
  for (const auto& [a, b] : merges) {
    spec.vocab.emplace_back(a + b, next++);
    spec.merges.emplace_back(a, b);
  }
  return spec;
}

TEST(BpeTokenizer, MergesLowestRankFirst) {
  // "abc": rank 0 merges "b c" before "a b" could, so the result is a + bc, not ab + c.
  auto tok = make_bpe_tokenizer(byte_spec({{"b", "c"}, {"a", "b"}, {"a", "bc"}}));
  EXPECT_EQ(tok->encode("abc", false), (std::vector<int32_t>{258}));
  EXPECT_EQ(tok->encode("ab", false), (std::vector<int32_t>{257}));
  EXPECT_EQ(tok->encode("cab", false), (std::vector<int32_t>{'c', 257}));
  EXPECT_EQ(concat_texts(*tok, tok->encode("cabbc", false)), "cabbc");
}

TEST(BpeTokenizer, TiesMergeLeftmostFirst) {
  auto tok = make_bpe_tokenizer(byte_spec({{"a", "a"}}));
  EXPECT_EQ(tok->encode("aaa", false), (std::vector<int32_t>{256, 'a'}));
}

TEST(BpeTokenizer, BytesMapThroughTheByteAlphabet) {
  auto tok = make_bpe_tokenizer(byte_spec({}));
  const std::string text("\x00 \xff\n\xc3\xa9", 6);
  const auto ids = tok->encode(text, false);
  EXPECT_EQ(ids, (std::vector<int32_t>{0, ' ', 255, '\n', 0xC3, 0xA9}));
  EXPECT_EQ(concat_texts(*tok, ids), text);
}

TEST(BpeTokenizer, AddedAndSpecialTokensSplitFirst) {
  auto spec = byte_spec({{"<", "|"}});
  spec.added = {{300, "<|end|>", true}, {301, "<think>", false}};
  auto tok = make_bpe_tokenizer(spec);
  EXPECT_EQ(tok->encode("a<|end|>b<think>", false, true), (std::vector<int32_t>{'a', 300, 'b', 301}));
  // Without parse_special the special token is text; plain added tokens still split out.
  const auto plain = tok->encode("a<|end|><think>", false, false);
  EXPECT_EQ(plain, (std::vector<int32_t>{'a', 256, 'e', 'n', 'd', '|', '>', 301}));
  EXPECT_EQ(tok->token_text(300), "<|end|>");
  EXPECT_EQ(tok->token_id("<|end|>"), 300);
  EXPECT_EQ(tok->vocab_size(), 302);
}

TEST(BpeTokenizer, NfcComposesBeforeMerging) {
  auto spec = byte_spec({{"\xc3\x83", "\xc2\xa9"}});  // byte-level "Ã©" = bytes C3 A9 = "é"
  spec.nfc = true;
  auto tok = make_bpe_tokenizer(spec);
  EXPECT_EQ(tok->encode("e\xcc\x81", false), (std::vector<int32_t>{256}));  // e + U+0301 -> é
  spec.nfc = false;
  auto raw = make_bpe_tokenizer(spec);
  EXPECT_EQ(raw->encode("e\xcc\x81", false), (std::vector<int32_t>{'e', 0xCC, 0x81}));
}

TEST(BpeTokenizer, SplitPatternsBoundMerges) {
  const std::vector<std::pair<std::string, std::string>> merges = {{"1", "2"}, {"12", "3"}, {"3", "4"}, {"4", "5"}};
  auto spec = byte_spec(merges);
  spec.split_patterns = {kPatternLlama3};  // digits in groups of three: "123" "45"
  EXPECT_EQ(make_bpe_tokenizer(spec)->encode("12345", false), (std::vector<int32_t>{257, 259}));
  spec.split_patterns = {kPatternQwen2};  // one digit per piece
  EXPECT_EQ(make_bpe_tokenizer(spec)->encode("12345", false), (std::vector<int32_t>{'1', '2', '3', '4', '5'}));
  spec.split_patterns = {};  // no pre-tokenizer: "12" then "123", then "45" from what is left
  EXPECT_EQ(make_bpe_tokenizer(spec)->encode("12345", false), (std::vector<int32_t>{257, 259}));
}

TEST(BpeTokenizer, Gpt2PatternSplitsContractionsAndSpaces) {
  auto spec = byte_spec({{"'", "s"}, {byte_char(' '), "a"}, {"s", byte_char(' ')}});
  spec.split_patterns = {kPatternGpt2};
  // "it's a": pieces "it" "'s" " a"; the merge "s " never applies across the piece boundary.
  EXPECT_EQ(make_bpe_tokenizer(spec)->encode("it's a", false), (std::vector<int32_t>{'i', 't', 256, 257}));
}

TEST(BpeTokenizer, RejectsMergesOutsideTheVocabulary) {
  auto spec = byte_spec({});
  spec.merges.emplace_back("x", "y");
  try {
    make_bpe_tokenizer(spec);
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::format);
  }
}

// A minimal tokenizer.json, merges written as strings or as pairs.
fs::path write_tokenizer_json(const fs::path& dir, bool merges_as_pairs) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(static_cast<unsigned char>(b))] = b;
  vocab["ab"] = 256;
  vocab[byte_char(' ') + "ab"] = 257;
  json merges = merges_as_pairs ? json::array({json::array({"a", "b"}), json::array({byte_char(' '), "ab"})})
                                : json::array({"a b", byte_char(' ') + " ab"});
  json root = {
      {"added_tokens", json::array({{{"id", 258}, {"content", "<s>"}, {"special", true}}})},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", json::array({{{"SpecialToken", {{"id", "<s>"}}}}, {{"Sequence", {{"id", "A"}}}}})}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}},
  };
  fs::create_directories(dir);
  const auto path = dir / "tokenizer.json";
  std::ofstream(path) << root.dump();
  return path;
}

TEST(HfTokenizerJson, BothMergeFormatsAndTemplateBos) {
  const auto base = fs::temp_directory_path() / ("lowbit_tok_" + std::to_string(::getpid()));
  for (bool pairs : {false, true}) {
    auto tok = load_hf_tokenizer(write_tokenizer_json(base / (pairs ? "pairs" : "strings"), pairs));
    EXPECT_EQ(tok->encode("ab ab", true), (std::vector<int32_t>{258, 256, 257})) << pairs;
    EXPECT_EQ(tok->bos_id(), 258);
  }
  fs::remove_all(base);
}

// A normalizer or pre-tokenizer "Sequence" nested 200,000 deep: reading it recursively overflowed the stack; the
// strict JSON reader's depth bound now stops it as a one-line limit error.
TEST(HfTokenizerJson, DeeplyNestedSequenceIsALimitError) {
  const auto dir = fs::temp_directory_path() / ("lowbit_tok_deep_" + std::to_string(::getpid()));
  const auto path = write_tokenizer_json(dir, false);
  const std::string text = json::parse(std::ifstream(path)).dump();
  constexpr int kDepth = 200000;
  for (const auto& [field, list] :
       {std::pair{"normalizer", "normalizers"}, std::pair{"pre_tokenizer", "pretokenizers"}}) {
    std::string nested;
    for (int i = 0; i < kDepth; ++i) nested += fmt::format(R"({{"type":"Sequence","{}":[)", list);
    nested += "null";
    for (int i = 0; i < kDepth; ++i) nested += "]}";
    const std::string key = fmt::format(R"("{}":)", field);
    const size_t at = text.find(key);
    ASSERT_NE(at, std::string::npos);
    const size_t end = text.find('}', at) + 1;  // both fields are flat objects in the fixture
    std::ofstream(path) << text.substr(0, at + key.size()) << nested << text.substr(end);
    try {
      load_hf_tokenizer(path);
      ADD_FAILURE() << field << ": accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::limit) << e.what();
      EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
    }
  }
  fs::remove_all(dir);
}

TEST(HfTokenizerJson, RejectsUnknownPreTokenizer) {
  const auto dir = fs::temp_directory_path() / ("lowbit_tok_bad_" + std::to_string(::getpid()));
  auto path = write_tokenizer_json(dir, false);
  json root = json::parse(std::ifstream(path));
  root["pre_tokenizer"] = {{"type", "Metaspace"}};
  std::ofstream(path) << root.dump();
  try {
    load_hf_tokenizer(path);
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::unsupported);
  }
  fs::remove_all(dir);
}

TEST(HfTokenizerJson, Qwen3MatchesReferenceIds) {
  const fs::path tokenizer = fs::path(LOWBIT_SHARED_DIR) / "tokenizers/qwen3/tokenizer.json";
  if (!fs::exists(tokenizer)) GTEST_SKIP() << tokenizer << " absent (../shared not mounted)";
  const json fixture = json::parse(std::ifstream(fs::path(LOWBIT_SOURCE_DIR) / "tests/model/fixtures/tokenizer_qwen3.json"));
  auto tok = load_hf_tokenizer(tokenizer);
  EXPECT_EQ(tok->vocab_size(), 151669);
  EXPECT_FALSE(tok->bos_id().has_value());
  EXPECT_EQ(tok->token_id("<|im_end|>"), 151645);
  for (const auto& [name, text] : fixture.at("texts").items()) {
    const auto& expected = fixture.at("expected").at(name);
    const auto ids = tok->encode(text.get<std::string>(), true, true);
    EXPECT_EQ(ids, expected.at("ids").get<std::vector<int32_t>>()) << name;
    EXPECT_EQ(tok->encode(text.get<std::string>(), false, false), expected.at("ids_no_special").get<std::vector<int32_t>>())
        << name;
    EXPECT_EQ(concat_texts(*tok, ids), expected.at("decoded").get<std::string>()) << name;
  }
}

}  // namespace
}  // namespace lowbit::model
