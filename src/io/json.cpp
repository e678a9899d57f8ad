#include "lowbit/io/json.h"

#include <unordered_set>
#include <vector>

#include "lowbit/core/error.h"
#include "lowbit/core/mapped_file.h"

namespace lowbit::io {

using nlohmann::json;

namespace {

// Watches the parser's events: one set of keys per open object, so that a repeated key is caught before
// nlohmann overwrites the first value with the second.
class StrictParseWatcher {
 public:
  StrictParseWatcher(std::string_view op, std::string_view source, size_t max_depth)
      : op_(op), source_(source), max_depth_(max_depth) {}

  bool operator()(int depth, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        check_depth(depth);
        keys_.emplace_back();
        break;
      case json::parse_event_t::array_start:
        check_depth(depth);
        break;
      case json::parse_event_t::object_end:
        keys_.pop_back();
        break;
      case json::parse_event_t::key:
        if (!keys_.back().insert(parsed.get_ref<const std::string&>()).second)
          fail(Errc::duplicate, "[{}] {}: key {} appears twice in one object", op_, source_,
               quote(parsed.get_ref<const std::string&>()));
        break;
      default:
        break;
    }
    return true;
  }

 private:
  void check_depth(int depth) const {
    if (static_cast<size_t>(depth) >= max_depth_)
      fail(Errc::limit, "[{}] {}: JSON nested deeper than {} levels", op_, source_, max_depth_);
  }

  std::string_view op_;
  std::string_view source_;
  size_t max_depth_;
  std::vector<std::unordered_set<std::string>> keys_;
};

// A library message made safe for a one-line error: printable ASCII only, bounded length.
std::string printable(std::string_view message) {
  constexpr size_t kMaxShown = 200;
  std::string out;
  for (const char c : message.substr(0, kMaxShown)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  if (message.size() > kMaxShown) out += "...";
  return out;
}

}  // namespace

json parse_json(std::string_view text, std::string_view op, std::string_view source, size_t max_depth) {
  StrictParseWatcher watcher(op, source, max_depth);
  try {
    return json::parse(text.begin(), text.end(), std::ref(watcher), /*allow_exceptions=*/true,
                       /*ignore_comments=*/false);
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
