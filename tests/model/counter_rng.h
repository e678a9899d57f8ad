// The counter-based generator of scripts/counter_rng.py, from which fixture scripts draw random weights and inputs
// that the tests then make here instead of committing them: element i of the stream `name` is
// splitmix64(fnv1a64(name) ^ seed + i); unif and sym are exact in fp32 (one rounding each, no FMA at x86-64-v2), so
// the values equal the script's bit for bit.
#pragma once

#include <cstdint>
#include <string_view>

namespace lowbit::model::testing {

class CounterRng {
 public:
  constexpr explicit CounterRng(uint64_t seed) : seed_(seed) {}

  // The key of the stream `name`: fnv1a64(name) ^ seed.
  constexpr uint64_t key(std::string_view name) const {
    uint64_t h = 0xCBF29CE484222325ull;
    for (unsigned char c : name) h = (h ^ c) * 0x100000001B3ull;
    return h ^ seed_;
  }
  static constexpr uint64_t at(uint64_t key, uint64_t i) {
    uint64_t z = key + i + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in (0, 1): (2 * (x >> 41) + 1) * 2^-24, an odd 24-bit numerator.
  static float unif(uint64_t key, uint64_t i) { return static_cast<float>((at(key, i) >> 41) * 2 + 1) * 0x1p-24f; }
  // Uniform in (-amp, amp).
  static float sym(uint64_t key, uint64_t i, float amp) { return (unif(key, i) * 2.0f - 1.0f) * amp; }

  uint64_t at(std::string_view name, uint64_t i) const { return at(key(name), i); }
  float unif(std::string_view name, uint64_t i) const { return unif(key(name), i); }
  float sym(std::string_view name, uint64_t i, float amp) const { return sym(key(name), i, amp); }

 private:
  uint64_t seed_;
};

}  // namespace lowbit::model::testing
