// SentencePiece tokenizers through libsentencepiece: model files as they are, and GGUF "llama" vocabularies
// rebuilt into a ModelProto (written here in protobuf wire format, so no protobuf dependency is needed).
#include <sentencepiece_processor.h>

#include <cctype>
#include <cstring>

#include "lowbit/core/error.h"
#include "lowbit/core/mapped_file.h"
#include "lowbit/model/tokenizers.h"
#include "tokenizer_util.h"

namespace lowbit::model {
namespace {

constexpr int32_t kTypeUnknown = 2, kTypeControl = 3, kTypeUserDefined = 4, kTypeByte = 6;

// What a SentencePieceProcessor does not tell: which pieces are user-defined (libsentencepiece has no
// IsUserDefined) and whether text gets a space in front.
struct SpmOptions {
  std::vector<int32_t> user_defined;
  bool add_space_prefix = true;
};

class SpmTokenizer final : public Tokenizer {
 public:
  // options.add_space_prefix: whether a space goes before the text (before each run of text after a special
  // token), as SentencePiece's add_dummy_prefix and llama.cpp's tokenizer.ggml.add_space_prefix say (Gemma: no).
  SpmTokenizer(std::unique_ptr<sentencepiece::SentencePieceProcessor> sp, std::optional<int32_t> bos,
               std::vector<int32_t> eos, bool add_bos, const SpmOptions& options)
      : sp_(std::move(sp)), bos_(bos), eos_(std::move(eos)), add_bos_(add_bos),
        add_space_prefix_(options.add_space_prefix) {
    const int n = sp_->GetPieceSize();
    texts_.resize(static_cast<size_t>(n));
    // User-defined pieces are matched in the raw text before SentencePiece sees it, whether special tokens are
    // parsed or not (llama.cpp's tokenizer_st_partition, HF's added tokens): Gemma's runs of newlines, spaces and
    // tabs and its HTML tags, which SentencePiece would never match once it has escaped the spaces.
    for (int32_t id : options.user_defined) {
      special_.add(sp_->IdToPiece(id), id);
      user_defined_.add(sp_->IdToPiece(id), id);
    }
    for (int id = 0; id < n; ++id) {
      const std::string& piece = sp_->IdToPiece(id);
      if (sp_->IsControl(id)) {
        special_.add(piece, id);
      } else if (sp_->IsByte(id)) {
        texts_[id] = std::string(1, static_cast<char>(std::stoi(piece.substr(3, 2), nullptr, 16)));
      } else {
        texts_[id] = sp_->IsUnknown(id) ? std::string(" \xE2\x81\x87 ") : replace_spaces(piece);
      }
    }
  }

  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special) const override {
    std::vector<int32_t> ids;
    if (add_bos && add_bos_ && bos_) ids.push_back(*bos_);
    auto on_text = [&](std::string_view segment) {
      for (int id : sp_->EncodeAsIds(segment)) ids.push_back(id);
    };
    auto on_token = [&](int32_t id) { ids.push_back(id); };
    (parse_special ? special_ : user_defined_).split(text, on_text, on_token);
    return ids;
  }

  std::string token_text(int32_t id) const override {
    if (id < 0 || static_cast<size_t>(id) >= texts_.size()) return {};
    return texts_[id];
  }
  // The dummy-prefix space of a stream's first piece (at the start or right after BOS) is not part of the text.
  std::string token_text_after(int32_t prev, int32_t id) const override {
    std::string text = token_text(id);
    if (add_space_prefix_ && (prev < 0 || prev == bos_) && !text.empty() && text[0] == ' ' && !sp_->IsByte(id))
      text.erase(0, 1);
    return text;
  }
  int32_t vocab_size() const override { return static_cast<int32_t>(texts_.size()); }
  std::optional<int32_t> bos_id() const override { return bos_; }
  std::vector<int32_t> eos_ids() const override { return eos_; }
  std::optional<int32_t> token_id(std::string_view token) const override {
    const int id = sp_->PieceToId(token);
    if (id == sp_->unk_id() && token != sp_->IdToPiece(id)) return std::nullopt;
    return id;
  }

