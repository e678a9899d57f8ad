// The family reference fixtures (tests/model/fixtures/families/<family>/, written by
// scripts/make_family_fixtures.py): where they are, what each expects, and how logits are compared. Shared by the
// CPU test (tests/model/family_fixture_test.cpp) and the GPU test (tests/cuda/test_cuda_families.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "lowbit/io/safetensors.h"

namespace lowbit::model::testing {

inline const std::filesystem::path kFamilyFixtures =
    std::filesystem::path(LOWBIT_SOURCE_DIR) / "tests/model/fixtures/families";
// max |lowbit - transformers| / max |transformers| over all logits
inline constexpr double kFamilyTolerance = 1e-4;

inline std::vector<std::string> family_fixture_dirs() {
  std::vector<std::string> names;
  if (std::filesystem::is_directory(kFamilyFixtures))
    for (const auto& e : std::filesystem::directory_iterator(kFamilyFixtures))
      if (e.is_directory()) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

struct FamilyExpected {
  std::vector<int32_t> tokens, greedy;
  std::vector<float> logits;  // [tokens, vocab], every position of one forward over `tokens`
};

inline FamilyExpected read_family_expected(const std::filesystem::path& file) {
  const auto f = io::SafetensorsFile::open(file);
  const auto values = [&f, &file]<class T>(std::string_view name, DType dtype, T) {
    const TensorView v = f.tensor(name);
    if (v.dtype != dtype) throw std::runtime_error(file.string() + ": " + std::string(name) + " has another dtype");
    return std::vector<T>(v.as<T>(), v.as<T>() + v.bytes.size() / sizeof(T));
  };
  return {values("tokens", DType::I32, int32_t{}), values("greedy", DType::I32, int32_t{}),
          values("logits", DType::F32, float{})};
}

// The expectation a model file is checked against: expected_gguf.safetensors for a GGUF where llama.cpp reads the
// GGUF as a slightly different model (the gemmas), else expected.safetensors.
inline FamilyExpected family_expected_for(const std::filesystem::path& dir, bool gguf) {
  const auto gguf_view = dir / "expected_gguf.safetensors";
  return read_family_expected(gguf && std::filesystem::exists(gguf_view) ? gguf_view : dir / "expected.safetensors");
}

// max |a - b| / max |b|; NaN in `a` (an unwritten output) never passes a bound.
inline double max_relative_diff(std::span<const float> a, std::span<const float> b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    const double d = std::abs(static_cast<double>(a[i]) - b[i]);
    diff = std::isnan(d) ? INFINITY : std::max(diff, d);
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return diff / scale;
}

inline int32_t argmax_of(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

}  // namespace lowbit::model::testing
