// Byte-level BPE (GPT-2 family: Qwen2/3, Llama-3, SmolLM): split out added tokens, NFC-normalize, pre-tokenize
// with PCRE2 regexes, map bytes to the GPT-2 printable alphabet, merge adjacent symbols by merge rank.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <memory>
#include <nlohmann/json.hpp>
#include <queue>
#include <unordered_map>

#include "lowbit/core/error.h"
#include "lowbit/io/json.h"
#include "lowbit/model/tokenizers.h"
#include "tokenizer_util.h"

namespace lowbit::model {
namespace {

using detail::append_utf8;
using detail::LiteralMatcher;

// GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the rest to U+0100 upwards.
std::array<uint32_t, 256> byte_to_codepoint_table() {
  std::array<uint32_t, 256> table{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    table[b] = printable ? b : next++;
  }
  return table;
}

const std::array<uint32_t, 256>& byte_to_codepoint() {
  static const auto table = byte_to_codepoint_table();
  return table;
}

std::string to_byte_level(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) append_utf8(out, byte_to_codepoint()[b]);
  return out;
}

// Inverse of to_byte_level; characters outside the byte alphabet are kept as their UTF-8.
std::string from_byte_level(std::string_view token) {
  static const auto inverse = [] {
    std::unordered_map<uint32_t, unsigned char> m;
    for (int b = 0; b < 256; ++b) m[byte_to_codepoint()[b]] = static_cast<unsigned char>(b);
    return m;
  }();
  std::string out;
  for (size_t i = 0; i < token.size();) {
    const size_t start = i;
    bool valid = true;
    const uint32_t cp = detail::next_utf8(token, i, valid);
    const auto it = valid ? inverse.find(cp) : inverse.end();
    if (it != inverse.end()) out += static_cast<char>(it->second);
    else out.append(token.substr(start, i - start));
  }
  return out;
}

bool is_ascii(std::string_view s) {
  for (unsigned char c : s)
    if (c >= 0x80) return false;
  return true;
}

// NFC through ICU; text that is not valid UTF-8 is left as it is (its bytes still encode byte-level).
std::string nfc(std::string_view text) {
  if (is_ascii(text)) return std::string(text);
  UErrorCode status = U_ZERO_ERROR;
  const UNormalizer2* normalizer = unorm2_getNFCInstance(&status);
  int32_t len16 = 0;
  u_strFromUTF8(nullptr, 0, &len16, text.data(), static_cast<int32_t>(text.size()), &status);
  if (status != U_BUFFER_OVERFLOW_ERROR && U_FAILURE(status)) return std::string(text);
  status = U_ZERO_ERROR;
  std::u16string utf16(static_cast<size_t>(len16), u'\0');
  u_strFromUTF8(utf16.data(), len16, nullptr, text.data(), static_cast<int32_t>(text.size()), &status);
  if (U_FAILURE(status) || unorm2_isNormalized(normalizer, utf16.data(), len16, &status)) return std::string(text);
  status = U_ZERO_ERROR;
  const int32_t cap = len16 * 3 + 16;  // NFC expands by at most a factor of 3
  std::u16string normalized(static_cast<size_t>(cap), u'\0');
  const int32_t n = unorm2_normalize(normalizer, utf16.data(), len16, normalized.data(), cap, &status);
  if (U_FAILURE(status)) return std::string(text);
  std::string out(static_cast<size_t>(n) * 3, '\0');
  int32_t len8 = 0;
  u_strToUTF8(out.data(), static_cast<int32_t>(out.size()), &len8, normalized.data(), n, &status);
  if (U_FAILURE(status)) return std::string(text);
  out.resize(static_cast<size_t>(len8));
  return out;
}

class Regex {
 public:
  Regex(const std::string& pattern, std::string_view source) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    code_.reset(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                              PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &offset, nullptr));
    if (!code_) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof message);
      fail(Errc::format, "[tokenizer] {}: pre-tokenizer pattern rejected at offset {}: {}", source, offset,
           reinterpret_cast<const char*>(message));
    }
    pcre2_jit_compile(code_.get(), PCRE2_JIT_COMPLETE);  // falls back to the interpreter when JIT is absent
  }

  // Splits text into matches and the gaps between them, in order.
  void split(std::string_view text, std::vector<std::string_view>& out) const {
    std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match(
        pcre2_match_data_create_from_pattern(code_.get(), nullptr), pcre2_match_data_free);
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t pos = 0, emitted = 0;
    while (pos < text.size()) {
      const int rc = pcre2_match(code_.get(), subject, text.size(), pos, 0, match.get(), nullptr);
      if (rc < 0) break;
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match.get());
      const size_t begin = ov[0], end = ov[1];
      if (end == begin) {  // an empty match: step one byte so the scan always advances
        pos = begin + 1;
        continue;
      }
      if (begin > emitted) out.push_back(text.substr(emitted, begin - emitted));
      out.push_back(text.substr(begin, end - begin));
      emitted = pos = end;
    }
    if (emitted < text.size()) out.push_back(text.substr(emitted));
  }

 private:
  struct CodeFree {
    void operator()(pcre2_code* c) const { pcre2_code_free(c); }
  };
  std::unique_ptr<pcre2_code, CodeFree> code_;
};

