// Tokenizer factories: Hugging Face tokenizer.json (byte-level BPE), SentencePiece models, and the vocabularies
// embedded in GGUF files. Every factory returns the one Tokenizer interface of tokenizer.h.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lowbit/model/tokenizer.h"

namespace lowbit::model {

// Pre-tokenizer regexes (PCRE2 syntax, matched in UTF + UCP mode).
inline constexpr const char* kPatternGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
inline constexpr const char* kPatternLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr const char* kPatternQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct AddedToken {
  int32_t id = 0;
  std::string content;  // matched literally in the input text
  bool special = false;  // special tokens are only split out when parse_special is set
};

// Everything a byte-level BPE tokenizer needs, whether it comes from tokenizer.json or from GGUF metadata.
struct BpeSpec {
  std::vector<std::pair<std::string, int32_t>> vocab;        // byte-level token strings ("Ġthe") and ids
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
  std::vector<AddedToken> added;
  // Applied in order; each splits every piece into its matches and the gaps between them ("Isolated").
  std::vector<std::string> split_patterns;
  bool nfc = false;             // NFC-normalize text outside added tokens
  bool add_prefix_space = false;
  bool ignore_merges = false;   // a whole pre-token that is in the vocabulary becomes one token (Llama-3)
  std::optional<int32_t> bos;
  bool add_bos = false;         // whether encode(add_bos=true) really prepends it (the tokenizer's own rule)
  std::vector<int32_t> eos;
};

// Builds a byte-level BPE tokenizer. Throws Errc::format for merges naming unknown tokens, ids < 0, or a
// pattern PCRE2 rejects.
std::unique_ptr<Tokenizer> make_bpe_tokenizer(BpeSpec spec, std::string_view source = "bpe");

// Reads a tokenizer.json (model type BPE with a ByteLevel decoder). tokenizer_config.json beside it, when
// present, supplies bos/eos tokens and add_bos_token. Throws Errc::unsupported for other tokenizer kinds.
std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::filesystem::path& tokenizer_json);

// One SentencePiece vocabulary entry; `type` numbers as in sentencepiece_model.proto (and GGUF token_type):
// 1 normal, 2 unknown, 3 control, 4 user defined, 5 unused, 6 byte.
struct SpmPiece {
  std::string piece;
  float score = 0;
  int32_t type = 1;
};

// A SentencePiece model file (tokenizer.model), through libsentencepiece.
std::unique_ptr<Tokenizer> load_sentencepiece(const std::filesystem::path& model_file);
// A SentencePiece BPE model rebuilt from a vocabulary (GGUF "llama" tokenizers): pieces merge by score,
// "▁" marks spaces, a dummy space prefix is added unless add_space_prefix is false (GGUF
// tokenizer.ggml.add_space_prefix; Gemma), bytes fall back to <0xXX> pieces, user-defined pieces are matched in
// the raw text first.
std::unique_ptr<Tokenizer> make_sentencepiece(const std::vector<SpmPiece>& pieces, std::optional<int32_t> bos,
                                              std::vector<int32_t> eos, bool add_bos, std::string_view source,
                                              bool add_space_prefix = true);

// The chat template string beside a tokenizer (tokenizer_config.json "chat_template"), if any.
std::optional<std::string> read_chat_template(const std::filesystem::path& tokenizer_config_json);

// Split patterns for a llama.cpp "tokenizer.ggml.pre" name; Errc::unsupported for names we do not know.
std::vector<std::string> split_patterns_for_pre(std::string_view pre);

}  // namespace lowbit::model
