// Strict reading of the JSON objects of an artifact's documents (manifest.json, quality.json, recipe.json): typed
// getters whose errors name the file and the field, and finish() rejecting keys that were not read. Internal to
// the artifact layer.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <string_view>

#include "lowbit/artifact/manifest.h"
#include "lowbit/core/error.h"
#include "lowbit/io/json.h"

namespace lowbit::artifact::detail {

using nlohmann::json;

inline constexpr std::string_view kManifestOp = "[manifest]";

inline bool has_control_char(std::string_view s) {
  return std::any_of(s.begin(), s.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u < 0x20 || u == 0x7f;
  });
}

inline bool is_sha256_hex(std::string_view s) {
  return s.size() == 64 &&
         std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// Strict reading of one JSON object of the manifest: typed getters whose errors name the file and the field, and
// finish() rejecting keys that were not read.
class Fields {
 public:
  Fields(const json& object, std::string_view source, std::string where, std::string_view op = kManifestOp)
      : op_(op), object_(object), source_(source), where_(std::move(where)) {
    if (!object_.is_object())
      fail(Errc::format, "{} {}: {}: must be a JSON object, got {}", op_, source_, where_.empty() ? "the document" : where_,
           io::json_kind(object_));
  }

  std::string path(std::string_view key) const { return where_.empty() ? std::string(key) : where_ + "." + std::string(key); }

  const json* optional(std::string_view key) {
    seen_.emplace(key);
    auto it = object_.find(std::string(key));
    return it == object_.end() ? nullptr : &*it;
  }

  const json& required(std::string_view key) {
    const json* v = optional(key);
    if (!v) fail(Errc::format, "{} {}: {}: required field is missing", op_, source_, path(key));
    return *v;
  }

  std::string string(std::string_view key, size_t max_bytes) {
    const json& v = required(key);
    if (!v.is_string()) fail(Errc::format, "{} {}: {}: must be a string", op_, source_, path(key));
    std::string s = v.get<std::string>();
    if (s.size() > max_bytes)
      fail(Errc::limit, "{} {}: {}: {} bytes, more than the limit {}", op_, source_, path(key), s.size(), max_bytes);
    return s;
  }

  // A printable name: non-empty, bounded, without control characters.
  std::string name(std::string_view key) {
    std::string s = string(key, kMaxNameBytes);
    check_tensor_name(s, fmt::format("{} {}: {}", op_, source_, path(key)));
    return s;
  }

  uint64_t unsigned_integer(std::string_view key) {
    const json& v = required(key);
    if (v.is_number_unsigned()) return v.get<uint64_t>();
    if (v.is_number_integer() && v.get<int64_t>() >= 0) return static_cast<uint64_t>(v.get<int64_t>());
    fail(Errc::format, "{} {}: {}: must be a non-negative integer", op_, source_, path(key));
  }

  std::string sha256(std::string_view key) {
    std::string s = string(key, 64);
    if (!is_sha256_hex(s))
      fail(Errc::format, "{} {}: {}: must be 64 lowercase hex digits", op_, source_, path(key));
    return s;
  }

  const json& object(std::string_view key) {
    const json& v = required(key);
    if (!v.is_object()) fail(Errc::format, "{} {}: {}: must be a JSON object", op_, source_, path(key));
    return v;
  }

  const json& array(std::string_view key, size_t max_items) {
    const json& v = required(key);
    if (!v.is_array()) fail(Errc::format, "{} {}: {}: must be an array", op_, source_, path(key));
    if (v.size() > max_items)
      fail(Errc::limit, "{} {}: {}: {} entries, more than the limit {}", op_, source_, path(key), v.size(),
           max_items);
    return v;
  }

  Shape shape(std::string_view key) {
    const json& v = array(key, kMaxRank);
    Shape shape;
    for (const json& d : v) {
      if (d.is_number_unsigned() && d.get<uint64_t>() > static_cast<uint64_t>(kMaxDim))
        fail(Errc::limit, "{} {}: {}: dimension {} above the limit {}", op_, source_, path(key), d.get<uint64_t>(),
             kMaxDim);
      if (!d.is_number_integer()) fail(Errc::format, "{} {}: {}: dimensions must be integers", op_, source_, path(key));
      shape.push_back(d.get<int64_t>());
    }
    checked_shape_numel(shape, fmt::format("{} {}: {}", op_, source_, path(key)));
    return shape;
  }

  DType dtype(std::string_view key) {
    const std::string name = string(key, 16);
    const auto dt = parse_dtype(name);
    if (!dt) fail(Errc::dtype, "{} {}: {}: unknown dtype '{}'", op_, source_, path(key), name);
    return *dt;
  }

  double number(std::string_view key) {
    const json& v = required(key);
    if (!v.is_number()) fail(Errc::format, "{} {}: {}: must be a number", op_, source_, path(key));
    const double d = v.get<double>();
    if (!std::isfinite(d)) fail(Errc::non_finite, "{} {}: {}: must be finite", op_, source_, path(key));
    return d;
  }

  bool boolean(std::string_view key) {
    const json& v = required(key);
    if (!v.is_boolean()) fail(Errc::format, "{} {}: {}: must be true or false", op_, source_, path(key));
    return v.get<bool>();
  }

  // A required field that may be null; returns nullptr for null.
  const json* nullable_object(std::string_view key) {
    const json& v = required(key);
    if (v.is_null()) return nullptr;
    if (!v.is_object()) fail(Errc::format, "{} {}: {}: must be a JSON object or null", op_, source_, path(key));
    return &v;
  }

  void finish() const {
    for (const auto& [key, value] : object_.items())
      if (!seen_.contains(key)) fail(Errc::format, "{} {}: {}: unknown field", op_, source_, path(key));
  }

 private:
  std::string_view op_;  // the error prefix: "[manifest]", "[verify]"
  const json& object_;
  std::string_view source_;
  std::string where_;
  std::set<std::string, std::less<>> seen_;
};

}  // namespace lowbit::artifact::detail