 private:
  // "▁" (U+2581) marks a space in SentencePiece pieces.
  static std::string replace_spaces(const std::string& piece) {
    std::string out;
    for (size_t i = 0; i < piece.size();) {
      if (piece.compare(i, 3, "\xE2\x96\x81") == 0) {
        out += ' ';
        i += 3;
      } else {
        out += piece[i++];
      }
    }
    return out;
  }

  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::optional<int32_t> bos_;
  std::vector<int32_t> eos_;
  bool add_bos_;
  bool add_space_prefix_;
  std::vector<std::string> texts_;
  detail::LiteralMatcher special_;       // control and user-defined pieces
  detail::LiteralMatcher user_defined_;
};

// Protobuf wire format reading with every length checked against what is left: lowbit looks at a SentencePiece
// model before libsentencepiece does, since the library trusts the tables it loads.
class ProtoReader {
 public:
  ProtoReader(std::string_view bytes, std::string_view source, std::string_view what)
      : rest_(bytes), source_(source), what_(what) {}

  // Reads the next field's key; false at the end of the message.
  bool next() {
    if (rest_.empty()) return false;
    const uint64_t key = varint();
    field_ = key >> 3;
    wire_ = static_cast<int>(key & 7);
    return true;
  }
  uint64_t field() const { return field_; }

  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      const auto byte = static_cast<uint8_t>(take(1)[0]);
      v |= static_cast<uint64_t>(byte & 0x7F) << shift;
      if (!(byte & 0x80)) return v;
    }
    broken("a varint longer than 10 bytes");
  }
  std::string_view bytes() {
    expect(2);
    return take(varint());
  }
  float fixed32() {
    expect(5);
    float f;
    std::memcpy(&f, take(4).data(), 4);
    return f;
  }
  uint64_t varint_field() {
    expect(0);
    return varint();
  }
  void skip() {
    switch (wire_) {
      case 0: varint(); return;
      case 1: take(8); return;
      case 2: take(varint()); return;
      case 5: take(4); return;
      default: broken(fmt::format("field {} has wire type {}", field_, wire_));
    }
  }

 private:
  void expect(int wire) {
    if (wire_ != wire) broken(fmt::format("field {} has wire type {}, expected {}", field_, wire_, wire));
  }
  std::string_view take(uint64_t n) {
    if (n > rest_.size()) broken(fmt::format("field {} runs {} bytes past the end", field_, n - rest_.size()));
    const std::string_view out = rest_.substr(0, n);
    rest_.remove_prefix(n);
    return out;
  }
  [[noreturn]] void broken(const std::string& why) const {
    fail(Errc::format, "[tokenizer] {}: {}: {}", source_, what_, why);
  }

  std::string_view rest_;
  std::string_view source_, what_;
  uint64_t field_ = 0;
  int wire_ = 0;
};

void check_piece(std::string_view piece, int64_t type, std::string_view source) {
  if (type < 1 || type > 6) fail(Errc::format, "[tokenizer] {}: piece '{}' has type {}", source, piece, type);
  if (piece.empty()) fail(Errc::format, "[tokenizer] {}: an empty piece", source);
  // libsentencepiece puts pieces into a darts-clone trie as C strings: a NUL cuts the key (one at the start made
  // it empty, and darts threw out of the library: fuzz_sentencepiece, CI 2026-12-04).
  if (piece.find('\0') != std::string_view::npos)
    fail(Errc::format, "[tokenizer] {}: piece '{}' holds a NUL byte", source, printable(piece));
  const auto hex = [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; };
  if (type == kTypeByte &&
      (piece.size() != 6 || piece.substr(0, 3) != "<0x" || !hex(piece[3]) || !hex(piece[4]) || piece[5] != '>'))
    fail(Errc::format, "[tokenizer] {}: byte piece '{}' is not <0xXX>", source, piece);
}

// A darts-clone double array unit (the trie of a precompiled charsmap), as libsentencepiece reads it.
struct DartsUnit {
  uint32_t bits;
  bool has_leaf() const { return (bits >> 8) & 1; }
  uint32_t value() const { return bits & 0x7FFFFFFF; }
  uint32_t label() const { return bits & (0x80000000u | 0xFF); }
  uint32_t offset() const { return (bits >> 10) << ((bits & (1u << 9)) >> 6); }
};