class BpeTokenizer final : public Tokenizer {
 public:
  BpeTokenizer(BpeSpec spec, std::string_view source) : spec_(std::move(spec)) {
    for (const auto& [token, id] : spec_.vocab) {
      if (id < 0) fail(Errc::format, "[tokenizer] {}: negative token id {}", source, id);
      vocab_.emplace(token, id);  // a string listed twice (some GGUF vocabularies) encodes as its first id
      set_text(id, from_byte_level(token));
    }
    for (const auto& added : spec_.added) {
      if (added.id < 0) fail(Errc::format, "[tokenizer] {}: negative token id {}", source, added.id);
      set_text(added.id, added.content);
      added_ids_[added.content] = added.id;
      (added.special ? special_ : normal_added_).add(added.content, added.id);
    }
    index_merges(source);
    // Some vocabularies (SmolLM) lack tokens for a few control bytes; such bytes are dropped when encoding.
    for (int b = 0; b < 256; ++b) {
      const auto it = vocab_.find(to_byte_level(std::string(1, static_cast<char>(b))));
      byte_ids_[b] = it == vocab_.end() ? kNoToken : it->second;
    }
    for (const auto& pattern : spec_.split_patterns) regexes_.emplace_back(pattern, source);
  }

  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special) const override {
    std::vector<int32_t> ids;
    if (add_bos && spec_.add_bos && spec_.bos) ids.push_back(*spec_.bos);
    auto on_text = [&](std::string_view segment) { encode_segment(segment, ids); };
    auto on_token = [&](int32_t id) { ids.push_back(id); };
    // Special tokens first (only when asked to parse them), then the plain added tokens inside the rest.
    auto plain = [&](std::string_view segment) { normal_added_.split(segment, on_text, on_token); };
    if (parse_special) special_.split(text, plain, on_token);
    else plain(text);
    return ids;
  }

  std::string token_text(int32_t id) const override {
    if (id < 0 || static_cast<size_t>(id) >= texts_.size()) return {};
    return texts_[id];
  }
  int32_t vocab_size() const override { return static_cast<int32_t>(texts_.size()); }
  std::optional<int32_t> bos_id() const override { return spec_.bos; }
  std::vector<int32_t> eos_ids() const override { return spec_.eos; }
  std::optional<int32_t> token_id(std::string_view token) const override {
    if (auto it = added_ids_.find(std::string(token)); it != added_ids_.end()) return it->second;
    if (auto it = vocab_.find(std::string(token)); it != vocab_.end()) return it->second;
    if (auto it = vocab_.find(to_byte_level(token)); it != vocab_.end()) return it->second;
    return std::nullopt;
  }

 private:
  static constexpr int32_t kNoToken = -1;
  struct Merge {
    int32_t rank;
    int32_t result;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  void set_text(int32_t id, std::string text) {
    if (static_cast<size_t>(id) >= texts_.size()) texts_.resize(static_cast<size_t>(id) + 1);
    texts_[id] = std::move(text);
  }

  void index_merges(std::string_view source) {
    merges_.reserve(spec_.merges.size());
    for (size_t rank = 0; rank < spec_.merges.size(); ++rank) {
      const auto& [left, right] = spec_.merges[rank];
      const auto a = vocab_.find(left), b = vocab_.find(right), ab = vocab_.find(left + right);
      if (a == vocab_.end() || b == vocab_.end() || ab == vocab_.end())
        fail(Errc::format, "[tokenizer] {}: merge {} '{} {}' names a token not in the vocabulary", source, rank, left,
             right);
      merges_.emplace(pair_key(a->second, b->second), Merge{static_cast<int32_t>(rank), ab->second});
    }
  }

  void encode_segment(std::string_view segment, std::vector<int32_t>& ids) const {
    std::string text = spec_.nfc ? nfc(segment) : std::string(segment);
    if (spec_.add_prefix_space && (text.empty() || text[0] != ' ')) text.insert(text.begin(), ' ');
    std::vector<std::string_view> pieces{text}, next;
    for (const auto& regex : regexes_) {
      next.clear();
      for (auto piece : pieces) regex.split(piece, next);
      pieces.swap(next);
    }
    for (auto piece : pieces) encode_word(piece, ids);
  }

  // Merges the bytes of one pre-token: always the lowest-ranked adjacent pair, leftmost first.
  void encode_word(std::string_view word, std::vector<int32_t>& ids) const {
    if (spec_.ignore_merges) {
      if (auto it = vocab_.find(to_byte_level(word)); it != vocab_.end()) {
        ids.push_back(it->second);
        return;
      }
    }
    const size_t n = word.size();
    std::vector<int32_t> symbol(n);
    std::vector<int64_t> prev(n), next(n);
    for (size_t i = 0; i < n; ++i) {
      symbol[i] = byte_ids_[static_cast<unsigned char>(word[i])];
      prev[i] = static_cast<int64_t>(i) - 1;
      next[i] = i + 1 < n ? static_cast<int64_t>(i + 1) : -1;
    }
    struct Candidate {
      int32_t rank;
      int64_t pos;
      int32_t left, right, result;
      bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
    auto push = [&](int64_t pos) {
      if (pos < 0 || next[pos] < 0) return;
      const auto it = merges_.find(pair_key(symbol[pos], symbol[next[pos]]));
      if (it != merges_.end()) queue.push({it->second.rank, pos, symbol[pos], symbol[next[pos]], it->second.result});
    };
    for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int64_t>(i));
    while (!queue.empty()) {
      const Candidate c = queue.top();
      queue.pop();
      // Stale when either side has merged since the candidate was queued.
      if (symbol[c.pos] != c.left || next[c.pos] < 0 || symbol[next[c.pos]] != c.right) continue;
      const int64_t gone = next[c.pos];
      symbol[c.pos] = c.result;
      symbol[gone] = kNoToken;
      next[c.pos] = next[gone];
      if (next[gone] >= 0) prev[next[gone]] = c.pos;
      push(prev[c.pos]);
      push(c.pos);
    }
    for (int64_t i = n ? 0 : -1; i >= 0; i = next[i])
      if (symbol[i] != kNoToken) ids.push_back(symbol[i]);
  }

  BpeSpec spec_;
  std::unordered_map<std::string, int32_t> vocab_;
  std::unordered_map<std::string, int32_t> added_ids_;
  std::unordered_map<uint64_t, Merge> merges_;
  std::vector<std::string> texts_;  // decoded bytes of each id
  std::array<int32_t, 256> byte_ids_{};
  LiteralMatcher special_, normal_added_;
  std::vector<Regex> regexes_;
};

}  // namespace

