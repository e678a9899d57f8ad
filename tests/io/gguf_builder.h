// Test helper: writes GGUF images field by field (tests/io and tests/model build files with it).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lowbit/io/gguf.h"

namespace lowbit::io {

class GgufBuilder {
 public:
  explicit GgufBuilder(uint32_t version = 3) { version_ = version; }

  template <class T>
  static void put(std::vector<uint8_t>& out, T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    out.insert(out.end(), p, p + sizeof(T));
  }
  static void put_string(std::vector<uint8_t>& out, std::string_view s) {
    put<uint64_t>(out, s.size());
    out.insert(out.end(), s.begin(), s.end());
  }

  // A key-value pair whose value bytes (after the type) are given raw.
  void kv(std::string_view key, GgufValueType type, std::vector<uint8_t> value) {
    put_string(kv_, key);
    put<uint32_t>(kv_, static_cast<uint32_t>(type));
    kv_.insert(kv_.end(), value.begin(), value.end());
    ++n_kv_;
  }
  template <class T>
  void kv_scalar(std::string_view key, GgufValueType type, T v) {
    std::vector<uint8_t> bytes;
    put(bytes, v);
    kv(key, type, bytes);
  }
  void kv_string(std::string_view key, std::string_view s) {
    std::vector<uint8_t> bytes;
    put_string(bytes, s);
    kv(key, GgufValueType::string, bytes);
  }
  void kv_strings(std::string_view key, const std::vector<std::string>& items) {
    std::vector<uint8_t> bytes;
    put<uint32_t>(bytes, static_cast<uint32_t>(GgufValueType::string));
    put<uint64_t>(bytes, items.size());
    for (const auto& s : items) put_string(bytes, s);
    kv(key, GgufValueType::array, bytes);
  }

  template <class T>
  void kv_array(std::string_view key, GgufValueType element_type, const std::vector<T>& items) {
    std::vector<uint8_t> bytes;
    put<uint32_t>(bytes, static_cast<uint32_t>(element_type));
    put<uint64_t>(bytes, items.size());
    for (const T& v : items) put(bytes, v);
    kv(key, GgufValueType::array, bytes);
  }

  // A tensor with the given ggml dims and raw data, placed at the next aligned offset (or at `offset`).
  void tensor(std::string_view name, std::vector<uint64_t> ne, GgmlType type, std::vector<uint8_t> data,
              std::optional<uint64_t> offset = std::nullopt) {
    const uint64_t at = offset.value_or((data_.size() + alignment - 1) / alignment * alignment);
    put_string(infos_, name);
    put<uint32_t>(infos_, static_cast<uint32_t>(ne.size()));
    for (auto d : ne) put<uint64_t>(infos_, d);
    put<uint32_t>(infos_, static_cast<uint32_t>(type));
    put<uint64_t>(infos_, at);
    if (data_.size() < at + data.size()) data_.resize(at + data.size());
    std::copy(data.begin(), data.end(), data_.begin() + static_cast<std::ptrdiff_t>(at));
    ++n_tensors_;
  }

  std::vector<uint8_t> build() const {
    std::vector<uint8_t> out = {'G', 'G', 'U', 'F'};
    put<uint32_t>(out, version_);
    put<uint64_t>(out, n_tensors_);
    put<uint64_t>(out, n_kv_);
    out.insert(out.end(), kv_.begin(), kv_.end());
    out.insert(out.end(), infos_.begin(), infos_.end());
    out.resize((out.size() + alignment - 1) / alignment * alignment);
    out.insert(out.end(), data_.begin(), data_.end());
    return out;
  }

  uint32_t alignment = 32;

 private:
  uint32_t version_;
  uint64_t n_tensors_ = 0, n_kv_ = 0;
  std::vector<uint8_t> kv_, infos_, data_;
};

}  // namespace lowbit::io
