// Strict JSON for files lowbit reads from outside: nlohmann::json keeps the last of two equal keys without a
// word, so an object that says one thing to lowbit and another to a different tool would pass. These helpers
// reject repeated keys, bound nesting depth and file size, and turn every parse failure into a one-line
// lowbit::Error naming the operation and the file: "[op] source: ...".
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace lowbit::io {

inline constexpr size_t kJsonMaxDepth = 64;

// Parses `text` as exactly one JSON value (surrounding whitespace allowed, comments not). Throws Errc::format on
// a syntax error, Errc::duplicate on a key repeated within one object, Errc::limit beyond `max_depth` nested
// arrays or objects.
nlohmann::json parse_json(std::string_view text, std::string_view op, std::string_view source,
                          size_t max_depth = kJsonMaxDepth);

// Reads a regular file (symlinks refused) of at most `max_bytes` (Errc::limit beyond) and parses it as above.
nlohmann::json read_json_file(const std::filesystem::path& path, std::string_view op, uint64_t max_bytes,
                              size_t max_depth = kJsonMaxDepth);

// `s` as a quoted, escaped JSON string for error messages: never spans lines, cut after 120 bytes.
std::string quote(std::string_view s);

// "object", "array", "string", "integer", "number", ... for messages like "shape: expected array, got string".
std::string_view json_kind(const nlohmann::json& value);

}  // namespace lowbit::io
