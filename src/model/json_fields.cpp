#include "json_fields.h"

#include <limits>

#include "lowbit/core/error.h"

namespace lowbit::model {

namespace {

const nlohmann::json* find(const nlohmann::json& j, std::string_view key) {
  const auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

const nlohmann::json& require(const nlohmann::json& j, std::string_view key, std::string_view source) {
  const nlohmann::json* v = find(j, key);
  if (!v) fail(Errc::format, "[load_model] {}: field '{}' is missing", source, key);
  return *v;
}

int64_t as_int(const nlohmann::json& v, std::string_view key, std::string_view source) {
  if (!v.is_number_integer()) fail(Errc::format, "[load_model] {}: field '{}' is not an integer", source, key);
  return v.get<int64_t>();
}

double as_number(const nlohmann::json& v, std::string_view key, std::string_view source) {
  if (!v.is_number()) fail(Errc::format, "[load_model] {}: field '{}' is not a number", source, key);
  return v.get<double>();
}

}  // namespace

int64_t json_int(const nlohmann::json& j, std::string_view key, std::string_view source) {
  return as_int(require(j, key, source), key, source);
}

int64_t json_int_or(const nlohmann::json& j, std::string_view key, int64_t fallback, std::string_view source) {
  const nlohmann::json* v = find(j, key);
  return v ? as_int(*v, key, source) : fallback;
}

double json_number(const nlohmann::json& j, std::string_view key, std::string_view source) {
  return as_number(require(j, key, source), key, source);
}

double json_number_or(const nlohmann::json& j, std::string_view key, double fallback, std::string_view source) {
  const nlohmann::json* v = find(j, key);
  return v ? as_number(*v, key, source) : fallback;
}

bool json_bool_or(const nlohmann::json& j, std::string_view key, bool fallback, std::string_view source) {
  const nlohmann::json* v = find(j, key);
  if (!v) return fallback;
  if (!v->is_boolean()) fail(Errc::format, "[load_model] {}: field '{}' is not a boolean", source, key);
  return v->get<bool>();
}

std::string json_string_or(const nlohmann::json& j, std::string_view key, std::string_view fallback,
                           std::string_view source) {
  const nlohmann::json* v = find(j, key);
  if (!v) return std::string(fallback);
  if (!v->is_string()) fail(Errc::format, "[load_model] {}: field '{}' is not a string", source, key);
  return v->get<std::string>();
}

std::vector<int32_t> json_ids(const nlohmann::json& j, std::string_view key, std::string_view source) {
  const nlohmann::json* v = find(j, key);
  std::vector<int32_t> ids;
  if (!v) return ids;
  auto add = [&](const nlohmann::json& e) {
    const int64_t id = as_int(e, key, source);
    if (id < 0 || id > std::numeric_limits<int32_t>::max())
      fail(Errc::format, "[load_model] {}: field '{}' holds id {} out of range", source, key, id);
    ids.push_back(static_cast<int32_t>(id));
  };
  if (v->is_array()) {
    for (const auto& e : *v) add(e);
  } else {
    add(*v);
  }
  return ids;
}

}  // namespace lowbit::model
