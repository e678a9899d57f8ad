#include "lowbit/model/tokenizer_export.h"

#include <nlohmann/json.hpp>

#include <cstring>
#include <variant>

#include "lowbit/core/error.h"

namespace lowbit::model {

namespace {

using io::GgufScalar;
using io::GgufValueType;

constexpr uint32_t kGgufVersion = 3;

template <class T>
void put(std::string& out, T v) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));
  out.append(bytes, sizeof(T));
}

void put_string(std::string& out, std::string_view s) {
  put<uint64_t>(out, s.size());
  out.append(s);
}

// One scalar in the width and signedness its GGUF type names (the reader widened it into the variant).
void put_scalar(std::string& out, GgufValueType type, const GgufScalar& s, const std::string& key) {
  const auto u = [&] { return std::get<uint64_t>(s); };
  const auto i = [&] { return std::get<int64_t>(s); };
  switch (type) {
    case GgufValueType::u8: return put<uint8_t>(out, static_cast<uint8_t>(u()));
    case GgufValueType::i8: return put<int8_t>(out, static_cast<int8_t>(i()));
    case GgufValueType::u16: return put<uint16_t>(out, static_cast<uint16_t>(u()));
    case GgufValueType::i16: return put<int16_t>(out, static_cast<int16_t>(i()));
    case GgufValueType::u32: return put<uint32_t>(out, static_cast<uint32_t>(u()));
    case GgufValueType::i32: return put<int32_t>(out, static_cast<int32_t>(i()));
    case GgufValueType::u64: return put<uint64_t>(out, u());
    case GgufValueType::i64: return put<int64_t>(out, i());
    case GgufValueType::f32: return put<float>(out, static_cast<float>(std::get<double>(s)));
    case GgufValueType::f64: return put<double>(out, std::get<double>(s));
    case GgufValueType::boolean: return put<uint8_t>(out, std::get<bool>(s) ? 1 : 0);
    case GgufValueType::string: return put_string(out, std::get<std::string>(s));
    case GgufValueType::array: break;
  }
  fail(Errc::format, "[quantize] tokenizer metadata '{}': nested arrays are not GGUF", key);
}

}  // namespace

std::vector<TokenizerFile> gguf_tokenizer_files(const io::GgufFile& file) {
  constexpr std::string_view kPrefix = "tokenizer.";
  std::string kvs;
  uint64_t count = 0;
  for (const auto& [key, value] : file.header().metadata) {
    if (!key.starts_with(kPrefix)) continue;
    put_string(kvs, key);
    put<uint32_t>(kvs, static_cast<uint32_t>(value.type));
    if (value.type == GgufValueType::array) {
      put<uint32_t>(kvs, static_cast<uint32_t>(value.element_type));
      put<uint64_t>(kvs, value.array.size());
      for (const auto& item : value.array) put_scalar(kvs, value.element_type, item, key);
    } else {
      put_scalar(kvs, value.type, value.scalar, key);
    }
    ++count;
  }
  if (count == 0) return {};
  std::string gguf = "GGUF";
  put<uint32_t>(gguf, kGgufVersion);
  put<uint64_t>(gguf, 0);  // tensors
  put<uint64_t>(gguf, count);
  gguf += kvs;
  gguf.resize((gguf.size() + io::kGgufDefaultAlignment - 1) / io::kGgufDefaultAlignment * io::kGgufDefaultAlignment);
  std::vector<TokenizerFile> out{{"tokenizer.gguf", std::move(gguf)}};
  if (const auto tmpl = file.get_string("tokenizer.chat_template"))
    out.push_back({"tokenizer_config.json", nlohmann::json{{"chat_template", *tmpl}}.dump(2) + "\n"});
  return out;
}

}  // namespace lowbit::model
