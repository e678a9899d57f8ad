// The llama2.c tokenizer, encoding exactly as run.c's encode() and decoding as its decode().
#include <cstring>
#include <queue>
#include <unordered_map>

#include "lowbit/core/error.h"
#include "lowbit/core/mapped_file.h"
#include "lowbit/model/llama2c.h"

namespace lowbit::model {

namespace {

constexpr int32_t kBos = 1, kEos = 2;
constexpr int32_t kFirstByteToken = 3;  // <0x00>; run.c's byte fallback is byte + 3
constexpr size_t kMaxTokens = 1 << 22;
constexpr int32_t kMaxTokenBytes = 1 << 16;

class Llama2cTokenizer final : public Tokenizer {
 public:
  explicit Llama2cTokenizer(const std::filesystem::path& path) {
    const std::string source = path.string();
    const MappedFile file = MappedFile::open(path);
    const auto bytes = file.bytes();
    size_t off = 0;
    auto read_i32 = [&](std::string_view what) {
      int32_t v;
      if (bytes.size() - off < sizeof v) fail(Errc::truncated, "[load_tokenizer] {}: file ends inside {}", source, what);
      std::memcpy(&v, bytes.data() + off, sizeof v);
      off += sizeof v;
      return v;
    };
    read_i32("max_token_length");
    while (off < bytes.size()) {
      if (pieces_.size() >= kMaxTokens) fail(Errc::limit, "[load_tokenizer] {}: more than {} tokens", source, kMaxTokens);
      float score;
      const int32_t bits = read_i32("a token score");
      std::memcpy(&score, &bits, sizeof score);
      const int32_t len = read_i32("a token length");
      if (len < 0 || len > kMaxTokenBytes || static_cast<size_t>(len) > bytes.size() - off)
        fail(Errc::format, "[load_tokenizer] {}: token {} has length {} beyond the file", source, pieces_.size(), len);
      pieces_.emplace_back(reinterpret_cast<const char*>(bytes.data() + off), static_cast<size_t>(len));
      scores_.push_back(score);
      off += static_cast<size_t>(len);
    }
    if (pieces_.size() < kFirstByteToken + 256)
      fail(Errc::format, "[load_tokenizer] {}: {} tokens, fewer than the 3 control and 256 byte tokens", source,
           pieces_.size());
    for (size_t i = 0; i < pieces_.size(); ++i) lookup_.emplace(pieces_[i], static_cast<int32_t>(i));
  }

  bool lists_every_row() const override { return true; }

  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool) const override {
    std::vector<int32_t> tokens;
    if (add_bos) tokens.push_back(kBos);
    if (!text.empty()) {
      if (const auto space = token_id(" ")) tokens.push_back(*space);
    }
    // Whole UTF-8 code points (at most 4 bytes) that are tokens, else their bytes.
    std::string unit;
    for (size_t i = 0; i < text.size(); ++i) {
      if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) unit.clear();
      unit += text[i];
      const bool continues = i + 1 < text.size() && (static_cast<unsigned char>(text[i + 1]) & 0xC0) == 0x80;
      if (continues && unit.size() < 4) continue;
      if (const auto id = token_id(unit)) {
        tokens.push_back(*id);
      } else {
        for (unsigned char byte : unit) tokens.push_back(kFirstByteToken + byte);
      }
      unit.clear();
    }
    merge_pairs(tokens);
    return tokens;
  }

  std::string token_text(int32_t id) const override {
    const std::string& piece = pieces_.at(static_cast<size_t>(check(id)));
    if (piece.size() == 6 && piece.starts_with("<0x") && piece[5] == '>') {
      unsigned value = 0;
      for (char ch : piece.substr(3, 2)) {
        const int digit = hex_digit(ch);
        if (digit < 0) return piece;
        value = value * 16 + static_cast<unsigned>(digit);
      }
      return std::string(1, static_cast<char>(value));
    }
    return piece;
  }

  std::string token_text_after(int32_t prev, int32_t id) const override {
    std::string text = token_text(id);
    if (prev == kBos && text.starts_with(' ')) text.erase(0, 1);
    return text;
  }

  int32_t vocab_size() const override { return static_cast<int32_t>(pieces_.size()); }
  std::optional<int32_t> bos_id() const override { return kBos; }
  std::vector<int32_t> eos_ids() const override { return {kEos, kBos}; }
  std::optional<int32_t> token_id(std::string_view token) const override {
    const auto it = lookup_.find(std::string(token));
    if (it == lookup_.end()) return std::nullopt;
    return it->second;
  }

 private:
  static int hex_digit(char ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    return -1;
  }

  int32_t check(int32_t id) const {
    if (id < 0 || static_cast<size_t>(id) >= pieces_.size())
      fail(Errc::format, "[tokenizer] token id {} outside [0, {})", id, pieces_.size());
    return id;
  }

  // run.c's merge rule, repeatedly merging the adjacent pair whose concatenation is the best-scoring token
  // (leftmost on ties, never a score <= -1e10), computed with a heap over a linked list instead of run.c's
  // rescans so that long texts encode in O(n log n).
  void merge_pairs(std::vector<int32_t>& tokens) const {
    struct Node {
      int32_t id;
      int prev, next;
      uint32_t version = 0;
    };
    struct Candidate {
      float score;
      int left, right;
      uint32_t left_version, right_version;
      int32_t merged;
      bool operator<(const Candidate& o) const { return score < o.score || (score == o.score && left > o.left); }
    };
    const int n = static_cast<int>(tokens.size());
    std::vector<Node> nodes(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) nodes[i] = {tokens[i], i - 1, i + 1 < n ? i + 1 : -1};
    std::priority_queue<Candidate> heap;
    const auto consider = [&](int left) {
      if (left < 0 || nodes[left].next < 0) return;
      const int right = nodes[left].next;
      const auto id = token_id(pieces_[nodes[left].id] + pieces_[nodes[right].id]);
      if (id && scores_[*id] > -1e10f)
        heap.push({scores_[*id], left, right, nodes[left].version, nodes[right].version, *id});
    };
    for (int i = 0; i + 1 < n; ++i) consider(i);
    std::vector<bool> alive(static_cast<size_t>(n), true);
    while (!heap.empty()) {
      const Candidate c = heap.top();
      heap.pop();
      if (!alive[c.left] || !alive[c.right] || nodes[c.left].next != c.right ||
          nodes[c.left].version != c.left_version || nodes[c.right].version != c.right_version)
        continue;  // stale: one side was merged since
      Node& left = nodes[c.left];
      left.id = c.merged;
      ++left.version;
      alive[c.right] = false;
      left.next = nodes[c.right].next;
      if (left.next >= 0) nodes[left.next].prev = c.left;
      consider(left.prev);
      consider(c.left);
    }
    tokens.clear();
    for (int i = n > 0 ? 0 : -1; i >= 0; i = nodes[i].next) tokens.push_back(nodes[i].id);
  }

  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::unordered_map<std::string, int32_t> lookup_;
};

}  // namespace

std::unique_ptr<Tokenizer> load_llama2c_tokenizer(const std::filesystem::path& path) {
  return std::make_unique<Llama2cTokenizer>(path);
}

}  // namespace lowbit::model
