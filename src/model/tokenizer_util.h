// Pieces shared by the tokenizer implementations: splitting text around literal tokens and UTF-8 helpers.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace lowbit::model::detail {

// Finds literal tokens (added or control tokens) in text, leftmost-longest, as Hugging Face does.
class LiteralMatcher {
 public:
  void add(std::string text, int32_t id);
  // Calls on_text(segment) for the text between matches and on_token(id) for each match, in order.
  template <class OnText, class OnToken>
  void split(std::string_view text, OnText on_text, OnToken on_token) const {
    size_t start = 0, i = 0;
    while (i < text.size()) {
      const auto hit = match_at(text, i);
      if (hit.length == 0) {
        ++i;
        continue;
      }
      if (i > start) on_text(text.substr(start, i - start));
      on_token(hit.id);
      i += hit.length;
      start = i;
    }
    if (start < text.size()) on_text(text.substr(start));
  }
  bool empty() const { return count_ == 0; }

 private:
  struct Hit {
    int32_t id = 0;
    size_t length = 0;
  };
  Hit match_at(std::string_view text, size_t pos) const;
  // Candidates by first byte, longest first.
  std::vector<std::pair<std::string, int32_t>> by_first_[256];
  size_t count_ = 0;
};

// Appends the UTF-8 encoding of code point cp.
void append_utf8(std::string& out, uint32_t cp);
// Decodes the UTF-8 sequence at s[i]; returns the code point and advances i. Invalid bytes decode as
// themselves (one byte) with `valid` cleared.
uint32_t next_utf8(std::string_view s, size_t& i, bool& valid);

}  // namespace lowbit::model::detail
