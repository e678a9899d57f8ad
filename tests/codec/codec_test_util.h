// Helpers shared by the codec tests.
#pragma once

#include <gtest/gtest.h>

#include <random>
#include <string_view>
#include <vector>

#include "lowbit/codec/codec.h"
#include "lowbit/core/error.h"

namespace lowbit::codec::test_util {

// n weights from N(0, sigma^2), seeded.
inline std::vector<float> gaussian_weights(int64_t n, uint64_t seed, float sigma) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> w(static_cast<size_t>(n));
  for (float& v : w) v = normal(rng);
  return w;
}

// The stored tensor an encoder produced, as a TensorRef of codec `id`.
inline TensorRef encoded_ref(std::string_view id, const EncodedTensor& e, const Shape& shape) {
  return {&codec_or_throw(id, "test"), e.params, shape, e.views()};
}

// Runs fn and expects a lowbit::Error with exactly this code.
template <class Fn>
void expect_errc(Errc code, Fn&& fn) {
  try {
    fn();
    FAIL() << "expected " << errc_name(code);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
  }
}

}  // namespace lowbit::codec::test_util