// A NormalizerSpec's precompiled_charsmap: [u32 trie bytes][darts trie][NUL-terminated replacement strings].
// libsentencepiece walks the trie from the root for every input byte and reads the replacement at a leaf's value,
// all unchecked; this walks every node any input can reach and checks each read stays inside the blob.
void check_charsmap(std::string_view blob, std::string_view source) {
  constexpr size_t kMaxCharsmapBytes = 16 << 20;
  if (blob.size() > kMaxCharsmapBytes)
    fail(Errc::limit, "[tokenizer] {}: precompiled_charsmap of {} bytes, more than {}", source, blob.size(),
         kMaxCharsmapBytes);
  if (blob.size() < 4) fail(Errc::format, "[tokenizer] {}: precompiled_charsmap of {} bytes", source, blob.size());
  uint32_t trie_bytes;
  std::memcpy(&trie_bytes, blob.data(), 4);
  if (trie_bytes > blob.size() - 4 || trie_bytes % 4 != 0 || trie_bytes == 0)
    fail(Errc::format, "[tokenizer] {}: precompiled_charsmap: trie of {} bytes in a blob of {}", source, trie_bytes,
         blob.size());
  std::vector<DartsUnit> units(trie_bytes / 4);
  std::memcpy(units.data(), blob.data() + 4, trie_bytes);
  const std::string_view replacements = blob.substr(4 + trie_bytes);
  const auto broken = [&](uint64_t node, std::string_view why) {
    fail(Errc::format, "[tokenizer] {}: precompiled_charsmap: trie node {} {}", source, node, why);
  };
  // A base is where a node's children sit: child for byte c at base ^ c, so a base needs all 256 slots inside.
  std::vector<bool> seen(units.size());
  std::vector<uint32_t> bases{units[0].offset()};
  while (!bases.empty()) {
    const uint32_t base = bases.back();
    bases.pop_back();
    if ((uint64_t{base} | 0xFF) >= units.size()) broken(base, "has children outside the trie");
    if (seen[base]) continue;
    seen[base] = true;
    for (uint32_t c = 0; c < 256; ++c) {
      const uint32_t node = base ^ c;
      if (units[node].label() != c) continue;
      const uint32_t next = node ^ units[node].offset();
      if (units[node].has_leaf()) {
        if (next >= units.size()) broken(node, "has its value outside the trie");
        const uint32_t at = units[next].value();
        if (at >= replacements.size() || replacements.find('\0', at) == std::string_view::npos)
          broken(node, "maps to a replacement outside the blob");
      }
      bases.push_back(next);
    }
  }
}

// sentencepiece_model.proto: ModelProto{pieces=1, normalizer_spec=3, denormalizer_spec=5};
// SentencePiece{piece=1, score=2, type=3}; NormalizerSpec{precompiled_charsmap=2}.
void check_model_proto(std::string_view proto, std::string_view source) {
  ProtoReader model(proto, source, "ModelProto");
  size_t pieces = 0;
  while (model.next()) {
    if (model.field() == 1) {
      ProtoReader entry(model.bytes(), source, "SentencePiece");
      std::string_view piece;
      int64_t type = 1;  // NORMAL when absent
      while (entry.next()) {
        if (entry.field() == 1)
          piece = entry.bytes();
        else if (entry.field() == 2)
          entry.fixed32();
        else if (entry.field() == 3)
          type = static_cast<int64_t>(entry.varint_field());
        else
          entry.skip();
      }
      check_piece(piece, type, source);
      ++pieces;
    } else if (model.field() == 3 || model.field() == 5) {
      ProtoReader spec(model.bytes(), source, "NormalizerSpec");
      while (spec.next()) {
        if (spec.field() == 2) {
          const std::string_view charsmap = spec.bytes();
          if (!charsmap.empty()) check_charsmap(charsmap, source);
        } else {
          spec.skip();
        }
      }
    } else {
      model.skip();
    }
  }
  if (pieces == 0) fail(Errc::format, "[tokenizer] {}: a SentencePiece model without pieces", source);
}

std::optional<int32_t> positive(int id) { return id >= 0 ? std::optional<int32_t>(id) : std::nullopt; }

// Protobuf wire format, just the field kinds a ModelProto needs.
class ProtoWriter {
 public:
  void varint_field(int field, uint64_t value) {
    key(field, 0);
    varint(value);
  }
  void float_field(int field, float value) {
    key(field, 5);
    char bytes[4];
    std::memcpy(bytes, &value, 4);
    out_.append(bytes, 4);
  }
  void bytes_field(int field, std::string_view value) {
    key(field, 2);
    varint(value.size());
    out_.append(value);
  }
  const std::string& bytes() const { return out_; }