std::unique_ptr<Tokenizer> make_bpe_tokenizer(BpeSpec spec, std::string_view source) {
  return std::make_unique<BpeTokenizer>(std::move(spec), source);
}

namespace {

using nlohmann::json;

// The largest tokenizer.json files (256k-entry vocabularies with their merges) are tens of MiB.
constexpr uint64_t kMaxTokenizerJsonBytes = 512ull << 20;

// Through the strict reader: regular files only, bounded size, and bounded nesting, which also bounds the
// recursion of read_normalizer and read_pre_tokenizer over nested "Sequence"s.
json read_json(const std::filesystem::path& path) {
  json j = io::read_json_file(path, "tokenizer", kMaxTokenizerJsonBytes);
  if (!j.is_object()) fail(Errc::format, "[tokenizer] {}: not a JSON object", path.string());
  return j;
}

[[noreturn]] void unsupported(const std::string& source, std::string_view what, const json& node) {
  fail(Errc::unsupported, "[tokenizer] {}: {} {} is not supported", source, what, node.dump().substr(0, 120));
}

void read_normalizer(const json& node, BpeSpec& spec, const std::string& source) {
  if (node.is_null()) return;
  const std::string type = node.value("type", "");
  if (type == "NFC") spec.nfc = true;
  else if (type == "Sequence")
    for (const auto& child : node.at("normalizers")) read_normalizer(child, spec, source);
  else unsupported(source, "normalizer", node);
}

// A literal split string as a PCRE2 pattern.
std::string quote_pattern(std::string_view literal) {
  std::string out;
  for (char c : literal) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && static_cast<unsigned char>(c) < 0x80) out += '\\';
    out += c;
  }
  return out;
}

