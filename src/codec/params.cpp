#include "lowbit/codec/params.h"

#include <algorithm>

#include "lowbit/core/error.h"

namespace lowbit::codec {

ParamReader::ParamReader(const Params& params, std::string_view codec_id) : params_(params), codec_(codec_id) {
  if (!params_.is_object()) fail(Errc::codec_params, "[{}] params must be a JSON object", codec_);
}

const Params* ParamReader::find(std::string_view key) {
  seen_.emplace(key);
  auto it = params_.find(std::string(key));
  return it == params_.end() ? nullptr : &*it;
}

int64_t ParamReader::integer_in_or(std::string_view key, int64_t fallback, int64_t lo, int64_t hi) {
  const Params* v = find(key);
  if (!v) return fallback;
  if (!v->is_number_integer()) fail(Errc::codec_params, "[{}] param '{}' must be an integer", codec_, key);
  const int64_t x = v->get<int64_t>();
  if (x < lo || x > hi) fail(Errc::codec_params, "[{}] param '{}' = {} outside [{}, {}]", codec_, key, x, lo, hi);
  return x;
}

int64_t ParamReader::integer_in(std::string_view key, int64_t lo, int64_t hi) {
  if (!params_.contains(std::string(key))) fail(Errc::codec_params, "[{}] param '{}' is required", codec_, key);
  return integer_in_or(key, 0, lo, hi);
}

int64_t ParamReader::integer_or(std::string_view key, int64_t fallback, std::initializer_list<int64_t> allowed) {
  const Params* v = find(key);
  if (!v) return fallback;
  if (!v->is_number_integer()) fail(Errc::codec_params, "[{}] param '{}' must be an integer", codec_, key);
  const int64_t x = v->get<int64_t>();
  if (std::find(allowed.begin(), allowed.end(), x) == allowed.end())
    fail(Errc::codec_params, "[{}] param '{}' = {} is not an allowed value", codec_, key, x);
  return x;
}

int64_t ParamReader::integer(std::string_view key, std::initializer_list<int64_t> allowed) {
  if (!params_.contains(std::string(key))) fail(Errc::codec_params, "[{}] param '{}' is required", codec_, key);
  return integer_or(key, 0, allowed);
}

std::string ParamReader::choice_or(std::string_view key, std::string_view fallback,
                                   std::initializer_list<std::string_view> allowed) {
  const Params* v = find(key);
  if (!v) return std::string(fallback);
  if (!v->is_string()) fail(Errc::codec_params, "[{}] param '{}' must be a string", codec_, key);
  const auto x = v->get<std::string>();
  if (std::find(allowed.begin(), allowed.end(), x) == allowed.end())
    fail(Errc::codec_params, "[{}] param '{}' = '{}' is not an allowed value", codec_, key, x);
  return x;
}

std::string ParamReader::choice(std::string_view key, std::initializer_list<std::string_view> allowed) {
  if (!params_.contains(std::string(key))) fail(Errc::codec_params, "[{}] param '{}' is required", codec_, key);
  return choice_or(key, "", allowed);
}

bool ParamReader::boolean_or(std::string_view key, bool fallback) {
  const Params* v = find(key);
  if (!v) return fallback;
  if (!v->is_boolean()) fail(Errc::codec_params, "[{}] param '{}' must be true or false", codec_, key);
  return v->get<bool>();
}

int64_t ParamReader::padded_cols(int64_t cols, int64_t multiple) {
  const int64_t expected = round_up(cols, multiple);
  const int64_t got = integer_in_or("padded_cols", expected, 0, INT64_MAX / 2);
  if (got != expected)
    fail(Errc::codec_params, "[{}] param 'padded_cols' = {} but {} columns pad to {}", codec_, got, cols,
         expected);
  return expected;
}

void ParamReader::finish() {
  for (const auto& [key, value] : params_.items())
    if (!seen_.contains(key)) fail(Errc::codec_params, "[{}] unknown param '{}'", codec_, key);
}

DType scale_dtype_from_name(std::string_view name) {
  if (name == "bf16") return DType::BF16;
  if (name == "f16") return DType::F16;
  if (name == "f32") return DType::F32;
  fail(Errc::codec_params, "[codec] unknown scale dtype '{}'", name);
}

}  // namespace lowbit::codec
