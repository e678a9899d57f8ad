#include "lowbit/quant/recipe.h"

#include <fmt/ranges.h>

#include "lowbit/core/error.h"
#include "lowbit/io/json.h"

namespace lowbit::quant {

namespace {

constexpr uint64_t kMaxRecipeBytes = 1 << 20;

using nlohmann::json;

CodecChoice parse_choice(const json& j, std::string_view where) {
  if (!j.is_object()) fail(Errc::format, "{}: a codec choice must be an object", where);
  for (const auto& [key, value] : j.items())
    if (key != "codec" && key != "params") fail(Errc::format, "{}: unknown key '{}'", where, key);
  if (!j.contains("codec") || !j["codec"].is_string()) fail(Errc::format, "{}: 'codec' must be a string", where);
  CodecChoice c{j["codec"].get<std::string>(), j.value("params", json::object())};
  const codec::Codec& codec = codec::codec_or_throw(c.codec, where);
  // A representative matrix shape: parameters invalid for it are invalid for any matrix.
  const Shape probe{128, 4096};
  try {
    codec.validate(c.params, probe);
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("{}: {}", where, e.what()));
  }
  return c;
}

RecipeRule parse_rule(const json& j, std::string_view where, bool is_default) {
  if (!j.is_object()) fail(Errc::format, "{}: a rule must be an object", where);
  RecipeRule rule;
  rule.pattern = "*";
  for (const auto& [key, value] : j.items())
    if (key != "match" && key != "codec" && key != "params" && key != "candidates" && key != "padding_fallback")
      fail(Errc::format, "{}: unknown key '{}'", where, key);
  if (!is_default) {
    if (!j.contains("match") || !j["match"].is_string()) fail(Errc::format, "{}: 'match' must be a string", where);
    rule.pattern = j["match"].get<std::string>();
  }
  if (j.contains("codec")) rule.candidates.push_back(parse_choice(json{{"codec", j["codec"]}, {"params", j.value("params", json::object())}}, where));
  if (j.contains("candidates")) {
    if (!j["candidates"].is_array()) fail(Errc::format, "{}: 'candidates' must be an array", where);
    for (size_t i = 0; i < j["candidates"].size(); ++i)
      rule.candidates.push_back(parse_choice(j["candidates"][i], fmt::format("{} candidate {}", where, i)));
  }
  if (rule.candidates.empty()) fail(Errc::format, "{}: a rule needs 'codec' or 'candidates'", where);
  if (j.contains("padding_fallback"))
    rule.padding_fallback = parse_choice(j["padding_fallback"], fmt::format("{} padding_fallback", where));
  return rule;
}

json choice_json(const CodecChoice& c) { return {{"codec", c.codec}, {"params", c.params}}; }

}  // namespace

bool glob_match(std::string_view pattern, std::string_view text) {
  // Iterative wildcard match with backtracking to the last '*': linear in practice, never recursive.
  size_t p = 0, t = 0, star = std::string_view::npos, mark = 0;
  while (t < text.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == text[t])) {
      ++p;
      ++t;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = t;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      t = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

CodecChoice dense_f32() { return {"dense", json{{"dtype", "f32"}}}; }

const RecipeRule& Recipe::rule_for(std::string_view tensor_name) const {
  for (const RecipeRule& r : rules)
    if (glob_match(r.pattern, tensor_name)) return r;
  return fallback;
}

std::vector<CodecChoice> Recipe::candidates(std::string_view tensor_name, const Shape& shape) const {
  if (shape.size() != 2) return {dense_f32()};
  const RecipeRule& rule = rule_for(tensor_name);
  std::vector<CodecChoice> out = rule.candidates;
  const auto bits = [&](const CodecChoice& c) {
    return codec::bits_per_weight(codec::codec_or_throw(c.codec, tensor_name), c.params, shape);
  };
  if (rule.padding_fallback && bits(*rule.padding_fallback) < bits(out.front())) {
    std::erase(out, *rule.padding_fallback);
    out.front() = *rule.padding_fallback;
  }
  return out;
}

CodecChoice Recipe::choose(std::string_view tensor_name, const Shape& shape) const {
  return candidates(tensor_name, shape).front();
}

nlohmann::json Recipe::to_json() const {
  auto rule_json = [](const RecipeRule& r, bool is_default) {
    json j = json::object();
    if (!is_default) j["match"] = r.pattern;
    if (r.candidates.size() == 1) {
      j["codec"] = r.candidates[0].codec;
      j["params"] = r.candidates[0].params;
    } else {
      j["candidates"] = json::array();
      for (const auto& c : r.candidates) j["candidates"].push_back(choice_json(c));
    }
    if (r.padding_fallback) j["padding_fallback"] = choice_json(*r.padding_fallback);
    return j;
  };
  json j{{"name", name}, {"rotate", rotate}, {"rules", json::array()}};
  for (const RecipeRule& r : rules) j["rules"].push_back(rule_json(r, false));
  j["default"] = rule_json(fallback, true);
  if (target_linear_bpw) j["target_linear_bits_per_weight"] = *target_linear_bpw;
  return j;
}

Recipe Recipe::from_json(const nlohmann::json& j, std::string_view source) {
  if (!j.is_object()) fail(Errc::format, "[recipe] {}: must be a JSON object", source);
  for (const auto& [key, value] : j.items())
    if (key != "name" && key != "rules" && key != "default" && key != "rotate" &&
        key != "target_linear_bits_per_weight")
      fail(Errc::format, "[recipe] {}: unknown key '{}'", source, key);
  Recipe r;
  r.name = j.value("name", std::string("custom"));
  if (j.contains("rotate")) {
    if (!j["rotate"].is_boolean()) fail(Errc::format, "[recipe] {}: 'rotate' must be true or false", source);
    r.rotate = j["rotate"].get<bool>();
  }
  if (j.contains("rules")) {
    if (!j["rules"].is_array()) fail(Errc::format, "[recipe] {}: 'rules' must be an array", source);
    for (size_t i = 0; i < j["rules"].size(); ++i)
      r.rules.push_back(parse_rule(j["rules"][i], fmt::format("[recipe] {}: rule {}", source, i), false));
  }
  if (j.contains("target_linear_bits_per_weight")) {
    const json& t = j["target_linear_bits_per_weight"];
    if (!t.is_number() || !(t.get<double>() > 0))
      fail(Errc::format, "[recipe] {}: 'target_linear_bits_per_weight' must be a positive number", source);
    r.target_linear_bpw = t.get<double>();
  }
  if (!j.contains("default")) fail(Errc::format, "[recipe] {}: 'default' is required", source);
  r.fallback = parse_rule(j["default"], fmt::format("[recipe] {}: default", source), true);
  return r;
}

Recipe Recipe::load(const std::filesystem::path& path) {
  return from_json(io::read_json_file(path, "recipe", kMaxRecipeBytes), path.string());
}

}  // namespace lowbit::quant
