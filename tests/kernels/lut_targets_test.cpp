// The offset_scale and two_plane kernels on every SIMD target this CPU runs (not only the best one the harness
// dispatches to): their layout depends on the target's lane count (8-entry and 16-entry tables in one vector, in
// two, or in a scalar array).
#include <gtest/gtest.h>
#include <fmt/format.h>
#include <hwy/targets.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/simd.h"
#include "lowbit/codec/codec.h"
#include "lowbit/core/thread_pool.h"
#include "lowbit/kernels/cpu.h"

namespace lowbit::kernels {
namespace {

using codec::Params;

struct Case {
  const char* codec;
  Params params;
};

std::vector<float> random_values(size_t n, std::mt19937& rng, float scale) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& f : v) f = normal(rng);
  return v;
}

// Restores the real target set however the test ends.
struct TargetScope {
  explicit TargetScope(int64_t target) { hwy::SetSupportedTargetsForTest(target); }
  ~TargetScope() { hwy::SetSupportedTargetsForTest(0); }
};

TEST(LutKernels, EveryTargetMatchesTheDecoder) {
  const std::vector<Case> cases = {
      {"offset_scale", {{"precision", "q3"}}},
      {"offset_scale", {{"precision", "q3_full8"}}},
      {"offset_scale", {{"precision", "q4"}}},
      {"two_plane", {{"storage", "quint5"}, {"metadata", "full"}, {"scale_dtype", "bf16"}}},
      {"two_plane", {{"storage", "planes"}, {"metadata", "slim"}, {"scale_dtype", "f32"}}},
  };
  ThreadPool pool(2);
  std::mt19937 rng(7);
  for (const int64_t target : hwy::SupportedAndGeneratedTargets()) {
    const TargetScope scope(target);
    for (const Case& c : cases) {
      const codec::Codec& codec = codec::codec_or_throw(c.codec, "test");
      const int64_t rows = 6, cols = 300;
      const auto w = random_values(static_cast<size_t>(rows * cols), rng, 0.05f);
      const auto e = codec.encode(c.params, {rows, cols}, w.data(), {});
      const codec::TensorRef ref{&codec, e.params, {rows, cols}, e.views()};
      const auto decoded = codec::decode_all(ref);
      const auto kernel = prepare_cpu(ref);
      const std::string what = fmt::format("{} {} on {}", c.codec, c.params.dump(), simd::target_name());
      for (const int64_t m : {int64_t{1}, int64_t{3}}) {
        const auto x = random_values(static_cast<size_t>(m * cols), rng, 1.0f);
        std::vector<float> y(static_cast<size_t>(m * rows), std::numeric_limits<float>::quiet_NaN());
        kernel->matmul(x.data(), m, y.data(), pool);
        for (int64_t i = 0; i < m; ++i)
          for (int64_t r = 0; r < rows; ++r) {
            double ref_y = 0, magnitude = 0;
            for (int64_t k = 0; k < cols; ++k) {
              const double p = static_cast<double>(decoded[r * cols + k]) * x[i * cols + k];
              ref_y += p, magnitude += std::abs(p);
            }
            ASSERT_NEAR(y[i * rows + r], ref_y, 2e-5 * magnitude + 1e-6) << what << " m=" << m << " row " << r;
          }
      }
      const std::vector<int32_t> ids{5, 0};
      std::vector<float> out(2 * cols, std::numeric_limits<float>::quiet_NaN());
      kernel->gather_rows(ids, out.data());
      for (size_t i = 0; i < ids.size(); ++i)
        for (int64_t k = 0; k < cols; ++k)
          ASSERT_NEAR(out[i * cols + k], decoded[ids[i] * cols + k], 1e-6f) << what << " id " << ids[i];
    }
  }
}

}  // namespace
}  // namespace lowbit::kernels