 private:
  void key(int field, int wire_type) { varint(static_cast<uint64_t>(field) << 3 | wire_type); }
  void varint(uint64_t v) {
    while (v >= 0x80) {
      out_ += static_cast<char>((v & 0x7F) | 0x80);
      v >>= 7;
    }
    out_ += static_cast<char>(v);
  }
  std::string out_;
};

// sentencepiece_model.proto: ModelProto{pieces=1, trainer_spec=2, normalizer_spec=3};
// SentencePiece{piece=1, score=2, type=3}; TrainerSpec{model_type=3 (BPE=2), vocab_size=4, byte_fallback=35};
// NormalizerSpec{name=1, add_dummy_prefix=3, remove_extra_whitespaces=4, escape_whitespaces=5}.
std::string model_proto(const std::vector<SpmPiece>& pieces, bool add_space_prefix) {
  ProtoWriter model;
  bool has_bytes = false;
  for (const auto& p : pieces) {
    ProtoWriter piece;
    piece.bytes_field(1, p.piece);
    piece.float_field(2, p.score);
    piece.varint_field(3, static_cast<uint64_t>(p.type));
    model.bytes_field(1, piece.bytes());
    has_bytes |= p.type == kTypeByte;
  }
  ProtoWriter trainer;
  trainer.varint_field(3, 2);
  trainer.varint_field(4, pieces.size());
  trainer.varint_field(35, has_bytes ? 1 : 0);
  model.bytes_field(2, trainer.bytes());
  ProtoWriter normalizer;
  normalizer.bytes_field(1, "identity");
  normalizer.varint_field(3, add_space_prefix ? 1 : 0);
  normalizer.varint_field(4, 0);
  normalizer.varint_field(5, 1);
  model.bytes_field(3, normalizer.bytes());
  return model.bytes();
}

}  // namespace

std::unique_ptr<Tokenizer> load_sentencepiece(const std::filesystem::path& model_file) {
  constexpr uint64_t kMaxModelBytes = 256 << 20;
  const MappedFile file = MappedFile::open(model_file);
  if (file.size() > kMaxModelBytes)
    fail(Errc::limit, "[tokenizer] {}: {} bytes, more than the {} allowed", model_file.string(), file.size(),
         kMaxModelBytes);
  const std::string_view proto(reinterpret_cast<const char*>(file.bytes().data()), file.size());
  check_model_proto(proto, model_file.string());
  auto sp = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const auto status = sp->LoadFromSerializedProto(proto);
  if (!status.ok())
    fail(Errc::format, "[tokenizer] {}: sentencepiece cannot load it: {}", model_file.string(), status.ToString());
  const auto bos = positive(sp->bos_id());
  const auto eos = positive(sp->eos_id());
  return std::make_unique<SpmTokenizer>(std::move(sp), bos, eos ? std::vector<int32_t>{*eos} : std::vector<int32_t>{},
                                        bos.has_value(), SpmOptions{});
}

std::unique_ptr<Tokenizer> make_sentencepiece(const std::vector<SpmPiece>& pieces, std::optional<int32_t> bos,
                                              std::vector<int32_t> eos, bool add_bos, std::string_view source,
                                              bool add_space_prefix) {
  bool has_unknown = false;
  for (const auto& p : pieces) {
    check_piece(p.piece, p.type, source);
    has_unknown |= p.type == kTypeUnknown;
  }
  if (!has_unknown) fail(Errc::format, "[tokenizer] {}: no unknown-token piece", source);
  auto sp = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const auto status = sp->LoadFromSerializedProto(model_proto(pieces, add_space_prefix));
  if (!status.ok()) fail(Errc::format, "[tokenizer] {}: sentencepiece rejects the vocabulary: {}", source, status.ToString());
  for (int32_t id : eos)
    if (id < 0 || static_cast<size_t>(id) >= pieces.size()) fail(Errc::format, "[tokenizer] {}: eos id {} out of range", source, id);
  if (bos && (*bos < 0 || static_cast<size_t>(*bos) >= pieces.size()))
    fail(Errc::format, "[tokenizer] {}: bos id {} out of range", source, *bos);
  SpmOptions options{{}, add_space_prefix};
  for (size_t id = 0; id < pieces.size(); ++id)
    if (pieces[id].type == kTypeUserDefined) options.user_defined.push_back(static_cast<int32_t>(id));
  return std::make_unique<SpmTokenizer>(std::move(sp), bos, std::move(eos), add_bos && bos.has_value(), options);
}

}  // namespace lowbit::model
