// The attention key/value cache of one sequence: f32, [layer][position][kv_dim] for keys and for values.
#pragma once

#include <cstdint>
#include <vector>

#include "lowbit/model/config.h"

namespace lowbit::model {

class KvCache {
 public:
  // Room for `capacity` positions (at most config.max_seq); allocation size is overflow-checked.
  KvCache(const ModelConfig& config, int64_t capacity);
  int64_t capacity() const { return capacity_; }
  float* key(int64_t layer, int64_t pos) { return keys_.data() + offset(layer, pos); }
  float* value(int64_t layer, int64_t pos) { return values_.data() + offset(layer, pos); }
  const float* key(int64_t layer, int64_t pos) const { return keys_.data() + offset(layer, pos); }
  const float* value(int64_t layer, int64_t pos) const { return values_.data() + offset(layer, pos); }

 private:
  size_t offset(int64_t layer, int64_t pos) const {
    return static_cast<size_t>((layer * capacity_ + pos) * kv_dim_);
  }
  int64_t capacity_ = 0, kv_dim_ = 0;
  std::vector<float> keys_, values_;
};

}  // namespace lowbit::model
