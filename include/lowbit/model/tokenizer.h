// Tokenizers: one interface over HF tokenizer.json byte-level BPE, SentencePiece models, the llama2.c
// tokenizer and GGUF-embedded vocabularies.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lowbit::model {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Encodes text; special tokens written literally in the text (e.g. "<|im_start|>") map to their ids when
  // `parse_special` is set. Adds BOS first when `add_bos` and the tokenizer has one.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special = true) const = 0;
  // The bytes of one token as they appear in decoded text (byte fallback resolved). Streaming decode
  // concatenates these; partial UTF-8 sequences are the caller's to buffer.
  virtual std::string token_text(int32_t id) const = 0;
  // The bytes of `id` when it follows `prev` in a stream (prev = -1 at the start). SentencePiece-style
  // tokenizers drop the dummy-prefix space of the first piece after BOS here; the default is token_text(id).
  virtual std::string token_text_after(int32_t prev, int32_t id) const { return token_text(id); }
  // Concatenates token_text_after over ids, leaving out BOS and EOS tokens.
  std::string decode(const std::vector<int32_t>& ids) const;
  virtual int32_t vocab_size() const = 0;
  virtual std::optional<int32_t> bos_id() const = 0;
  virtual std::vector<int32_t> eos_ids() const = 0;
  virtual std::optional<int32_t> token_id(std::string_view token) const = 0;
  // Whether the token list is the model's whole vocabulary, so that a model with more rows than tokens is a
  // mismatch: true for llama2.c tokenizers (run.c reads exactly vocab_size entries). Formats whose models pad the
  // embedding beyond the listed tokens (a Qwen tokenizer.json lists 151,669 for 151,936 rows) keep false.
  virtual bool lists_every_row() const { return false; }
};

}  // namespace lowbit::model