void read_pre_tokenizer(const json& node, BpeSpec& spec, const std::string& source) {
  if (node.is_null()) return;
  const std::string type = node.value("type", "");
  if (type == "Sequence") {
    for (const auto& child : node.at("pretokenizers")) read_pre_tokenizer(child, spec, source);
  } else if (type == "Split") {
    if (node.value("behavior", "") != "Isolated" || node.value("invert", false)) unsupported(source, "split", node);
    const auto& pattern = node.at("pattern");
    if (pattern.contains("Regex")) spec.split_patterns.push_back(pattern.at("Regex").get<std::string>());
    else spec.split_patterns.push_back(quote_pattern(pattern.at("String").get<std::string>()));
  } else if (type == "ByteLevel") {
    spec.add_prefix_space = node.value("add_prefix_space", false);
    if (node.value("use_regex", true)) spec.split_patterns.push_back(kPatternGpt2);
  } else if (type == "Digits") {
    spec.split_patterns.push_back(node.value("individual_digits", false) ? R"(\p{N})" : R"(\p{N}+)");
  } else {
    unsupported(source, "pre-tokenizer", node);
  }
}

std::optional<std::string> token_content(const json& node) {
  if (node.is_string()) return node.get<std::string>();
  if (node.is_object() && node.contains("content")) return node.at("content").get<std::string>();
  return std::nullopt;
}

// A TemplateProcessing post-processor that starts every sequence with a special token names the BOS.
std::optional<std::string> template_bos(const json& post) {
  if (!post.is_object() || post.value("type", "") != "TemplateProcessing" || !post.contains("single")) return {};
  const auto& single = post.at("single");
  if (single.empty() || !single[0].contains("SpecialToken")) return {};
  return single[0].at("SpecialToken").at("id").get<std::string>();
}

// A token id sizes the tokenizer's tables, so it is bounded before use by what the file could list: a file of n
// bytes holds fewer than n tokens, so an id of n or more (2^31-1 in a small file) names no real token.
int32_t token_id_field(const json& id, uint64_t file_bytes, std::string_view field, const std::string& source) {
  // Integers only: nlohmann converts a float such as 1e98 to an integer without a range check (UBSan, found by
  // fuzz_tokenizer_json).
  if (!id.is_number_integer())
    fail(Errc::format, "[tokenizer] {}: {}: id {} is not an integer", source, field, id.dump());
  const auto v = id.get<int64_t>();
  if (v < 0 || static_cast<uint64_t>(v) >= file_bytes)
    fail(Errc::limit, "[tokenizer] {}: {}: id {} outside [0, {}), the file's size in bytes", source, field, v,
         file_bytes);
  return static_cast<int32_t>(v);
}

void read_model(const json& model, BpeSpec& spec, uint64_t file_bytes, const std::string& source) {
  if (model.value("type", "") != "BPE" || model.value("byte_fallback", false) ||
      !model.value("continuing_subword_prefix", "").empty() || !model.value("end_of_word_suffix", "").empty())
    unsupported(source, "model", json{{"type", model.value("type", "")}});
  spec.ignore_merges = model.value("ignore_merges", false);
  for (const auto& [token, id] : model.at("vocab").items())
    spec.vocab.emplace_back(token, token_id_field(id, file_bytes, "model.vocab", source));
  for (const auto& merge : model.at("merges")) {
    if (merge.is_array() && merge.size() == 2) {
      spec.merges.emplace_back(merge[0].get<std::string>(), merge[1].get<std::string>());
      continue;
    }
    const std::string text = merge.get<std::string>();
    const size_t space = text.find(' ');
    if (space == std::string::npos) fail(Errc::format, "[tokenizer] {}: merge '{}' has no space", source, text);
    spec.merges.emplace_back(text.substr(0, space), text.substr(space + 1));
  }
}

