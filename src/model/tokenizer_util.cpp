#include "tokenizer_util.h"

#include <algorithm>

namespace lowbit::model::detail {

void LiteralMatcher::add(std::string text, int32_t id) {
  if (text.empty()) return;
  auto& bucket = by_first_[static_cast<unsigned char>(text[0])];
  bucket.emplace_back(std::move(text), id);
  std::stable_sort(bucket.begin(), bucket.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  ++count_;
}

LiteralMatcher::Hit LiteralMatcher::match_at(std::string_view text, size_t pos) const {
  for (const auto& [literal, id] : by_first_[static_cast<unsigned char>(text[pos])])
    if (text.substr(pos, literal.size()) == literal) return {id, literal.size()};
  return {};
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

uint32_t next_utf8(std::string_view s, size_t& i, bool& valid) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  const int extra = b0 < 0x80 ? 0 : (b0 >> 5) == 0x6 ? 1 : (b0 >> 4) == 0xE ? 2 : (b0 >> 3) == 0x1E ? 3 : -1;
  if (extra == 0) {
    ++i;
    return b0;
  }
  if (extra < 0 || i + extra >= s.size()) {
    valid = false;
    ++i;
    return b0;
  }
  uint32_t cp = b0 & (0x3F >> extra);
  for (int k = 1; k <= extra; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) {
      valid = false;
      ++i;
      return b0;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  i += extra + 1;
  return cp;
}

}  // namespace lowbit::model::detail
