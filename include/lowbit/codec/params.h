// Strict reading of codec parameters: every key must be known, every value in its allowed set, and the
// error names the codec and the key.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <set>
#include <string>
#include <string_view>

#include "lowbit/codec/codec.h"

namespace lowbit::codec {

class ParamReader {
 public:
  ParamReader(const Params& params, std::string_view codec_id);

  int64_t integer(std::string_view key, std::initializer_list<int64_t> allowed);
  int64_t integer_or(std::string_view key, int64_t fallback, std::initializer_list<int64_t> allowed);
  int64_t integer_in(std::string_view key, int64_t lo, int64_t hi);  // required, lo <= v <= hi
  int64_t integer_in_or(std::string_view key, int64_t fallback, int64_t lo, int64_t hi);
  std::string choice(std::string_view key, std::initializer_list<std::string_view> allowed);
  std::string choice_or(std::string_view key, std::string_view fallback,
                        std::initializer_list<std::string_view> allowed);
  bool boolean_or(std::string_view key, bool fallback);
  // Optional "padded_cols": when present it must equal cols rounded up to `multiple`. Returns that width.
  int64_t padded_cols(int64_t cols, int64_t multiple);
  // Throws for any key not read.
  void finish();

 private:
  const Params* find(std::string_view key);
  const Params& params_;
  std::string codec_;
  std::set<std::string, std::less<>> seen_;
};

// The float dtypes scale/bias arrays may use, by parameter value.
DType scale_dtype_from_name(std::string_view name);  // "bf16" | "f16" | "f32"

inline int64_t round_up(int64_t v, int64_t multiple) { return (v + multiple - 1) / multiple * multiple; }

}  // namespace lowbit::codec
