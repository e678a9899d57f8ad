// The Jinja interpreter: a lexer that applies Jinja2's whitespace rules (trim_blocks, lstrip_blocks, "-"/"+"
// markers) while cutting the source into text and tag tokens, a recursive-descent parser into an AST, and a
// tree-walking evaluator whose values are JSON plus the few things JSON cannot hold (undefined, callables,
// namespaces). Python semantics are followed where templates depend on them: str()/repr() of values, truthiness,
// slicing, str methods, json.dumps formatting.
#include "lowbit/model/jinja.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <functional>
#include <unordered_map>
#include <vector>

#include <unicode/locid.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include "lowbit/core/error.h"

namespace lowbit::model::jinja {
namespace {

// ---------------------------------------------------------------------------------------------------------------
// Text helpers (UTF-8, Python str semantics)

std::u32string to_u32(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    int n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (i + n > s.size()) n = 1;
    char32_t cp = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
    for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    out.push_back(cp);
    i += n;
  }
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string from_u32(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) append_utf8(out, c);
  return out;
}

int64_t code_points(std::string_view s) {
  return std::count_if(s.begin(), s.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; });
}

// Python's str.isspace() for the characters templates meet.
bool py_space(char32_t c) {
  return c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// str.strip / lstrip / rstrip with Python's whitespace or the given characters.
std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
  const std::u32string u = to_u32(s), set = chars ? to_u32(*chars) : std::u32string();
  auto strip = [&](char32_t c) { return chars ? set.find(c) != std::u32string::npos : py_space(c); };
  size_t b = 0, e = u.size();
  if (left)
    while (b < e && strip(u[b])) ++b;
  if (right)
    while (e > b && strip(u[e - 1])) --e;
  return from_u32(std::u32string_view(u).substr(b, e - b));
}

// Python's str.upper/lower (full Unicode case mapping, e.g. "ß".upper() == "SS"), title and capitalize.
std::string py_upper(std::string_view s) {
  std::string out;
  icu::UnicodeString::fromUTF8(icu::StringPiece(s.data(), static_cast<int32_t>(s.size()))).toUpper(icu::Locale::getRoot()).toUTF8String(out);
  return out;
}
std::string py_lower(std::string_view s) {
  std::string out;
  icu::UnicodeString::fromUTF8(icu::StringPiece(s.data(), static_cast<int32_t>(s.size()))).toLower(icu::Locale::getRoot()).toUTF8String(out);
  return out;
}
bool is_cased(char32_t c) { return u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_CASED); }

std::string py_title(std::string_view s) {
  std::string out;
  bool prev_cased = false;
  for (char32_t c : to_u32(s)) {
    append_utf8(out, static_cast<char32_t>(prev_cased ? u_tolower(static_cast<UChar32>(c)) : u_totitle(static_cast<UChar32>(c))));
    prev_cased = is_cased(c);
  }
  return out;
}

std::string py_capitalize(std::string_view s) {
  const std::u32string u = to_u32(s);
  std::string out;
  for (size_t i = 0; i < u.size(); ++i)
    append_utf8(out, static_cast<char32_t>(i == 0 ? u_totitle(static_cast<UChar32>(u[i])) : u_tolower(static_cast<UChar32>(u[i]))));
  return out;
}

// str.islower() / isupper(): some cased character, and no cased character of the other case.
bool py_is_case(std::string_view s, bool lower) {
  bool cased = false;
  for (char32_t c : to_u32(s)) {
    if (lower ? u_isupper(static_cast<UChar32>(c)) || u_istitle(static_cast<UChar32>(c)) : u_islower(static_cast<UChar32>(c)) || u_istitle(static_cast<UChar32>(c)))
      return false;
    cased = cased || is_cased(c);
  }
  return cased;
}

// Values nested deeper than this (hostile JSON input) are refused rather than recursed into.
constexpr int kMaxValueDepth = 512;

void check_value_depth(int level) {
  if (level > kMaxValueDepth) fail(Errc::limit, "[jinja] a value is nested deeper than {} levels", kMaxValueDepth);
}

// str.replace, failing once the result would exceed max_bytes.
std::string py_replace(std::string_view s, std::string_view from, std::string_view to, int64_t count, size_t max_bytes) {
  std::string out;
  auto check = [&] {
    if (out.size() > max_bytes) fail(Errc::limit, "[jinja] replace: the result exceeds {} bytes", max_bytes);
  };
  size_t pos = 0;
  if (from.empty()) {  // Python inserts `to` between characters and at both ends
    const std::u32string u = to_u32(s);
    for (size_t i = 0; i <= u.size(); ++i) {
      if (count < 0 || static_cast<int64_t>(i) < count) out += to;
      if (i < u.size()) append_utf8(out, u[i]);
      check();
    }
    return out;
  }
  for (int64_t n = 0; count < 0 || n < count; ++n) {
    const size_t at = s.find(from, pos);
    if (at == std::string_view::npos) break;
    out.append(s.substr(pos, at - pos)).append(to);
    check();
    pos = at + from.size();
  }
  out.append(s.substr(pos));
  return out;
}

std::string py_float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  const std::string s(buf, r.ptr);
  const size_t e_at = s.find('e');
  std::string mantissa = s.substr(0, e_at);
  const int exp = std::stoi(s.substr(e_at + 1));
  std::string sign;
  if (mantissa[0] == '-') {
    sign = "-";
    mantissa.erase(0, 1);
  }
  std::string digits;
  for (char c : mantissa)
    if (c != '.') digits.push_back(c);
  const int decpt = exp + 1, n = static_cast<int>(digits.size());
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) return sign + "0." + std::string(-decpt, '0') + digits;
    if (decpt >= n) return sign + digits + std::string(decpt - n, '0') + ".0";
    return sign + digits.substr(0, decpt) + "." + digits.substr(decpt);
  }
  std::string out = sign + digits.substr(0, 1);
  if (n > 1) out += "." + digits.substr(1);
  return out + fmt::format("e{}{:02d}", exp < 0 ? '-' : '+', std::abs(exp));
}

std::string py_str_repr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos, has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : to_u32(s)) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      out += fmt::format("\\x{:02x}", static_cast<unsigned>(c));
    } else {
      append_utf8(out, c);
    }
  }
  out.push_back(quote);
  return out;
}

void py_repr(const Json& j, std::string& out, int level = 0);

// Python dicts may have integer keys (ByteDance-Seed's budget table does); JSON objects have string keys, so an
// integer key is stored as \x01 and its digits.
constexpr char kIntKey = '\x01';
std::string int_key(int64_t k) { return kIntKey + std::to_string(k); }
bool is_int_key(const std::string& k) { return !k.empty() && k[0] == kIntKey; }
Json key_value(const std::string& k) { return is_int_key(k) ? Json(std::stoll(k.substr(1))) : Json(k); }

// Python's str() of a JSON value: strings bare, containers as their repr.
std::string py_str(const Json& j) {
  switch (j.type()) {
    case Json::value_t::string: return j.get<std::string>();
    case Json::value_t::null: return "None";
    case Json::value_t::boolean: return j.get<bool>() ? "True" : "False";
    case Json::value_t::number_integer: return std::to_string(j.get<int64_t>());
    case Json::value_t::number_unsigned: return std::to_string(j.get<uint64_t>());
    case Json::value_t::number_float: return py_float_repr(j.get<double>());
    default: {
      std::string out;
      py_repr(j, out);
      return out;
    }
  }
}

void py_repr(const Json& j, std::string& out, int level) {
  check_value_depth(level);
  if (j.is_string()) {
    out += py_str_repr(j.get_ref<const std::string&>());
  } else if (j.is_array()) {
    out += '[';
    for (size_t i = 0; i < j.size(); ++i) {
      if (i) out += ", ";
      py_repr(j[i], out, level + 1);
    }
    out += ']';
  } else if (j.is_object()) {
    out += '{';
    bool first = true;
    for (const auto& [k, v] : j.items()) {
      if (!first) out += ", ";
      first = false;
      out += is_int_key(k) ? k.substr(1) : py_str_repr(k);
      out += ": ";
      py_repr(v, out, level + 1);
    }
    out += '}';
  } else {
    out += py_str(j);
  }
}

// Python json.dumps with ensure_ascii=False (what HF's tojson filter calls).
struct DumpStyle {
  std::optional<std::string> indent;
  std::string item_sep = ", ", key_sep = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
  size_t max_bytes = SIZE_MAX;
};

void dump_string(std::string_view s, std::string& out, bool ensure_ascii) {
  out += '"';
  for (char32_t c : to_u32(s)) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20 || (ensure_ascii && c > 0x7E)) {
          if (c >= 0x10000) {
            const char32_t v = c - 0x10000;
            out += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
          } else {
            out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
          }
        } else {
          append_utf8(out, c);
        }
    }
  }
  out += '"';
}

void dumps(const Json& j, const DumpStyle& style, int level, std::string& out) {
  check_value_depth(level);
  auto newline = [&](int l) {
    if (out.size() > style.max_bytes) fail(Errc::limit, "[jinja] tojson: the result exceeds {} bytes", style.max_bytes);
    if (!style.indent) return;
    out += '\n';
    for (int i = 0; i < l; ++i) out += *style.indent;
  };
  switch (j.type()) {
    case Json::value_t::null: out += "null"; return;
    case Json::value_t::boolean: out += j.get<bool>() ? "true" : "false"; return;
    case Json::value_t::number_float: {
      const double v = j.get<double>();
      out += std::isnan(v) ? "NaN" : std::isinf(v) ? (v < 0 ? "-Infinity" : "Infinity") : py_float_repr(v);
      return;
    }
    case Json::value_t::string: dump_string(j.get_ref<const std::string&>(), out, style.ensure_ascii); return;
    case Json::value_t::array: {
      if (j.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < j.size(); ++i) {
        if (i) out += style.item_sep;
        newline(level + 1);
        dumps(j[i], style, level + 1, out);
      }
      newline(level);
      out += ']';
      return;
    }
    case Json::value_t::object: {
      if (j.empty()) {
        out += "{}";
        return;
      }
      std::vector<std::pair<const std::string*, const Json*>> items;
      for (const auto& [k, v] : j.items()) items.emplace_back(&k, &v);
      if (style.sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto& a, auto& b) { return *a.first < *b.first; });
      out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += style.item_sep;
        newline(level + 1);
        dump_string(is_int_key(*items[i].first) ? items[i].first->substr(1) : *items[i].first, out, style.ensure_ascii);
        out += style.key_sep;
        dumps(*items[i].second, style, level + 1, out);
      }
      newline(level);
      out += '}';
      return;
    }
    default: out += j.dump(); return;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Lexer

enum class Tok { text, var_begin, var_end, block_begin, block_end, name, string, integer, number, op, eof };

struct Token {
  Tok kind;
  std::string text;
  int line;
  int64_t integer = 0;
  double number = 0;
};

class Lexer {
 public:
  Lexer(std::string_view source, const std::string& name) : name_(name) {
    // Jinja2 joins source.splitlines() with "\n": CRLF and CR become LF and one trailing newline goes.
    src_.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_ += '\n';
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_ += source[i];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<Token> run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      size_t at = pos_;
      while ((at = src_.find('{', at)) != std::string::npos) {
        if (at + 1 < src_.size() && (src_[at + 1] == '{' || src_[at + 1] == '%' || src_[at + 1] == '#')) break;
        ++at;
      }
      if (at == std::string::npos) {
        emit_text(src_.substr(pos_));
        break;
      }
      std::string text = src_.substr(pos_, at - pos_);
      const char kind = src_[at + 1];
      size_t body = at + 2;
      char sign = 0;
      if (body < src_.size() && (src_[body] == '-' || src_[body] == '+')) sign = src_[body++];
      if (sign == '-') {
        text = py_strip(text, std::nullopt, false, true);
      } else if (sign != '+' && kind != '{') {  // lstrip_blocks
        const size_t line_start = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        if ((line_start > 0 || line_starting) && line_start < text.size() &&
            std::all_of(text.begin() + static_cast<std::ptrdiff_t>(line_start), text.end(),
                        [](char c) { return py_space(static_cast<unsigned char>(c)); }))
          text.resize(line_start);
      }
      const int text_lines = static_cast<int>(std::count(src_.begin() + static_cast<std::ptrdiff_t>(pos_),
                                                         src_.begin() + static_cast<std::ptrdiff_t>(at), '\n'));
      emit_text(text);
      line_ += text_lines;
      pos_ = body;
      if (kind == '#') {
        const size_t end = src_.find("#}", pos_);
        if (end == std::string::npos) error("unclosed comment");
        line_ += static_cast<int>(std::count(src_.begin() + static_cast<std::ptrdiff_t>(pos_),
                                             src_.begin() + static_cast<std::ptrdiff_t>(end), '\n'));
        const char end_sign = end > pos_ ? src_[end - 1] : 0;
        pos_ = end + 2;
        line_starting = finish_tag(end_sign, true);
      } else if (kind == '%' && is_raw()) {
        line_starting = lex_raw();
      } else {
        line_starting = lex_tag(kind == '{');
      }
    }
    tokens_.push_back({Tok::eof, "", line_});
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void error(std::string_view what) const { fail(Errc::format, "[jinja] {}:{}: {}", name_, line_, what); }