std::optional<int32_t> id_of(const BpeSpec& spec, const std::string& token) {
  for (const auto& added : spec.added)
    if (added.content == token) return added.id;
  for (const auto& [text, id] : spec.vocab)
    if (text == token) return id;
  return std::nullopt;
}

// Tokens that end a turn or a document in the tokenizers we know; generation stops at any of them.
constexpr std::string_view kEndTokens[] = {"<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<|end_of_text|>",
                                           "<|eom_id|>"};

void read_special_ids(const json& root, const json& config, BpeSpec& spec) {
  std::optional<std::string> bos = template_bos(root.value("post_processor", json()));
  spec.add_bos = bos.has_value();
  if (config.contains("bos_token"))
    if (auto content = token_content(config.at("bos_token"))) bos = content;
  if (config.contains("add_bos_token") && config.at("add_bos_token").is_boolean())
    spec.add_bos = config.at("add_bos_token").get<bool>();
  if (bos) spec.bos = id_of(spec, *bos);
  if (!spec.bos) spec.add_bos = false;
  auto add_eos = [&](const std::string& token) {
    const auto id = id_of(spec, token);
    if (id && std::find(spec.eos.begin(), spec.eos.end(), *id) == spec.eos.end()) spec.eos.push_back(*id);
  };
  if (config.contains("eos_token"))
    if (auto content = token_content(config.at("eos_token"))) add_eos(*content);
  for (const auto& added : spec.added)
    for (auto end : kEndTokens)
      if (added.special && added.content == end) add_eos(added.content);
}

}  // namespace

std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::filesystem::path& tokenizer_json) {
  const std::string source = tokenizer_json.string();
  const json root = read_json(tokenizer_json);
  const uint64_t file_bytes = std::filesystem::file_size(tokenizer_json);
  const auto config_path = tokenizer_json.parent_path() / "tokenizer_config.json";
  const json config = std::filesystem::exists(config_path) ? read_json(config_path) : json::object();
  BpeSpec spec;
  try {
    read_model(root.at("model"), spec, file_bytes, source);
    read_normalizer(root.value("normalizer", json()), spec, source);
    read_pre_tokenizer(root.value("pre_tokenizer", json()), spec, source);
    const json decoder = root.value("decoder", json());
    if (!decoder.is_object() || decoder.value("type", "") != "ByteLevel") unsupported(source, "decoder", decoder);
    for (const auto& added : root.value("added_tokens", json::array()))
      spec.added.push_back({token_id_field(added.at("id"), file_bytes, "added_tokens", source),
                            added.at("content").get<std::string>(), added.value("special", false)});
    read_special_ids(root, config, spec);
  } catch (const json::exception& e) {
    fail(Errc::format, "[tokenizer] {}: {}", source, e.what());
  }
  return make_bpe_tokenizer(std::move(spec), source);
}

std::optional<std::string> read_chat_template(const std::filesystem::path& tokenizer_config_json) {
  if (!std::filesystem::exists(tokenizer_config_json)) return std::nullopt;
  const json config = read_json(tokenizer_config_json);
  const auto it = config.find("chat_template");
  if (it == config.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  // A list of named templates: take the default one.
  if (it->is_array())
    for (const auto& entry : *it)
      if (entry.value("name", "") == "default" && entry.contains("template"))
        return entry.at("template").get<std::string>();
  return std::nullopt;
}

std::vector<std::string> split_patterns_for_pre(std::string_view pre) {
  if (pre == "default" || pre == "gpt2" || pre == "gpt-2" || pre.empty()) return {kPatternGpt2};
  if (pre == "llama3" || pre == "llama-v3" || pre == "llama-bpe" || pre == "falcon3") return {kPatternLlama3};
  if (pre == "qwen2" || pre == "deepseek-r1-qwen") return {kPatternQwen2};
  if (pre == "smollm") return {R"(\p{N})", kPatternGpt2};
  fail(Errc::unsupported, "[tokenizer] pre-tokenizer '{}' is not supported", pre);
}

}  // namespace lowbit::model
