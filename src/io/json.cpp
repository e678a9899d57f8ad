#include "lowbit/io/json.h"

#include <vector>

#include "lowbit/core/error.h"
#include "lowbit/core/mapped_file.h"

namespace lowbit::io {

using nlohmann::json;

namespace {

// A library message made safe for a one-line error: printable ASCII only, bounded length.
std::string printable(std::string_view message) {
  constexpr size_t kMaxShown = 200;
  std::string out;
  for (const char c : message.substr(0, kMaxShown)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  if (message.size() > kMaxShown) out += "...";
  return out;
}

// Builds the document from nlohmann's SAX events, as its own DOM parser does, but refuses a key that the
// object being built already holds (nlohmann would keep the last value without a word) and nesting beyond
// max_depth.
class StrictDomBuilder {
 public:
  StrictDomBuilder(std::string_view op, std::string_view source, size_t max_depth)
      : op_(op), source_(source), max_depth_(max_depth) {}

  json take() { return std::move(root_); }

  bool null() { return place(nullptr); }
  bool boolean(bool v) { return place(v); }
  bool number_integer(json::number_integer_t v) { return place(v); }
  bool number_unsigned(json::number_unsigned_t v) { return place(v); }
  bool number_float(json::number_float_t v, const json::string_t&) { return place(v); }
  bool string(json::string_t& v) { return place(std::move(v)); }
  bool binary(json::binary_t& v) { return place(json::binary(v)); }

  bool start_object(size_t) { return open(json::value_t::object); }
  bool start_array(size_t) { return open(json::value_t::array); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }

  bool key(json::string_t& k) {
    auto& object = open_.back()->get_ref<json::object_t&>();
    const auto [it, fresh] = object.try_emplace(std::move(k));  // leaves k alone when it is already there
    if (!fresh) fail(Errc::duplicate, "[{}] {}: key {} appears twice in one object", op_, source_, quote(k));
    slot_ = &it->second;
    return true;
  }

  bool parse_error(size_t, const std::string&, const json::exception& e) {
    fail(Errc::format, "[{}] {}: invalid JSON: {}", op_, source_, printable(e.what()));
  }

 private:
  // Puts a value where the parser is: the root, the end of the open array, or the slot of the last key.
  json* put(json&& v) {
    if (open_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    if (json& parent = *open_.back(); parent.is_array()) {
      auto& array = parent.get_ref<json::array_t&>();
      array.push_back(std::move(v));
      return &array.back();
    }
    *slot_ = std::move(v);
    return slot_;
  }

  bool place(json&& v) {
    put(std::move(v));
    return true;
  }

  bool open(json::value_t kind) {
    if (open_.size() >= max_depth_)
      fail(Errc::limit, "[{}] {}: JSON nested deeper than {} levels", op_, source_, max_depth_);
    open_.push_back(put(json(kind)));
    return true;
  }

  bool close() {
    open_.pop_back();
    return true;
  }

  std::string_view op_;
  std::string_view source_;
  size_t max_depth_;
  json root_;
  std::vector<json*> open_;  // arrays and objects being filled, innermost last
  json* slot_ = nullptr;     // where the value after the last key goes
};

}  // namespace

json parse_json(std::string_view text, std::string_view op, std::string_view source, size_t max_depth) {
  // nlohmann stops at a NUL byte as if the input ended there; JSON allows none outside escapes.
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos)
    fail(Errc::format, "[{}] {}: invalid JSON: NUL byte at offset {}", op, source, nul);
  StrictDomBuilder builder(op, source, max_depth);
  try {
    json::sax_parse(text.begin(), text.end(), &builder, json::input_format_t::json, /*strict=*/true,
                    /*ignore_comments=*/false);
    return builder.take();
  } catch (const json::exception& e) {
    fail(Errc::format, "[{}] {}: invalid JSON: {}", op, source, printable(e.what()));
  }
}

json read_json_file(const std::filesystem::path& path, std::string_view op, uint64_t max_bytes, size_t max_depth) {
  const MappedFile file = MappedFile::open(path);
  if (file.size() > max_bytes)
    fail(Errc::limit, "[{}] {}: {} bytes, more than the {} allowed", op, path.string(), file.size(), max_bytes);
  const auto bytes = file.bytes();
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  return parse_json(text, op, path.string(), max_depth);
}

std::string quote(std::string_view s) {
  constexpr size_t kMaxShown = 120;
  const bool cut = s.size() > kMaxShown;
  std::string shown = json(std::string(s.substr(0, kMaxShown))).dump(-1, ' ', false, json::error_handler_t::replace);
  if (cut) shown += "...";
  return shown;
}

std::string_view json_kind(const json& value) {
  switch (value.type()) {
    case json::value_t::null: return "null";
    case json::value_t::object: return "object";
    case json::value_t::array: return "array";
    case json::value_t::string: return "string";
    case json::value_t::boolean: return "boolean";
    case json::value_t::number_integer: return "negative integer";
    case json::value_t::number_unsigned: return "integer";
    case json::value_t::number_float: return "number";
    case json::value_t::binary: return "binary";
    case json::value_t::discarded: return "discarded";
  }
  return "unknown";
}

}  // namespace lowbit::io