  void emit_text(const std::string& text) {
    if (!text.empty()) tokens_.push_back({Tok::text, text, line_});
  }

  // After a tag's closing delimiter: "-" eats the whitespace that follows, a block or comment eats one newline
  // (trim_blocks) unless marked "+". Returns whether the consumed text ends a line (lstrip_blocks needs it).
  bool finish_tag(char end_sign, bool block) {
    size_t p = pos_;
    if (end_sign == '-') {
      while (p < src_.size() && py_space(static_cast<unsigned char>(src_[p]))) ++p;
    } else if (block && end_sign != '+' && p < src_.size() && src_[p] == '\n') {
      ++p;
    }
    line_ += static_cast<int>(std::count(src_.begin() + static_cast<std::ptrdiff_t>(pos_),
                                         src_.begin() + static_cast<std::ptrdiff_t>(p), '\n'));
    const bool ends_line = p > pos_ && src_[p - 1] == '\n';
    pos_ = p;
    return ends_line;
  }

  void skip_space() {
    while (pos_ < src_.size() && py_space(static_cast<unsigned char>(src_[pos_]))) {
      if (src_[pos_] == '\n') ++line_;
      ++pos_;
    }
  }

  bool is_raw() {
    size_t p = pos_;
    while (p < src_.size() && py_space(static_cast<unsigned char>(src_[p]))) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < src_.size() && py_space(static_cast<unsigned char>(src_[p]))) ++p;
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ++p;
    return src_.compare(p, 2, "%}") == 0;
  }

  bool lex_raw() {
    size_t p = src_.find("%}", pos_);
    const char open_sign = src_[p - 1];
    line_ += static_cast<int>(std::count(src_.begin() + static_cast<std::ptrdiff_t>(pos_),
                                         src_.begin() + static_cast<std::ptrdiff_t>(p), '\n'));
    pos_ = p + 2;
    finish_tag(open_sign, true);
    for (size_t at = pos_; (at = src_.find("{%", at)) != std::string::npos; ++at) {
      size_t q = at + 2;
      const char sign = q < src_.size() && (src_[q] == '-' || src_[q] == '+') ? src_[q++] : 0;
      while (q < src_.size() && py_space(static_cast<unsigned char>(src_[q]))) ++q;
      if (src_.compare(q, 6, "endraw") != 0) continue;
      q += 6;
      while (q < src_.size() && py_space(static_cast<unsigned char>(src_[q]))) ++q;
      const char end_sign = q < src_.size() && (src_[q] == '-' || src_[q] == '+') ? src_[q++] : 0;
      if (src_.compare(q, 2, "%}") != 0) continue;
      std::string text = src_.substr(pos_, at - pos_);
      if (sign == '-') text = py_strip(text, std::nullopt, false, true);
      emit_text(text);
      line_ += static_cast<int>(std::count(src_.begin() + static_cast<std::ptrdiff_t>(pos_),
                                           src_.begin() + static_cast<std::ptrdiff_t>(q), '\n'));
      pos_ = q + 2;
      return finish_tag(end_sign, true);
    }
    error("unclosed raw block");
  }

  bool lex_tag(bool variable) {
    tokens_.push_back({variable ? Tok::var_begin : Tok::block_begin, "", line_});
    int depth = 0;
    while (true) {
      skip_space();
      if (pos_ >= src_.size()) error(variable ? "unclosed '{{'" : "unclosed '{%'");
      if (depth == 0) {
        const std::string_view rest = std::string_view(src_).substr(pos_);
        const std::string_view close = variable ? "}}" : "%}";
        for (char sign : {'-', '+', '\0'}) {
          if (sign == '+' && variable) continue;
          const std::string with = sign ? std::string(1, sign) + std::string(close) : std::string(close);
          if (rest.starts_with(with)) {
            tokens_.push_back({variable ? Tok::var_end : Tok::block_end, "", line_});
            pos_ += with.size();
            return finish_tag(sign, !variable);
          }
        }
      }
      const char c = src_[pos_];
      if (c == '\'' || c == '"') {
        lex_string(c);
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        lex_number();
      } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        const size_t start = pos_;
        while (pos_ < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_')) ++pos_;
        tokens_.push_back({Tok::name, src_.substr(start, pos_ - start), line_});
      } else {
        static constexpr std::string_view two[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op(1, c);
        for (auto t : two)
          if (std::string_view(src_).substr(pos_, 2) == t) op = t;
        if (op.size() == 1 && std::string_view("+-*/%~<>()[]{},.:|=").find(c) == std::string_view::npos)
          error(fmt::format("unexpected character '{}'", c));
        if (c == '(' || c == '[' || c == '{') ++depth;
        if ((c == ')' || c == ']' || c == '}') && --depth < 0) error(fmt::format("unbalanced '{}'", c));
        tokens_.push_back({Tok::op, op, line_});
        pos_ += op.size();
      }
    }
  }

  void lex_string(char quote) {
    std::string value;
    const int line = line_;
    ++pos_;
    while (true) {
      if (pos_ >= src_.size()) error("unterminated string");
      const char c = src_[pos_++];
      if (c == quote) break;
      if (c == '\n') ++line_;
      if (c != '\\') {
        value += c;
        continue;
      }
      if (pos_ >= src_.size()) error("unterminated string");
      const char e = src_[pos_++];
      auto hex = [&](int digits) {
        if (pos_ + digits > src_.size()) error("bad escape in string");
        char32_t cp = 0;
        for (int i = 0; i < digits; ++i) {
          const char h = src_[pos_++];
          if (!std::isxdigit(static_cast<unsigned char>(h))) error("bad escape in string");
          cp = cp * 16 + static_cast<char32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (h | 0x20) - 'a' + 10);
        }
        append_utf8(value, cp);
      };
      switch (e) {
        case 'n': value += '\n'; break;
        case 't': value += '\t'; break;
        case 'r': value += '\r'; break;
        case 'b': value += '\b'; break;
        case 'f': value += '\f'; break;
        case 'v': value += '\v'; break;
        case 'a': value += '\a'; break;
        case '0': value += '\0'; break;
        case '\\': value += '\\'; break;
        case '\'': value += '\''; break;
        case '"': value += '"'; break;
        case '\n': ++line_; break;  // a line continuation
        case 'x': hex(2); break;
        case 'u': hex(4); break;
        case 'U': hex(8); break;
        default: value += '\\'; value += e;
      }
    }
    tokens_.push_back({Tok::string, std::move(value), line});
  }

  void lex_number() {
    const size_t start = pos_;
    bool is_float = false;
    auto digits = [&] {
      while (pos_ < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_')) ++pos_;
    };
    digits();
    if (pos_ + 1 < src_.size() && src_[pos_] == '.' && std::isdigit(static_cast<unsigned char>(src_[pos_ + 1]))) {
      is_float = true;
      ++pos_;
      digits();
    }
    if (pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
      size_t p = pos_ + 1;
      if (p < src_.size() && (src_[p] == '+' || src_[p] == '-')) ++p;
      if (p < src_.size() && std::isdigit(static_cast<unsigned char>(src_[p]))) {
        is_float = true;
        pos_ = p;
        digits();
      }
    }
    std::string text;
    for (size_t i = start; i < pos_; ++i)
      if (src_[i] != '_') text += src_[i];
    Token t{is_float ? Tok::number : Tok::integer, text, line_};
    if (is_float) {
      t.number = std::strtod(text.c_str(), nullptr);
    } else if (std::from_chars(text.data(), text.data() + text.size(), t.integer).ec != std::errc()) {
      error("integer literal out of range");
    }
    tokens_.push_back(std::move(t));
  }

  const std::string& name_;
  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

// ---------------------------------------------------------------------------------------------------------------
// AST

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind { literal, name, list, tuple, dict, attr, item, slice, call, filter, test, not_, neg, binary, and_, or_, cond };
  Expr(Kind k, int l) : kind(k), line(l) {}
  Kind kind;
  int line;
  Json value;                                           // literal
  std::string name;                                     // name, attribute, filter, test, binary operator
  std::vector<ExprPtr> args;                            // operands; slices hold nullptr for omitted bounds
  std::vector<std::pair<std::string, ExprPtr>> kwargs;  // call, filter and test keyword arguments
  bool negated = false;                                 // "is not"
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct Node {
  enum class Kind { text, output, if_, for_, set, set_block, macro, break_, continue_, block, filter_block };
  Node(Kind k, int l, std::string t = {}) : kind(k), line(l), text(std::move(t)) {}
  Kind kind;
  int line;
  std::string text;                                  // text; macro name
  std::vector<std::string> targets;                  // for/set names; set of an attribute: {object, attribute}
  bool attribute = false;                            // set ns.attr = ...
  ExprPtr expr, filter;  // output/set/for iterable; for's "if" filter; a filter block's filter (no operand)
  std::vector<std::pair<ExprPtr, Body>> branches;    // if/elif (condition, body)
  Body body, else_body;                              // for/set_block/macro/block bodies; for/if else
  std::vector<std::pair<std::string, ExprPtr>> params;  // macro parameters with defaults
};

class Parser {
 public:
  Parser(std::vector<Token> tokens, const std::string& name, int max_depth)
      : tokens_(std::move(tokens)), name_(name), max_depth_(max_depth) {}

  Body parse() {
    std::string end;
    Body body = parse_body({}, end);
    return body;
  }

 private:
  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& parser) : p(parser) {
      if (++p.depth_ > p.max_depth_) p.error("nested too deeply");
    }
    ~DepthGuard() { --p.depth_; }
  };

  [[noreturn]] void error(std::string_view what) const {
    fail(Errc::format, "[jinja] {}:{}: {}", name_, peek().line, what);
  }
  const Token& peek(size_t ahead = 0) const { return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)]; }
  Token next() { return tokens_[pos_ < tokens_.size() - 1 ? pos_++ : pos_]; }
  bool is_op(std::string_view op, size_t ahead = 0) const { return peek(ahead).kind == Tok::op && peek(ahead).text == op; }
  bool is_name(std::string_view n, size_t ahead = 0) const {
    return peek(ahead).kind == Tok::name && peek(ahead).text == n;
  }
  bool accept_op(std::string_view op) {
    if (!is_op(op)) return false;
    ++pos_;
    return true;
  }
  bool accept_name(std::string_view n) {
    if (!is_name(n)) return false;
    ++pos_;
    return true;
  }
  void expect_op(std::string_view op) {
    if (!accept_op(op)) error(fmt::format("expected '{}'", op));
  }
  void expect(Tok kind, std::string_view what) {
    if (peek().kind != kind) error(fmt::format("expected {}", what));
    ++pos_;
  }
  std::string expect_name() {
    if (peek().kind != Tok::name) error("expected a name");
    return next().text;
  }

  // Statements until one of `ends` ("endfor", "else", ...); `end` receives which one (consumed with its
  // "{%" but not its "%}").
  Body parse_body(std::initializer_list<std::string_view> ends, std::string& end) {
    DepthGuard guard(*this);
    Body body;
    while (true) {
      const Token& t = peek();
      if (t.kind == Tok::eof) {
        if (ends.size() != 0) error(fmt::format("unexpected end of template, expected '{}'", *ends.begin()));
        return body;
      }
      if (t.kind == Tok::text) {
        body.push_back(std::make_unique<Node>(Node::Kind::text, t.line, t.text));
        ++pos_;
      } else if (t.kind == Tok::var_begin) {
        ++pos_;
        auto node = std::make_unique<Node>(Node::Kind::output, t.line);
        node->expr = parse_tuple();
        expect(Tok::var_end, "'}}'");
        body.push_back(std::move(node));
      } else if (t.kind == Tok::block_begin) {
        if (peek(1).kind == Tok::name &&
            std::find(ends.begin(), ends.end(), std::string_view(peek(1).text)) != ends.end()) {
          end = peek(1).text;
          pos_ += 2;
          return body;
        }
        ++pos_;
        body.push_back(parse_statement());
      } else {
        error("unexpected token");
      }
    }
  }

  void end_tag() { expect(Tok::block_end, "'%}'"); }

  NodePtr parse_statement() {
    const int line = peek().line;
    const std::string keyword = expect_name();
    auto node = std::make_unique<Node>(Node::Kind::text, line);
    std::string end;
    if (keyword == "for") {
      node->kind = Node::Kind::for_;
      do node->targets.push_back(expect_name());
      while (accept_op(","));
      if (!accept_name("in")) error("expected 'in'");
      node->expr = parse_tuple(false);
      if (accept_name("if")) node->filter = parse_expression();
      if (is_name("recursive")) error("recursive for loops are not supported");  // no chat template uses them
      end_tag();
      node->body = parse_body({"endfor", "else"}, end);
      if (end == "else") {
        end_tag();
        node->else_body = parse_body({"endfor"}, end);
      }
    } else if (keyword == "if") {
      node->kind = Node::Kind::if_;
      ExprPtr cond = parse_tuple();
      while (true) {
        end_tag();
        Body body = parse_body({"elif", "else", "endif"}, end);
        node->branches.emplace_back(std::move(cond), std::move(body));
        if (end == "elif") {
          cond = parse_tuple();
          continue;
        }
        if (end == "else") {
          end_tag();
          node->else_body = parse_body({"endif"}, end);
        }
        break;
      }
    } else if (keyword == "set") {
      node->kind = Node::Kind::set;
      node->targets.push_back(expect_name());
      if (accept_op(".")) {
        node->attribute = true;
        node->targets.push_back(expect_name());
      } else {
        while (accept_op(",")) node->targets.push_back(expect_name());
      }
      if (accept_op("=")) {
        node->expr = parse_tuple();
      } else {
        if (node->attribute || node->targets.size() != 1) error("expected '='");
        node->kind = Node::Kind::set_block;
        end_tag();
        node->body = parse_body({"endset"}, end);
      }
    } else if (keyword == "macro") {
      node->kind = Node::Kind::macro;
      node->text = expect_name();
      expect_op("(");
      while (!accept_op(")")) {
        if (!node->params.empty()) expect_op(",");
        if (accept_op(")")) break;
        std::string param = expect_name();
        ExprPtr def;
        if (accept_op("=")) def = parse_expression();
        node->params.emplace_back(std::move(param), std::move(def));
      }
      end_tag();
      node->body = parse_body({"endmacro"}, end);
      if (peek().kind == Tok::name && peek().text == node->text) ++pos_;
    } else if (keyword == "break" || keyword == "continue") {
      node->kind = keyword == "break" ? Node::Kind::break_ : Node::Kind::continue_;
    } else if (keyword == "generation") {  // HF's AssistantTracker marks assistant text; rendering ignores it
      node->kind = Node::Kind::block;
      end_tag();
      node->body = parse_body({"endgeneration"}, end);
    } else if (keyword == "filter") {
      node->kind = Node::Kind::filter_block;
      node->filter = make(Expr::Kind::filter, line);
      node->filter->name = expect_name();
      node->filter->args.push_back(literal(nullptr, line));  // the body's output takes this place
      if (is_op("(")) parse_args(*node->filter);
      end_tag();
      node->body = parse_body({"endfilter"}, end);
    } else {
      error(fmt::format("unknown tag '{}'", keyword));
    }
    end_tag();
    return node;
  }

  ExprPtr make(Expr::Kind kind, int line) { return std::make_unique<Expr>(kind, line); }

  // An expression or a bare tuple ("a, b").
  ExprPtr parse_tuple(bool with_condexpr = true) {
    const int line = peek().line;
    ExprPtr first = with_condexpr ? parse_expression() : parse_or();
    if (!is_op(",")) return first;
    auto tuple = make(Expr::Kind::tuple, line);
    tuple->args.push_back(std::move(first));
    while (accept_op(",")) {
      if (peek().kind == Tok::var_end || peek().kind == Tok::block_end || is_op(")")) break;
      tuple->args.push_back(with_condexpr ? parse_expression() : parse_or());
    }
    return tuple;
  }

  ExprPtr parse_expression() {
    DepthGuard guard(*this);
    ExprPtr value = parse_or();
    while (is_name("if")) {
      ++pos_;
      auto cond = make(Expr::Kind::cond, value->line);
      cond->args.push_back(std::move(value));
      cond->args.push_back(parse_or());
      if (accept_name("else")) cond->args.push_back(parse_expression());
      value = std::move(cond);
    }
    return value;
  }

  ExprPtr binary(Expr::Kind kind, std::string op, ExprPtr lhs, ExprPtr rhs) {
    auto e = make(kind, lhs->line);
    e->name = std::move(op);
    e->args.push_back(std::move(lhs));
    e->args.push_back(std::move(rhs));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr lhs = parse_and();
    while (accept_name("or")) lhs = binary(Expr::Kind::or_, "or", std::move(lhs), parse_and());
    return lhs;
  }
  ExprPtr parse_and() {
    ExprPtr lhs = parse_not();
    while (accept_name("and")) lhs = binary(Expr::Kind::and_, "and", std::move(lhs), parse_not());
    return lhs;
  }
  ExprPtr parse_not() {
    DepthGuard guard(*this);
    if (is_name("not")) {
      auto e = make(Expr::Kind::not_, next().line);
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    ExprPtr lhs = parse_math1();
    while (true) {
      std::string op;
      if (peek().kind == Tok::op && (peek().text == "==" || peek().text == "!=" || peek().text == "<" ||
                                     peek().text == ">" || peek().text == "<=" || peek().text == ">=")) {
        op = next().text;
      } else if (accept_name("in")) {
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        pos_ += 2;
        op = "not in";
      } else {
        return lhs;
      }
      lhs = binary(Expr::Kind::binary, op, std::move(lhs), parse_math1());
    }
  }
  ExprPtr parse_math1() {
    ExprPtr lhs = parse_concat();
    while (is_op("+") || is_op("-")) {
      std::string op = next().text;
      lhs = binary(Expr::Kind::binary, op, std::move(lhs), parse_concat());
    }
    return lhs;
  }
  ExprPtr parse_concat() {
    ExprPtr lhs = parse_math2();
    while (accept_op("~")) lhs = binary(Expr::Kind::binary, "~", std::move(lhs), parse_math2());
    return lhs;
  }
  ExprPtr parse_math2() {
    ExprPtr lhs = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = next().text;
      lhs = binary(Expr::Kind::binary, op, std::move(lhs), parse_pow());
    }
    return lhs;
  }
  ExprPtr parse_pow() {
    ExprPtr lhs = parse_unary(true);
    while (accept_op("**")) lhs = binary(Expr::Kind::binary, "**", std::move(lhs), parse_unary(true));
    return lhs;
  }
  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      const bool neg = next().text == "-";
      ExprPtr operand = parse_unary(false);
      if (neg) {
        node = make(Expr::Kind::neg, operand->line);
        node->args.push_back(std::move(operand));
      } else {
        node = std::move(operand);
      }
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token t = next();
    if (t.kind == Tok::name) {
      if (t.text == "true" || t.text == "True") return literal(true, t.line);
      if (t.text == "false" || t.text == "False") return literal(false, t.line);
      if (t.text == "none" || t.text == "None") return literal(nullptr, t.line);
      auto e = make(Expr::Kind::name, t.line);
      e->name = t.text;
      return e;
    }
    if (t.kind == Tok::string) {
      std::string s = t.text;
      while (peek().kind == Tok::string) s += next().text;  // adjacent literals concatenate
      return literal(s, t.line);
    }
    if (t.kind == Tok::integer) return literal(t.integer, t.line);
    if (t.kind == Tok::number) return literal(t.number, t.line);
    if (t.kind == Tok::op && t.text == "(") {
      if (accept_op(")")) return make(Expr::Kind::tuple, t.line);
      ExprPtr inner = parse_tuple();
      expect_op(")");
      return inner;
    }
    if (t.kind == Tok::op && t.text == "[") {
      auto e = make(Expr::Kind::list, t.line);
      while (!accept_op("]")) {
        if (!e->args.empty()) expect_op(",");
        if (accept_op("]")) break;
        e->args.push_back(parse_expression());
      }
      return e;
    }
    if (t.kind == Tok::op && t.text == "{") {
      auto e = make(Expr::Kind::dict, t.line);
      while (!accept_op("}")) {
        if (!e->args.empty()) expect_op(",");
        if (accept_op("}")) break;
        e->args.push_back(parse_expression());
        expect_op(":");
        e->args.push_back(parse_expression());
      }
      return e;
    }
    --pos_;
    error(fmt::format("unexpected '{}'", t.text.empty() ? "end of tag" : t.text));
  }

  ExprPtr literal(Json value, int line) {
    auto e = make(Expr::Kind::literal, line);
    e->value = std::move(value);
    return e;
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".")) {
        ++pos_;
        auto e = make(Expr::Kind::attr, node->line);
        if (peek().kind == Tok::integer) {
          e->kind = Expr::Kind::item;
          e->args.push_back(std::move(node));
          e->args.push_back(literal(next().integer, e->line));
        } else {
          e->name = expect_name();
          e->args.push_back(std::move(node));
        }
        node = std::move(e);
      } else if (is_op("[")) {
        ++pos_;
        node = parse_subscript(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr object) {
    const int line = object->line;
    std::array<ExprPtr, 3> parts;
    int colons = 0;
    if (!is_op(":")) parts[0] = parse_expression();
    while (colons < 2 && accept_op(":")) {
      ++colons;
      if (!is_op(":") && !is_op("]")) parts[colons] = parse_expression();
    }
    expect_op("]");
    if (colons == 0) {
      auto e = make(Expr::Kind::item, line);
      e->args.push_back(std::move(object));
      e->args.push_back(std::move(parts[0]));
      return e;
    }
    auto e = make(Expr::Kind::slice, line);
    e->args.push_back(std::move(object));
    for (auto& p : parts) e->args.push_back(std::move(p));
    return e;
  }

  // "(" args ")" into e->args (after any operands already there) and e->kwargs.
  void parse_args(Expr& e) {
    expect_op("(");
    bool first = true;
    while (!accept_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (accept_op(")")) break;
      if (peek().kind == Tok::name && is_op("=", 1)) {
        std::string key = next().text;
        ++pos_;
        e.kwargs.emplace_back(std::move(key), parse_expression());
      } else {
        if (!e.kwargs.empty()) error("positional argument after a keyword argument");
        e.args.push_back(parse_expression());
      }
    }
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto e = make(Expr::Kind::call, callee->line);
    e->args.push_back(std::move(callee));
    parse_args(*e);
    return e;
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (accept_op("|")) {
        auto e = make(Expr::Kind::filter, node->line);
        e->name = expect_name();
        e->args.push_back(std::move(node));
        if (is_op("(")) parse_args(*e);
        node = std::move(e);
      } else if (accept_name("is")) {
        auto e = make(Expr::Kind::test, node->line);
        e->negated = accept_name("not");
        e->name = expect_name();
        e->args.push_back(std::move(node));
        if (is_op("(")) {
          parse_args(*e);
        } else if (peek().kind == Tok::string || peek().kind == Tok::integer || peek().kind == Tok::number ||
                   (peek().kind == Tok::name && !is_name("and") && !is_name("or") && !is_name("else") &&
                    !is_name("if") && !is_name("in") && !is_name("is") && !is_name("not")) ||
                   is_op("[") || is_op("{")) {
          e->args.push_back(parse_postfix(parse_primary()));
        }
        node = std::move(e);
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  const std::string& name_;
  int max_depth_;
  int depth_ = 0;
};

// ---------------------------------------------------------------------------------------------------------------
// Values

struct Value;
struct Args;
class Renderer;
using Function = std::function<Value(Renderer&, Args&)>;

struct LoopState;

struct Value {
  enum class Kind { undefined, data, function, ns, loop };
  Kind kind = Kind::undefined;
  std::shared_ptr<const Json> data;
  std::shared_ptr<const Function> fn;
  std::shared_ptr<Json> ns;  // a namespace's attributes: an object shared by every copy of the value
  std::shared_ptr<const LoopState> loop;  // a for loop's "loop" variable
  // What select/map/unique/items return in Python: an iterator, always true, without len(), not JSON. Its items
  // are computed at once (data holds them as an array) but it behaves as Jinja2's generator does.
  bool generator = false;
  // A markupsafe.Markup string (from |safe or |escape): concatenated with a plain string it HTML-escapes that
  // string, as Python does, even though the environment does not autoescape.
  bool markup = false;
  std::string name;          // what an undefined value was looked up as, for errors

  static Value of(Json j) { return part(std::make_shared<const Json>(std::move(j))); }
  static Value undefined(std::string what) {
    Value v;
    v.name = std::move(what);
    return v;
  }
  static Value function(std::shared_ptr<const Function> f) {
    Value v;
    v.kind = Kind::function;
    v.fn = std::move(f);
    return v;
  }
  static Value function(Function f) { return function(std::make_shared<const Function>(std::move(f))); }
  static Value part(std::shared_ptr<const Json> j) {
    Value v;
    v.kind = Kind::data;
    v.data = std::move(j);
    return v;
  }
  // A part of a JSON value, sharing its storage.
  static Value part(const std::shared_ptr<const Json>& owner, const Json& j) {
    return part(std::shared_ptr<const Json>(owner, &j));
  }

  bool defined() const { return kind != Kind::undefined; }
  bool is_data() const { return kind == Kind::data; }
  const Json& json() const { return *data; }
  bool is_string() const { return is_data() && data->is_string(); }
  bool is_none() const { return is_data() && data->is_null(); }
  const std::string& str() const { return data->get_ref<const std::string&>(); }
};

// What "loop" answers in one iteration: its attributes are computed when read, so an iteration costs no copies.
struct LoopState {
  std::shared_ptr<const std::vector<Value>> items;
  int64_t index;  // 0-based
};

struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;

  const Value* get(size_t index, std::string_view key) const {
    if (index < positional.size()) return &positional[index];
    for (const auto& [k, v] : keyword)
      if (k == key) return &v;
    return nullptr;
  }
};

// ---------------------------------------------------------------------------------------------------------------
// Evaluator

enum class Flow { normal, break_, continue_ };

struct Macro {
  const Node* node;
};

class Renderer {
 public:
  Renderer(const std::string& name, const RenderOptions& options) : name_(name), options_(options) {}

  std::string render(const Body& body, const Json& variables) {
    frames_.push_back({});
    if (!variables.is_object()) fail(Errc::format, "[jinja] {}: the variables must be a JSON object", name_);
    const auto root = std::make_shared<const Json>(variables);
    for (const auto& [k, v] : root->items()) frames_[0].vars[k] = Value::part(root, v);
    exec_body(body);
    return std::move(out_);
  }

  [[noreturn]] void error(std::string_view what, Errc code = Errc::format) const {
    std::string one_line(what);
    std::replace(one_line.begin(), one_line.end(), '\n', ' ');
    fail(code, "[jinja] {}:{}: {}", name_, line_, one_line);
  }

  // --- scopes

  struct Frame {
    std::unordered_map<std::string, Value> vars;
    bool barrier = false;  // a macro's frame: lookups skip from here to the template's globals
  };

  Value lookup(const std::string& name) const {
    for (size_t i = frames_.size(); i-- > 0;) {
      const auto it = frames_[i].vars.find(name);
      if (it != frames_[i].vars.end()) return it->second;
      if (frames_[i].barrier) i = 1;  // continue at frame 0
    }
    return builtin(name);
  }

  void assign(const std::string& name, Value v) { frames_.back().vars[name] = std::move(v); }

  // --- output and bounds

  void write(std::string_view s) {
    if (out_.size() + s.size() > options_.limits.max_output_bytes)
      error(fmt::format("output exceeds {} bytes", options_.limits.max_output_bytes), Errc::limit);
    out_.append(s);
  }

  Value string_value(std::string s) {
    if (s.size() > options_.limits.max_output_bytes)
      error(fmt::format("a string exceeds {} bytes", options_.limits.max_output_bytes), Errc::limit);
    return Value::of(Json(std::move(s)));
  }

  void count_iteration() {
    if (++iterations_ > options_.limits.max_iterations)
      error(fmt::format("more than {} loop iterations", options_.limits.max_iterations), Errc::limit);
  }

  struct DepthGuard {
    Renderer& r;
    explicit DepthGuard(Renderer& renderer) : r(renderer) {
      if (++r.depth_ > r.options_.limits.max_depth) r.error("nested too deeply (macro recursion?)", Errc::limit);
    }
    ~DepthGuard() { --r.depth_; }
  };

  // --- conversions

  bool truthy(const Value& v) const {
    switch (v.kind) {
      case Value::Kind::undefined: return false;
      case Value::Kind::function:
      case Value::Kind::ns:
      case Value::Kind::loop: return true;
      case Value::Kind::data: break;
    }
    if (v.generator) return true;
    const Json& j = *v.data;
    switch (j.type()) {
      case Json::value_t::null: return false;
      case Json::value_t::boolean: return j.get<bool>();
      case Json::value_t::number_integer: return j.get<int64_t>() != 0;
      case Json::value_t::number_unsigned: return j.get<uint64_t>() != 0;
      case Json::value_t::number_float: return j.get<double>() != 0;
      case Json::value_t::string: return !j.get_ref<const std::string&>().empty();
      default: return !j.empty();
    }
  }

  std::string to_str(const Value& v) const {
    switch (v.kind) {
      case Value::Kind::undefined: return "";
      case Value::Kind::function: return "<function>";
      case Value::Kind::ns: return "<Namespace " + py_str(*v.ns) + ">";
      case Value::Kind::loop: return "<LoopContext>";
      case Value::Kind::data: return v.generator ? "<generator object>" : py_str(*v.data);
    }
    return "";
  }

  const Json& data(const Value& v, std::string_view what) const {
    if (v.kind == Value::Kind::undefined) error(fmt::format("'{}' is undefined", v.name));
    if (v.generator) error(fmt::format("{}: a generator (select, map, ...) has no length or value; add '| list'", what));
    if (v.kind == Value::Kind::ns) return *v.ns;
    if (v.kind != Value::Kind::data) error(fmt::format("{}: expected a value, got a function or loop", what));
    return *v.data;
  }

  const std::string& string_arg(const Value* v, std::string_view what) const {
    if (!v || !v->is_string()) error(fmt::format("{}: expected a string", what));
    return v->str();
  }

  int64_t int_arg(const Value* v, std::string_view what) const {
    if (!v || !v->is_data() || !(v->json().is_number_integer() || v->json().is_boolean()))
      error(fmt::format("{}: expected an integer", what));
    return v->json().is_boolean() ? v->json().get<bool>() : v->json().get<int64_t>();
  }

  // The items a for loop or a filter iterates: list elements, dict keys, string characters.
  std::vector<Value> iterate(const Value& v, std::string_view what) {
    std::vector<Value> items;
    if (v.kind == Value::Kind::undefined) return items;
    const Json& j = v.generator ? *v.data : data(v, what);
    if (j.is_array()) {
      for (const auto& e : j) items.push_back(v.is_data() ? Value::part(v.data, e) : Value::of(e));
    } else if (j.is_object()) {
      for (const auto& [k, e] : j.items()) items.push_back(Value::of(key_value(k)));
    } else if (j.is_string()) {
      for (char32_t c : to_u32(j.get_ref<const std::string&>())) items.push_back(Value::of(from_u32({&c, 1})));
    } else {
      error(fmt::format("{}: {} is not iterable", what, j.type_name()));
    }
    return items;
  }

  static std::string html_escape(std::string_view s) {
    std::string out;
    for (char c : s) {
      switch (c) {
        case '&': out += "&amp;"; break;
        case '<': out += "&lt;"; break;
        case '>': out += "&gt;"; break;
        case '"': out += "&#34;"; break;
        case '\'': out += "&#39;"; break;
        default: out += c;
      }
    }
    return out;
  }

  Value markup(std::string s) {
    Value v = string_value(std::move(s));
    v.markup = true;
    return v;
  }

  // Filters that keep a Markup string Markup (Python's str methods on Markup return Markup).
  Value like(const Value& source, std::string s) { return source.markup ? markup(std::move(s)) : Value::of(std::move(s)); }

  static Value generator(Json items) {
    Value v = Value::of(std::move(items));
    v.generator = true;
    return v;
  }

  static Json to_json_list(const std::vector<Value>& items, const Renderer& r) {
    Json out = Json::array();
    for (const auto& v : items) out.push_back(r.data(v, "list"));
    return out;
  }

  // --- statements

  Flow exec_body(const Body& body) {
    for (const auto& node : body) {
      const Flow flow = exec(*node);
      if (flow != Flow::normal) return flow;
    }
    return Flow::normal;
  }

  Flow exec(const Node& node) {
    line_ = node.line;
    switch (node.kind) {
      case Node::Kind::text: write(node.text); return Flow::normal;
      case Node::Kind::output: {
        const Value v = eval(*node.expr);
        write(to_str(v));
        return Flow::normal;
      }
      case Node::Kind::if_:
        for (const auto& [cond, body] : node.branches)
          if (truthy(eval(*cond))) return exec_body(body);
        return exec_body(node.else_body);
      case Node::Kind::for_: return exec_for(node);
      case Node::Kind::set: exec_set(node); return Flow::normal;
      case Node::Kind::set_block: assign(node.targets[0], Value::of(capture(node.body))); return Flow::normal;
      case Node::Kind::filter_block: {
        const Value body = Value::of(capture(node.body));
        Args args = eval_args(*node.filter, 1);
        line_ = node.line;
        write(to_str(apply_filter(node.filter->name, body, args)));
        return Flow::normal;
      }
      case Node::Kind::macro: {
        const Node* macro = &node;
        assign(node.text, Value::function([macro](Renderer& r, Args& args) { return r.call_macro(*macro, args); }));
        return Flow::normal;
      }
      case Node::Kind::break_: return Flow::break_;
      case Node::Kind::continue_: return Flow::continue_;
      case Node::Kind::block: return exec_body(node.body);
    }
    return Flow::normal;
  }

  void exec_set(const Node& node) {
    Value v = eval(*node.expr);
    line_ = node.line;
    if (node.attribute) {
      const Value target = lookup(node.targets[0]);
      if (target.kind != Value::Kind::ns) error(fmt::format("cannot set an attribute of '{}', not a namespace", node.targets[0]));
      (*target.ns)[node.targets[1]] = data(v, "set");
      return;
    }
    if (node.targets.size() == 1) {
      assign(node.targets[0], std::move(v));
      return;
    }
    const std::vector<Value> items = iterate(v, "set");
    if (items.size() != node.targets.size())
      error(fmt::format("set: {} values to unpack into {} names", items.size(), node.targets.size()));
    for (size_t i = 0; i < items.size(); ++i) assign(node.targets[i], items[i]);
  }

  Flow exec_for(const Node& node) {
    const Value iterable = eval(*node.expr);
    if (iterable.is_none()) error("'NoneType' object is not iterable");
    std::vector<Value> items = iterate(iterable, "for");
    DepthGuard guard(*this);
    auto bind = [&](const Value& item) {
      if (node.targets.size() == 1) {
        assign(node.targets[0], item);
        return;
      }
      const std::vector<Value> parts = iterate(item, "for");
      if (parts.size() != node.targets.size())
        error(fmt::format("for: {} values to unpack into {} names", parts.size(), node.targets.size()));
      for (size_t i = 0; i < parts.size(); ++i) assign(node.targets[i], parts[i]);
    };
    // Each iteration gets a fresh frame: Jinja2 starts every iteration from the variables outside the loop, so a
    // {% set %} in the body lasts until the end of its iteration.
    struct FrameGuard {
      std::vector<Frame>& frames;
      explicit FrameGuard(std::vector<Frame>& f) : frames(f) { frames.push_back({}); }
      ~FrameGuard() { frames.pop_back(); }
    };
    if (node.filter) {
      std::vector<Value> kept;
      for (const auto& item : items) {
        count_iteration();
        FrameGuard frame(frames_);
        bind(item);
        if (truthy(eval(*node.filter))) kept.push_back(item);
      }
      items = std::move(kept);
    }
    const auto shared = std::make_shared<const std::vector<Value>>(std::move(items));
    const auto n = static_cast<int64_t>(shared->size());
    for (int64_t i = 0; i < n; ++i) {
      count_iteration();
      FrameGuard frame(frames_);
      bind((*shared)[static_cast<size_t>(i)]);
      Value loop;
      loop.kind = Value::Kind::loop;
      loop.loop = std::make_shared<const LoopState>(LoopState{shared, i});
      assign("loop", std::move(loop));
      if (exec_body(node.body) == Flow::break_) break;
      line_ = node.line;
    }
    if (n == 0) exec_body(node.else_body);
    return Flow::normal;
  }

  Value call_macro(const Node& macro, Args& args) {
    DepthGuard guard(*this);
    Frame frame;
    frame.barrier = true;
    if (args.positional.size() > macro.params.size())
      error(fmt::format("macro '{}' takes {} arguments", macro.text, macro.params.size()));
    frames_.push_back(std::move(frame));
    for (size_t i = 0; i < macro.params.size(); ++i) {
      const auto& [param, def] = macro.params[i];
      if (const Value* v = args.get(i, param)) assign(param, *v);
      else assign(param, def ? eval(*def) : Value::undefined(param));
    }
    std::string result = capture(macro.body);
    frames_.pop_back();
    return Value::of(std::move(result));
  }

  // The output of `body`, rendered aside (set blocks, filter blocks, macro calls).
  std::string capture(const Body& body) {
    std::string saved = std::move(out_);
    out_.clear();
    exec_body(body);
    std::string captured = std::move(out_);
    out_ = std::move(saved);
    return captured;
  }

  // --- expressions

  Value eval(const Expr& e) {
    DepthGuard guard(*this);
    line_ = e.line;
    switch (e.kind) {
      case Expr::Kind::literal: return Value::of(e.value);
      case Expr::Kind::name: {
        Value v = lookup(e.name);
        if (!v.defined()) v.name = e.name;
        return v;
      }
      case Expr::Kind::list:
      case Expr::Kind::tuple: {
        Json out = Json::array();
        for (const auto& a : e.args) out.push_back(data(eval(*a), "list"));
        return Value::of(std::move(out));
      }
      case Expr::Kind::dict: {
        Json out = Json::object();
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          const Value key = eval(*e.args[i]);
          out[dict_key(key)] = data(eval(*e.args[i + 1]), "dict");
        }
        return Value::of(std::move(out));
      }
      case Expr::Kind::attr: return get_attr(eval(*e.args[0]), e.name);
      case Expr::Kind::item: return get_item(eval(*e.args[0]), eval(*e.args[1]));
      case Expr::Kind::slice: return slice(e);
      case Expr::Kind::call: {
        const Value callee = eval(*e.args[0]);
        Args args = eval_args(e, 1);
        line_ = e.line;
        if (callee.kind != Value::Kind::function)
          error(callee.defined() ? "value is not callable" : fmt::format("'{}' is undefined", callee.name));
        return (*callee.fn)(*this, args);
      }
      case Expr::Kind::filter: {
        Value operand = eval(*e.args[0]);
        Args args = eval_args(e, 1);
        line_ = e.line;
        return apply_filter(e.name, operand, args);
      }
      case Expr::Kind::test: {
        const Value operand = eval(*e.args[0]);
        Args args = eval_args(e, 1);
        line_ = e.line;
        return Value::of(apply_test(e.name, operand, args) != e.negated);
      }
      case Expr::Kind::not_: return Value::of(!truthy(eval(*e.args[0])));
      case Expr::Kind::neg: {
        const Value operand = eval(*e.args[0]);
        const Json& j = data(operand, "-");
        if (j.is_number_float()) return Value::of(-j.get<double>());
        if (j.is_number_integer()) return Value::of(-j.get<int64_t>());
        error("bad operand for unary -");
      }
      case Expr::Kind::and_: {
        Value lhs = eval(*e.args[0]);
        return truthy(lhs) ? eval(*e.args[1]) : lhs;
      }
      case Expr::Kind::or_: {
        Value lhs = eval(*e.args[0]);
        return truthy(lhs) ? lhs : eval(*e.args[1]);
      }
      case Expr::Kind::cond:
        if (truthy(eval(*e.args[1]))) return eval(*e.args[0]);
        return e.args.size() > 2 ? eval(*e.args[2]) : Value::undefined("else");
      case Expr::Kind::binary: return binary(e);
    }
    error("bad expression");
  }

  Args eval_args(const Expr& e, size_t first) {
    Args args;
    for (size_t i = first; i < e.args.size(); ++i) args.positional.push_back(eval(*e.args[i]));
    for (const auto& [k, v] : e.kwargs) args.keyword.emplace_back(k, eval(*v));
    return args;
  }

  std::string dict_key(const Value& key) const {
    if (key.is_string()) return key.str();
    if (key.is_data() && key.json().is_number_integer()) return int_key(key.json().get<int64_t>());
    error("dict keys must be strings or integers");
  }

  Value get_attr(const Value& object, const std::string& attr) {
    if (object.kind == Value::Kind::undefined) error(fmt::format("'{}' is undefined", object.name));
    if (object.kind == Value::Kind::ns) {
      if (object.ns->contains(attr)) return Value::of((*object.ns)[attr]);
      return Value::undefined(attr);
    }
    if (object.kind == Value::Kind::loop) return loop_attr(*object.loop, attr);
    if (object.kind == Value::Kind::function) return Value::undefined(attr);
    const Json& j = object.json();
    if (is_method(j, attr)) return bound_method(object, attr);
    if (j.is_object()) {
      const auto it = j.find(attr);
      if (it != j.end()) return Value::part(object.data, *it);
    }
    return Value::undefined(attr);
  }

  Value loop_attr(const LoopState& loop, const std::string& attr) {
    const int64_t i = loop.index, n = static_cast<int64_t>(loop.items->size());
    if (attr == "index") return Value::of(i + 1);
    if (attr == "index0") return Value::of(i);
    if (attr == "revindex") return Value::of(n - i);
    if (attr == "revindex0") return Value::of(n - i - 1);
    if (attr == "first") return Value::of(i == 0);
    if (attr == "last") return Value::of(i == n - 1);
    if (attr == "length") return Value::of(n);
    if (attr == "depth") return Value::of(1);
    if (attr == "depth0") return Value::of(0);
    if (attr == "previtem") return i > 0 ? (*loop.items)[static_cast<size_t>(i - 1)] : Value::undefined(attr);
    if (attr == "nextitem") return i + 1 < n ? (*loop.items)[static_cast<size_t>(i + 1)] : Value::undefined(attr);
    if (attr == "cycle")
      return Value::function([i](Renderer& r, Args& a) -> Value {
        if (a.positional.empty()) r.error("loop.cycle() needs arguments");
        return a.positional[static_cast<size_t>(i) % a.positional.size()];
      });
    return Value::undefined(attr);
  }

  Value get_item(const Value& object, const Value& key) {
    if (object.kind == Value::Kind::undefined) error(fmt::format("'{}' is undefined", object.name));
    if (object.kind == Value::Kind::ns) {
      if (key.is_string() && object.ns->contains(key.str())) return Value::of((*object.ns)[key.str()]);
      return Value::undefined(to_str(key));
    }
    if (object.kind != Value::Kind::data) return Value::undefined(to_str(key));
    const Json& j = object.json();
    if (j.is_object() && key.is_data() && key.json().is_number_integer()) {
      const auto it = j.find(int_key(key.json().get<int64_t>()));
      if (it != j.end()) return Value::part(object.data, *it);
      return Value::undefined(to_str(key));
    }
    if (j.is_object() && key.is_string()) {
      const auto it = j.find(key.str());
      if (it != j.end()) return Value::part(object.data, *it);
      if (is_method(j, key.str())) return bound_method(object, key.str());
      return Value::undefined(key.str());
    }
    if ((j.is_array() || j.is_string()) && key.is_data() && key.json().is_number_integer()) {
      int64_t i = key.json().get<int64_t>();
      if (j.is_array()) {
        const auto n = static_cast<int64_t>(j.size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) return Value::undefined(fmt::format("index {}", key.json().get<int64_t>()));
        return Value::part(object.data, j[static_cast<size_t>(i)]);
      }
      const std::u32string u = to_u32(j.get_ref<const std::string&>());
      const auto n = static_cast<int64_t>(u.size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::undefined(fmt::format("index {}", key.json().get<int64_t>()));
      return Value::of(from_u32(std::u32string_view(u).substr(static_cast<size_t>(i), 1)));
    }
    if (key.is_string()) return get_attr(object, key.str());
    return Value::undefined(to_str(key));
  }

  // Python's slice index arithmetic for a sequence of length n.
  static std::vector<int64_t> slice_indices(int64_t n, std::optional<int64_t> start, std::optional<int64_t> stop,
                                            int64_t step) {
    std::vector<int64_t> out;
    auto clamp = [&](std::optional<int64_t> v, int64_t def_pos, int64_t def_neg) {
      if (!v) return step > 0 ? def_pos : def_neg;
      int64_t x = *v;
      if (x < 0) x += n;
      if (step > 0) return std::clamp<int64_t>(x, 0, n);
      return std::clamp<int64_t>(x, -1, n - 1);
    };
    const int64_t b = clamp(start, 0, n - 1), e = clamp(stop, n, -1);
    if (step > 0)
      for (int64_t i = b; i < e; i += step) out.push_back(i);
    else
      for (int64_t i = b; i > e; i += step) out.push_back(i);
    return out;
  }

  Value slice(const Expr& e) {
    const Value object = eval(*e.args[0]);
    auto bound = [&](size_t i) -> std::optional<int64_t> {
      if (!e.args[i]) return std::nullopt;
      const Value v = eval(*e.args[i]);
      if (v.is_none()) return std::nullopt;
      return int_arg(&v, "slice");
    };
    const auto start = bound(1), stop = bound(2), step_opt = bound(3);
    const int64_t step = step_opt.value_or(1);
    if (step == 0) error("slice step cannot be zero");
    const Json& j = data(object, "slice");
    if (j.is_array()) {
      Json out = Json::array();
      for (int64_t i : slice_indices(static_cast<int64_t>(j.size()), start, stop, step)) out.push_back(j[static_cast<size_t>(i)]);
      return Value::of(std::move(out));
    }
    if (j.is_string()) {
      const std::u32string u = to_u32(j.get_ref<const std::string&>());
      std::u32string out;
      for (int64_t i : slice_indices(static_cast<int64_t>(u.size()), start, stop, step)) out.push_back(u[static_cast<size_t>(i)]);
      return Value::of(from_u32(out));
    }
    error(fmt::format("cannot slice {}", j.type_name()));
  }

  // --- binary operators

  static bool is_number(const Json& j) { return j.is_number() || j.is_boolean(); }
  static double as_double(const Json& j) {
    return j.is_boolean() ? j.get<bool>() : j.is_number_float() ? j.get<double>() : static_cast<double>(j.get<int64_t>());
  }
  static bool is_int(const Json& j) { return j.is_number_integer() || j.is_boolean(); }
  static int64_t as_int(const Json& j) { return j.is_boolean() ? j.get<bool>() : j.get<int64_t>(); }

  bool equal(const Value& a, const Value& b) const {
    if (!a.defined() || !b.defined()) return a.defined() == b.defined();
    if (!a.is_data() || !b.is_data()) return a.fn == b.fn && a.ns == b.ns;
    if (a.generator || b.generator) return a.data == b.data;
    const Json &x = a.json(), &y = b.json();
    if (is_number(x) && is_number(y)) {
      if (is_int(x) && is_int(y)) return as_int(x) == as_int(y);
      return as_double(x) == as_double(y);
    }
    return x == y;
  }

  int compare(const Value& a, const Value& b, std::string_view op) const {
    const Json &x = data(a, op), &y = data(b, op);
    if (is_number(x) && is_number(y)) {
      if (is_int(x) && is_int(y)) return as_int(x) < as_int(y) ? -1 : as_int(x) > as_int(y);
      return as_double(x) < as_double(y) ? -1 : as_double(x) > as_double(y);
    }
    if (x.is_string() && y.is_string()) return x.get_ref<const std::string&>().compare(y.get_ref<const std::string&>());
    error(fmt::format("'{}' not supported between {} and {}", op, x.type_name(), y.type_name()));
  }

  bool contains(const Value& container, const Value& item) {
    if (!container.defined()) return false;
    if (container.generator) {
      for (const Value& e : iterate(container, "in"))
        if (equal(e, item)) return true;
      return false;
    }
    const Json& c = data(container, "in");
    if (c.is_string()) {
      if (!item.is_string()) error("'in <string>' requires a string as left operand");
      return c.get_ref<const std::string&>().find(item.str()) != std::string::npos;
    }
    if (c.is_object())
      return (item.is_string() || (item.is_data() && item.json().is_number_integer())) && c.contains(dict_key(item));
    if (c.is_array()) {
      for (const auto& e : c)
        if (equal(Value::part(container.data, e), item)) return true;
      return false;
    }
    error(fmt::format("argument of type {} is not iterable", c.type_name()));
  }

  Value arithmetic(const std::string& op, const Json& x, const Json& y) {
    if (op == "+" && x.is_string() && y.is_string())
      return string_value(x.get_ref<const std::string&>() + y.get_ref<const std::string&>());
    if (op == "+" && x.is_array() && y.is_array()) {
      Json out = x;
      for (const auto& e : y) out.push_back(e);
      return Value::of(std::move(out));
    }
    if (op == "*" && (x.is_string() || x.is_array()) && is_int(y)) return repeat(x, as_int(y));
    if (op == "*" && is_int(x) && (y.is_string() || y.is_array())) return repeat(y, as_int(x));
    if (op == "%" && x.is_string()) return string_value(percent_format(x.get_ref<const std::string&>(), y));
    if (!is_number(x) || !is_number(y))
      error(fmt::format("unsupported operand types for {}: {} and {}", op, x.type_name(), y.type_name()));
    if (op == "/") {
      if (as_double(y) == 0) error("division by zero");
      return Value::of(as_double(x) / as_double(y));
    }
    if (is_int(x) && is_int(y)) {
      const int64_t a = as_int(x), b = as_int(y);
      int64_t r = 0;
      if (op == "+" && !__builtin_add_overflow(a, b, &r)) return Value::of(r);
      if (op == "-" && !__builtin_sub_overflow(a, b, &r)) return Value::of(r);
      if (op == "*" && !__builtin_mul_overflow(a, b, &r)) return Value::of(r);
      if (op == "//" || op == "%") {
        if (b == 0) error("integer division or modulo by zero");
        int64_t q = a / b, m = a % b;
        if (m != 0 && ((m < 0) != (b < 0))) {
          --q;
          m += b;
        }
        return Value::of(op == "//" ? q : m);
      }
      if (op == "**" && b >= 0) {
        int64_t p = 1;
        for (int64_t i = 0; i < b; ++i)
          if (__builtin_mul_overflow(p, a, &p)) error("integer overflow");
        return Value::of(p);
      }
      if (op != "**") error("integer overflow");
    }
    const double a = as_double(x), b = as_double(y);
    if (op == "+") return Value::of(a + b);
    if (op == "-") return Value::of(a - b);
    if (op == "*") return Value::of(a * b);
    if (op == "**") return Value::of(std::pow(a, b));
    if (b == 0) error("float division by zero");
    if (op == "//") return Value::of(std::floor(a / b));
    double m = std::fmod(a, b);
    if (m != 0 && ((m < 0) != (b < 0))) m += b;
    return Value::of(m);
  }

  Value repeat(const Json& x, int64_t n) {
    n = std::max<int64_t>(n, 0);
    const size_t unit = x.is_string() ? x.get_ref<const std::string&>().size() : x.size();
    if (unit != 0 && static_cast<uint64_t>(n) > options_.limits.max_output_bytes / unit)
      error(fmt::format("a repetition exceeds {} bytes", options_.limits.max_output_bytes), Errc::limit);
    if (x.is_string()) {
      std::string out;
      for (int64_t i = 0; i < n; ++i) out += x.get_ref<const std::string&>();
      return Value::of(std::move(out));
    }
    Json out = Json::array();
    for (int64_t i = 0; i < n; ++i)
      for (const auto& e : x) out.push_back(e);
    return Value::of(std::move(out));
  }

  // Python's "fmt % args" for %s, %d, %i, %r and %%.
  std::string percent_format(const std::string& f, const Json& args) {
    std::vector<Json> items;
    if (args.is_array()) items.assign(args.begin(), args.end());
    else items.push_back(args);
    std::string out;
    size_t next = 0;
    for (size_t i = 0; i < f.size(); ++i) {
      if (f[i] != '%') {
        out += f[i];
        continue;
      }
      if (++i >= f.size()) error("incomplete format");
      if (f[i] == '%') {
        out += '%';
        continue;
      }
      if (next >= items.size()) error("not enough arguments for format string");
      const Json& a = items[next++];
      if (f[i] == 's') out += py_str(a);
      else if (f[i] == 'r') py_repr(a, out);
      else if ((f[i] == 'd' || f[i] == 'i') && is_number(a)) out += std::to_string(static_cast<int64_t>(as_double(a)));
      else error(fmt::format("unsupported format '%{}'", f[i]));
    }
    return out;
  }

  Value binary(const Expr& e) {
    const std::string& op = e.name;
    const Value lhs = eval(*e.args[0]);
    const Value rhs = eval(*e.args[1]);
    line_ = e.line;
    if (op == "~") return string_value(to_str(lhs) + to_str(rhs));
    if (op == "+" && (lhs.markup || rhs.markup) && lhs.is_string() && rhs.is_string())
      return markup((lhs.markup ? lhs.str() : html_escape(lhs.str())) + (rhs.markup ? rhs.str() : html_escape(rhs.str())));
    if (op == "==") return Value::of(equal(lhs, rhs));
    if (op == "!=") return Value::of(!equal(lhs, rhs));
    if (op == "<") return Value::of(compare(lhs, rhs, op) < 0);
    if (op == ">") return Value::of(compare(lhs, rhs, op) > 0);
    if (op == "<=") return Value::of(compare(lhs, rhs, op) <= 0);
    if (op == ">=") return Value::of(compare(lhs, rhs, op) >= 0);
    if (op == "in") return Value::of(contains(rhs, lhs));
    if (op == "not in") return Value::of(!contains(rhs, lhs));
    return arithmetic(op, data(lhs, op), data(rhs, op));
  }

  // --- methods of str, dict and list values

  static bool is_method(const Json& j, std::string_view name) {
    static constexpr std::string_view str_methods[] = {
        "strip", "lstrip", "rstrip", "split", "rsplit", "startswith", "endswith", "replace", "upper", "lower",
        "title", "capitalize", "format", "find", "rfind", "count", "join", "isdigit", "isalpha", "isspace",
        "isupper", "islower", "splitlines"};
    static constexpr std::string_view dict_methods[] = {"items", "keys", "values", "get"};
    static constexpr std::string_view list_methods[] = {"index", "count"};
    auto in = [&](const auto& list) { return std::find(std::begin(list), std::end(list), name) != std::end(list); };
    if (j.is_string()) return in(str_methods);
    if (j.is_object()) return in(dict_methods);
    if (j.is_array()) return in(list_methods);
    return false;
  }

  Value bound_method(const Value& self, const std::string& name) {
    return Value::function([self, name](Renderer& r, Args& args) { return r.call_method(self, name, args); });
  }

  Value call_method(const Value& self, const std::string& name, Args& args) {
    const Json& j = self.json();
    if (j.is_object()) {
      if (name == "items") {
        Json out = Json::array();
        for (const auto& [k, v] : j.items()) out.push_back(Json::array({key_value(k), v}));
        return Value::of(std::move(out));
      }
      if (name == "keys" || name == "values") {
        Json out = Json::array();
        for (const auto& [k, v] : j.items()) out.push_back(name == "keys" ? key_value(k) : v);
        return Value::of(std::move(out));
      }
      const std::string& key = string_arg(args.get(0, "key"), "get");
      const auto it = j.find(key);
      if (it != j.end()) return Value::part(self.data, *it);
      const Value* def = args.get(1, "default");
      return def ? *def : Value::of(nullptr);
    }
    if (j.is_array()) {
      const Value* x = args.get(0, "x");
      if (!x) error(fmt::format("{}() takes one argument", name));
      int64_t count = 0;
      for (size_t i = 0; i < j.size(); ++i) {
        if (!equal(Value::part(self.data, j[i]), *x)) continue;
        if (name == "index") return Value::of(static_cast<int64_t>(i));
        ++count;
      }
      if (name == "index") error("list.index(x): x not in list");
      return Value::of(count);
    }
    const std::string& s = j.get_ref<const std::string&>();
    auto opt_str = [&](size_t i, std::string_view key) -> std::optional<std::string> {
      const Value* v = args.get(i, key);
      if (!v || v->is_none()) return std::nullopt;
      return string_arg(v, name);
    };
    if (name == "strip" || name == "lstrip" || name == "rstrip")
      return like(self, py_strip(s, opt_str(0, "chars"), name != "rstrip", name != "lstrip"));
    if (name == "upper") return like(self, py_upper(s));
    if (name == "lower") return like(self, py_lower(s));
    if (name == "title") return like(self, py_title(s));
    if (name == "capitalize") return like(self, py_capitalize(s));
    if (name == "startswith" || name == "endswith") {
      const Value* arg = args.get(0, "prefix");
      if (!arg || !arg->is_data()) error(fmt::format("{}() takes a string", name));
      std::vector<std::string> options;
      if (arg->json().is_array())
        for (const auto& e : arg->json()) options.push_back(e.is_string() ? e.get<std::string>() : "");
      else
        options.push_back(string_arg(arg, name));
      for (const auto& o : options)
        if (name == "startswith" ? s.starts_with(o) : s.ends_with(o)) return Value::of(true);
      return Value::of(false);
    }
    if (name == "split" || name == "rsplit") return Value::of(split(s, opt_str(0, "sep"), args, name == "rsplit"));
    if (name == "splitlines") {
      Json out = Json::array();
      size_t start = 0;
      for (size_t i = 0; i < s.size(); ++i)
        if (s[i] == '\n') {
          out.push_back(s.substr(start, i - start));
          start = i + 1;
        }
      if (start < s.size()) out.push_back(s.substr(start));
      return Value::of(std::move(out));
    }
    if (name == "replace") {
      const Value* count = args.get(2, "count");
      return string_value(py_replace(s, string_arg(args.get(0, "old"), name), string_arg(args.get(1, "new"), name),
                                     count ? int_arg(count, name) : -1, options_.limits.max_output_bytes));
    }
    if (name == "find" || name == "rfind" || name == "count") {
      const std::string& sub = string_arg(args.get(0, "sub"), name);
      if (name == "count") {
        int64_t n = 0;
        if (sub.empty()) return Value::of(code_points(s) + 1);
        for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
        return Value::of(n);
      }
      const size_t at = name == "find" ? s.find(sub) : s.rfind(sub);
      return Value::of(at == std::string::npos ? int64_t{-1} : code_points(std::string_view(s).substr(0, at)));
    }
    if (name == "join") {
      std::string out;
      const std::vector<Value> items = iterate(*args.get(0, "iterable"), "join");
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += s;
        out += string_arg(&items[i], "join");
      }
      return string_value(std::move(out));
    }
    if (name == "format") return string_value(str_format(s, args));
    const std::u32string u = to_u32(s);
    auto all = [&](auto pred) { return !u.empty() && std::all_of(u.begin(), u.end(), pred); };
    if (name == "isdigit") return Value::of(all([](char32_t c) { return u_isdigit(static_cast<UChar32>(c)) != 0; }));
    if (name == "isalpha") return Value::of(all([](char32_t c) { return u_isalpha(static_cast<UChar32>(c)) != 0; }));
    if (name == "isspace") return Value::of(all(py_space));
    return Value::of(py_is_case(s, name == "islower"));
  }

  Json split(const std::string& s, const std::optional<std::string>& sep, const Args& args, bool from_right) {
    const Value* max_v = args.get(1, "maxsplit");
    int64_t max = max_v ? int_arg(max_v, "split") : -1;
    std::vector<std::string> parts;
    if (sep) {
      if (sep->empty()) error("empty separator");
      if (!from_right) {
        size_t start = 0;
        for (size_t at; (max < 0 || static_cast<int64_t>(parts.size()) < max) && (at = s.find(*sep, start)) != std::string::npos;
             start = at + sep->size())
          parts.push_back(s.substr(start, at - start));
        parts.push_back(s.substr(start));
      } else {
        size_t end = s.size();
        std::vector<std::string> rev;
        while (max < 0 || static_cast<int64_t>(rev.size()) < max) {
          if (end < sep->size()) break;
          const size_t at = s.rfind(*sep, end - sep->size());
          if (at == std::string::npos) break;
          rev.push_back(s.substr(at + sep->size(), end - at - sep->size()));
          end = at;
        }
        rev.push_back(s.substr(0, end));
        parts.assign(rev.rbegin(), rev.rend());
      }
    } else {  // runs of whitespace, no empty parts
      const std::u32string u = to_u32(s);
      size_t i = 0;
      while (i < u.size()) {
        while (i < u.size() && py_space(u[i])) ++i;
        if (i >= u.size()) break;
        if (max >= 0 && static_cast<int64_t>(parts.size()) == max && !from_right) {
          size_t e = u.size();
          while (e > i && py_space(u[e - 1])) --e;
          parts.push_back(from_u32(std::u32string_view(u).substr(i, e - i)));
          break;
        }
        const size_t b = i;
        while (i < u.size() && !py_space(u[i])) ++i;
        parts.push_back(from_u32(std::u32string_view(u).substr(b, i - b)));
      }
    }
    Json out = Json::array();
    for (auto& p : parts) out.push_back(std::move(p));
    return out;
  }

  // str.format with "{}", "{0}" and "{name}" fields.
  std::string str_format(const std::string& f, const Args& args) {
    std::string out;
    size_t auto_index = 0;
    for (size_t i = 0; i < f.size(); ++i) {
      if (f[i] == '{' && i + 1 < f.size() && f[i + 1] == '{') {
        out += '{';
        ++i;
      } else if (f[i] == '}' && i + 1 < f.size() && f[i + 1] == '}') {
        out += '}';
        ++i;
      } else if (f[i] == '{') {
        const size_t end = f.find('}', i);
        if (end == std::string::npos) error("format: unmatched '{'");
        const std::string field = f.substr(i + 1, end - i - 1);
        const Value* v = nullptr;
        if (field.empty()) v = auto_index < args.positional.size() ? &args.positional[auto_index++] : nullptr;
        else if (std::all_of(field.begin(), field.end(), ::isdigit)) v = args.get(std::stoul(field), "");
        else v = args.get(SIZE_MAX, field);
        if (!v) error(fmt::format("format: no argument for '{{{}}}'", field));
        out += to_str(*v);
        i = end;
      } else {
        out += f[i];
      }
    }
    return out;
  }

  // --- globals

  Value builtin(const std::string& name) const {
    static const std::unordered_map<std::string, Function> globals = {
        {"range", [](Renderer& r, Args& a) { return r.range(a); }},
        {"namespace",
         [](Renderer& r, Args& a) {
           Value v;
           v.kind = Value::Kind::ns;
           v.ns = std::make_shared<Json>(Json::object());
           for (const auto& p : a.positional)
             for (const auto& [k, e] : r.data(p, "namespace").items()) (*v.ns)[k] = e;
           for (const auto& [k, e] : a.keyword) (*v.ns)[k] = r.data(e, "namespace");
           return v;
         }},
        {"dict",
         [](Renderer& r, Args& a) {
           Json out = Json::object();
           for (const auto& p : a.positional)
             for (const auto& [k, e] : r.data(p, "dict").items()) out[k] = e;
           for (const auto& [k, e] : a.keyword) out[k] = r.data(e, "dict");
           return Value::of(std::move(out));
         }},
        {"raise_exception",
         [](Renderer& r, Args& a) -> Value {
           r.error(fmt::format("raise_exception: {}", a.positional.empty() ? "" : r.to_str(a.positional[0])));
         }},
        {"strftime_now",
         [](Renderer& r, Args& a) { return r.strftime_now(r.string_arg(a.get(0, "format"), "strftime_now")); }},
    };
    const auto it = globals.find(name);
    if (it == globals.end()) return Value::undefined(name);
    return Value::function(std::shared_ptr<const Function>(std::shared_ptr<void>(), &it->second));
  }

  Value range(Args& a) {
    int64_t start = 0, stop = 0, step = 1;
    if (a.positional.size() == 1) {
      stop = int_arg(&a.positional[0], "range");
    } else if (a.positional.size() >= 2) {
      start = int_arg(&a.positional[0], "range");
      stop = int_arg(&a.positional[1], "range");
      if (a.positional.size() > 2) step = int_arg(&a.positional[2], "range");
    }
    if (step == 0) error("range() step must not be zero");
    Json out = Json::array();
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      count_iteration();
      out.push_back(i);
    }
    return Value::of(std::move(out));
  }

  Value strftime_now(const std::string& format) {
    std::tm tm{};
    if (options_.now) {
      tm = *options_.now;
    } else {
      const std::time_t t = std::time(nullptr);
      localtime_r(&t, &tm);
    }
    if (format.size() > 256) error("strftime_now: format too long");
    char buf[1024];
    const size_t n = std::strftime(buf, sizeof buf, format.c_str(), &tm);
    return Value::of(std::string(buf, n));
  }

  // --- filters

  Value apply_filter(const std::string& name, const Value& v, Args& a) {
    if (name == "default" || name == "d") {
      const Value* boolean = a.get(1, "boolean");
      if (!v.defined() || (boolean && truthy(*boolean) && !truthy(v))) {
        const Value* def = a.get(0, "default_value");
        return def ? *def : Value::of("");
      }
      return v;
    }
    if (name == "safe") return v.is_string() && !v.markup ? markup(v.str()) : v.is_string() ? v : markup(to_str(v));
    if (name == "string" && v.is_string()) return v;
    if (name == "string") return Value::of(to_str(v));
    if (name == "length" || name == "count") {
      if (!v.defined()) return Value::of(0);
      const Json& j = data(v, name);
      if (j.is_string()) return Value::of(code_points(j.get_ref<const std::string&>()));
      if (j.is_array() || j.is_object()) return Value::of(static_cast<int64_t>(j.size()));
      error(fmt::format("object of type {} has no len()", j.type_name()));
    }
    if (name == "tojson") return string_value(tojson(v, a));
    if (name == "trim") {
      const Value* chars = a.get(0, "chars");
      return like(v, py_strip(to_str(v), chars && !chars->is_none() ? std::optional(string_arg(chars, name)) : std::nullopt, true, true));
    }
    if (name == "upper") return like(v, py_upper(to_str(v)));
    if (name == "lower") return like(v, py_lower(to_str(v)));
    if (name == "capitalize") return like(v, py_capitalize(to_str(v)));
    if (name == "title") return like(v, py_title(to_str(v)));
    if (name == "replace") {
      const Value* count = a.get(2, "count");
      return string_value(py_replace(to_str(v), to_str(*require(a.get(0, "old"), name)),
                                     to_str(*require(a.get(1, "new"), name)), count ? int_arg(count, name) : -1,
                                     options_.limits.max_output_bytes));
    }
    if (name == "int") return to_int(v, a);
    if (name == "float") {
      const Json& j = data(v, name);
      if (is_number(j)) return Value::of(as_double(j));
      if (j.is_string()) {
        char* end = nullptr;
        const std::string s = py_strip(j.get_ref<const std::string&>(), std::nullopt, true, true);
        const double d = std::strtod(s.c_str(), &end);
        if (!s.empty() && end == s.c_str() + s.size()) return Value::of(d);
      }
      const Value* def = a.get(0, "default");
      return def ? *def : Value::of(0.0);
    }
    if (name == "abs") {
      const Json& j = data(v, name);
      if (j.is_number_float()) return Value::of(std::abs(j.get<double>()));
      if (is_int(j)) return Value::of(std::abs(as_int(j)));
      error("abs: expected a number");
    }
    if (name == "round") {
      const Json& j = data(v, name);
      if (!is_number(j)) error("round: expected a number");
      const Value* prec = a.get(0, "precision");
      const double scale = std::pow(10.0, prec ? static_cast<double>(int_arg(prec, name)) : 0.0);
      const Value* method = a.get(1, "method");
      const std::string m = method ? string_arg(method, name) : "common";
      const double x = as_double(j) * scale;
      // "common" is Python's round(): halves go to the even neighbour, as nearbyint does by default.
      const double r = m == "floor" ? std::floor(x) : m == "ceil" ? std::ceil(x) : std::nearbyint(x);
      return Value::of(r / scale);
    }
    if (name == "last" && v.generator) error("last: a generator cannot be reversed; add '| list'");
    if (name == "first" || name == "last") {
      const std::vector<Value> items = iterate(v, name);
      if (items.empty()) return Value::undefined(name);
      return name == "first" ? items.front() : items.back();
    }
    if (name == "list") return Value::of(to_json_list(iterate(v, name), *this));
    if (name == "reverse") {
      if (v.is_string()) {
        std::u32string u = to_u32(v.str());
        std::reverse(u.begin(), u.end());
        return Value::of(from_u32(u));
      }
      std::vector<Value> items = iterate(v, name);
      std::reverse(items.begin(), items.end());
      return Value::of(to_json_list(items, *this));
    }
    if (name == "join") {
      const Value* sep = a.get(0, "d");
      const Value* attr = a.get(1, "attribute");
      std::string out;
      const std::vector<Value> items = iterate(v, name);
      for (size_t i = 0; i < items.size(); ++i) {
        if (i && sep) out += to_str(*sep);
        out += to_str(attr ? get_attr(items[i], to_str(*attr)) : items[i]);
        if (out.size() > options_.limits.max_output_bytes) string_value(std::move(out));
      }
      return string_value(std::move(out));
    }
    if (name == "items") {
      Json out = Json::array();
      if (!v.defined()) return generator(std::move(out));
      const Json& j = data(v, name);
      if (!j.is_object()) error("items: expected a mapping");
      for (const auto& [k, e] : j.items()) out.push_back(Json::array({key_value(k), e}));
      return generator(std::move(out));
    }
    if (name == "dictsort") {
      const Json& j = data(v, name);
      if (!j.is_object()) error("dictsort: expected a mapping");
      std::vector<std::pair<Json, Json>> items;
      for (const auto& [k, e] : j.items()) items.emplace_back(key_value(k), e);
      const Value* cs = a.get(0, "case_sensitive");
      const bool case_sensitive = cs && truthy(*cs);
      auto sort_key = [&](const Json& k) {
        return Value::of(k.is_string() && !case_sensitive ? Json(py_lower(k.get<std::string>())) : k);
      };
      std::stable_sort(items.begin(), items.end(), [&](auto& x, auto& y) {
        return compare(sort_key(x.first), sort_key(y.first), "dictsort") < 0;
      });
      Json out = Json::array();
      for (auto& [k, e] : items) out.push_back(Json::array({k, e}));
      return Value::of(std::move(out));
    }
    if (name == "selectattr" || name == "rejectattr" || name == "select" || name == "reject") {
      const bool by_attr = name.ends_with("attr"), keep = name.starts_with("select");
      Json out = Json::array();
      size_t next = 0;
      const std::string attr = by_attr ? to_str(*require(a.get(next++, "attribute"), name)) : "";
      const Value* test = a.get(next, "test");
      Args test_args;
      for (size_t i = next + 1; i < a.positional.size(); ++i) test_args.positional.push_back(a.positional[i]);
      if (!truthy(v)) return generator(std::move(out));
      for (const Value& item : iterate(v, name)) {
        const Value subject = by_attr ? get_attr_path(item, attr) : item;
        const bool pass = test ? apply_test(to_str(*test), subject, test_args) : truthy(subject);
        if (pass == keep) out.push_back(data(item, name));
      }
      return generator(std::move(out));
    }
    if (name == "map") {
      Json out = Json::array();
      if (!truthy(v)) return generator(std::move(out));
      const std::vector<Value> items = iterate(v, name);
      for (const auto& [k, attr] : a.keyword) {
        if (k != "attribute") continue;
        const Value* def = a.get(SIZE_MAX, "default");
        for (const Value& item : items) {
          Value x = get_attr_path(item, to_str(attr));
          if (!x.defined() && def) x = *def;
          out.push_back(data(x, "map"));
        }
        return generator(std::move(out));
      }
      const std::string filter = to_str(*require(a.get(0, "filter"), name));
      Args rest;
      rest.positional.assign(a.positional.begin() + 1, a.positional.end());
      rest.keyword = a.keyword;
      for (const Value& item : items) out.push_back(data(apply_filter(filter, item, rest), "map"));
      return generator(std::move(out));
    }
    if (name == "unique") {
      Json out = Json::array();
      std::vector<Value> seen;
      for (const Value& item : iterate(v, name)) {
        const Value key = item.is_string() ? Value::of(py_lower(item.str())) : item;
        if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equal(s, key); })) continue;
        seen.push_back(key);
        out.push_back(data(item, name));
      }
      return generator(std::move(out));
    }
    if (name == "sort") {
      std::vector<Value> items = iterate(v, name);
      const Value* rev = a.get(0, "reverse");
      const Value* cs = a.get(1, "case_sensitive");
      const Value* attr = a.get(2, "attribute");
      auto key = [&](const Value& item) {
        Value k = attr ? get_attr_path(item, to_str(*attr)) : item;
        if (k.is_string() && !(cs && truthy(*cs))) k = Value::of(py_lower(k.str()));
        return k;
      };
      const bool reverse = rev && truthy(*rev);  // stable either way, as Python's sorted(reverse=True)
      std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
        const int c = compare(key(x), key(y), "sort");
        return reverse ? c > 0 : c < 0;
      });
      return Value::of(to_json_list(items, *this));
    }
    if (name == "sum") {
      Value total = Value::of(0);
      for (const Value& item : iterate(v, name)) total = arithmetic("+", total.json(), data(item, name));
      return total;
    }
    if (name == "min" || name == "max") {
      const std::vector<Value> items = iterate(v, name);
      if (items.empty()) return Value::undefined(name);
      Value best = items[0];
      for (const Value& item : items)
        if ((compare(item, best, name) < 0) == (name == "min") && !equal(item, best)) best = item;
      return best;
    }
    if (name == "indent") return Value::of(indent(to_str(v), a));
    if (name == "escape" || name == "e") return v.markup ? v : markup(html_escape(to_str(v)));
    if (name == "format") {
      Json args = Json::array();
      for (const auto& p : a.positional) args.push_back(data(p, name));
      return string_value(percent_format(to_str(v), args));
    }
    if (name == "wordcount") return Value::of(static_cast<int64_t>(split(to_str(v), std::nullopt, {}, false).size()));
    error(fmt::format("unknown filter '{}'", name));
  }

  const Value* require(const Value* v, std::string_view what) const {
    if (!v) error(fmt::format("{}: missing argument", what));
    return v;
  }

  // "a.b.c" attribute paths, as selectattr and map accept.
  Value get_attr_path(const Value& item, const std::string& path) {
    Value v = item;
    size_t start = 0;
    while (true) {
      const size_t dot = path.find('.', start);
      const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      if (!v.defined()) return v;
      v = std::all_of(part.begin(), part.end(), ::isdigit) && !part.empty() ? get_item(v, Value::of(std::stoll(part)))
                                                                           : get_item(v, Value::of(part));
      if (dot == std::string::npos) return v;
      start = dot + 1;
    }
  }

  Value to_int(const Value& v, const Args& a) {
    const Value* def = a.get(0, "default");
    const Value fallback = def ? *def : Value::of(0);
    if (!v.is_data()) return fallback;
    const Json& j = v.json();
    if (is_int(j)) return Value::of(as_int(j));
    if (j.is_number_float()) return Value::of(static_cast<int64_t>(std::trunc(j.get<double>())));
    if (j.is_string()) {
      const std::string s = py_strip(j.get_ref<const std::string&>(), std::nullopt, true, true);
      int64_t i = 0;
      const auto r = std::from_chars(s.data(), s.data() + s.size(), i);
      if (!s.empty() && r.ec == std::errc() && r.ptr == s.data() + s.size()) return Value::of(i);
      char* end = nullptr;
      const double d = std::strtod(s.c_str(), &end);
      if (!s.empty() && end == s.c_str() + s.size() && std::isfinite(d)) return Value::of(static_cast<int64_t>(d));
    }
    return fallback;
  }

  int64_t bounded_width(const Value* v, std::string_view what) const {
    const int64_t width = int_arg(v, what);
    if (width > 1024) error(fmt::format("{}: an indent of {} is beyond the 1024 allowed", what, width), Errc::limit);
    return width;
  }

  std::string indent(const std::string& s, const Args& a) {
    const Value* width = a.get(0, "width");
    std::string pad = "    ";
    if (width && width->is_string()) pad = width->str();
    else if (width) pad = std::string(static_cast<size_t>(std::max<int64_t>(0, bounded_width(width, "indent"))), ' ');
    const Value* first = a.get(1, "first");
    const Value* blank = a.get(2, "blank");
    std::vector<std::string> lines;
    size_t start = 0;
    for (size_t i = 0; i <= s.size(); ++i)
      if (i == s.size() || s[i] == '\n') {
        lines.push_back(s.substr(start, i - start));
        start = i + 1;
      }
    const bool trailing_newline = !s.empty() && s.back() == '\n';
    if (trailing_newline) lines.pop_back();
    std::string out;
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i) out += '\n';
      const bool pad_line = (i > 0 || (first && truthy(*first))) && (!lines[i].empty() || (blank && truthy(*blank)));
      if (pad_line) out += pad;
      out += lines[i];
    }
    if (trailing_newline) out += '\n';
    return out;
  }

  // HF's tojson: json.dumps(x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys).
  std::string tojson(const Value& v, const Args& a) {
    const Json& j = data(v, "tojson");
    DumpStyle style;
    style.max_bytes = options_.limits.max_output_bytes;
    if (const Value* ea = a.get(0, "ensure_ascii")) style.ensure_ascii = truthy(*ea);
    if (const Value* ind = a.get(1, "indent"); ind && !ind->is_none()) {
      style.indent = ind->is_string() ? ind->str()
                                      : std::string(static_cast<size_t>(std::max<int64_t>(0, bounded_width(ind, "tojson"))), ' ');
      style.item_sep = ",";
    }
    if (const Value* sep = a.get(2, "separators"); sep && !sep->is_none()) {
      const Json& s = data(*sep, "tojson separators");
      if (!s.is_array() || s.size() != 2 || !s[0].is_string() || !s[1].is_string())
        error("tojson: separators must be two strings");
      style.item_sep = s[0].get<std::string>();
      style.key_sep = s[1].get<std::string>();
    }
    if (const Value* sk = a.get(3, "sort_keys")) style.sort_keys = truthy(*sk);
    std::string out;
    dumps(j, style, 0, out);
    return out;
  }

  // --- tests

  bool apply_test(const std::string& name, const Value& v, const Args& a) {
    if (v.generator && (name == "defined" || name == "iterable")) return true;
    if (v.generator && name != "undefined" && name != "eq" && name != "equalto" && name != "==" && name != "sameas" &&
        name != "ne" && name != "!=")
      return false;
    const Json* j = v.is_data() ? &v.json() : nullptr;
    if (name == "defined") return v.defined();
    if (name == "undefined") return !v.defined();
    if (name == "none") return j && j->is_null();
    if (name == "string") return j && j->is_string();
    if (name == "mapping") return (j && j->is_object()) || v.kind == Value::Kind::ns;
    if (name == "sequence") return j && (j->is_string() || j->is_array() || j->is_object());
    if (name == "iterable") return !v.defined() || (j && (j->is_string() || j->is_array() || j->is_object()));
    if (name == "number") return j && (j->is_number() || j->is_boolean());
    if (name == "integer") return j && j->is_number_integer();
    if (name == "float") return j && j->is_number_float();
    if (name == "boolean") return j && j->is_boolean();
    if (name == "true") return j && j->is_boolean() && j->get<bool>();
    if (name == "false") return j && j->is_boolean() && !j->get<bool>();
    if (name == "callable") return v.kind == Value::Kind::function;
    if (name == "lower" || name == "upper") {
      if (!j || !j->is_string()) return false;
      const std::string& s = j->get_ref<const std::string&>();
      return py_is_case(s, name == "lower");
    }
    if (name == "odd" || name == "even") {
      const int64_t i = int_arg(&v, name);
      return (i % 2 != 0) == (name == "odd");
    }
    if (name == "divisibleby") {
      const int64_t d = int_arg(require(a.get(0, "num"), name), name);
      return d != 0 && int_arg(&v, name) % d == 0;
    }
    const Value& other = *require(a.get(0, "other"), name);
    if (name == "eq" || name == "equalto" || name == "==" || name == "sameas") return equal(v, other);
    if (name == "ne" || name == "!=") return !equal(v, other);
    if (name == "lt" || name == "lessthan" || name == "<") return compare(v, other, "<") < 0;
    if (name == "le" || name == "<=") return compare(v, other, "<=") <= 0;
    if (name == "gt" || name == "greaterthan" || name == ">") return compare(v, other, ">") > 0;
    if (name == "ge" || name == ">=") return compare(v, other, ">=") >= 0;
    if (name == "in") return contains(other, v);
    error(fmt::format("unknown test '{}'", name));
  }

 private:
  const std::string& name_;
  const RenderOptions& options_;
  std::vector<Frame> frames_;
  std::string out_;
  int64_t iterations_ = 0;
  int depth_ = 0;
  int line_ = 1;
};

}  // namespace

struct Template::Impl {
  std::string name;
  Body body;
};

Template::Template(std::string_view source, std::string name, const Limits& limits) : impl_(std::make_unique<Impl>()) {
  impl_->name = std::move(name);
  Lexer lexer(source, impl_->name);
  Parser parser(lexer.run(), impl_->name, limits.max_depth * 4);
  impl_->body = parser.parse();
}

Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const Json& variables, const RenderOptions& options) const {
  Renderer renderer(impl_->name, options);
  return renderer.render(impl_->body, variables);
}

const std::string& Template::name() const { return impl_->name; }

}  // namespace lowbit::model::jinja
