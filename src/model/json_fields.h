// Strict reads of config.json fields: a wrong type or an absent required key is Errc::format naming the
// file and the key.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace lowbit::model {

int64_t json_int(const nlohmann::json& j, std::string_view key, std::string_view source);
int64_t json_int_or(const nlohmann::json& j, std::string_view key, int64_t fallback, std::string_view source);
double json_number(const nlohmann::json& j, std::string_view key, std::string_view source);
double json_number_or(const nlohmann::json& j, std::string_view key, double fallback, std::string_view source);
bool json_bool_or(const nlohmann::json& j, std::string_view key, bool fallback, std::string_view source);
std::string json_string_or(const nlohmann::json& j, std::string_view key, std::string_view fallback,
                           std::string_view source);
// An integer or a list of integers (eos_token_id); absent or null: empty.
std::vector<int32_t> json_ids(const nlohmann::json& j, std::string_view key, std::string_view source);

}  // namespace lowbit::model
