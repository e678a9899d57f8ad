// The depth decoder on the GPU (DepthOptions::cuda, src/model/cuda/depth_cuda.cpp): the seed's fixtures bit for bit
// as the CPU test checks them (every variant: f16, bf16, f32, quantized, with speaker memory and teacher forcing;
// tests/model/depth_fixture.h), and single frames against the CPU path under other sampler settings and speakers.
// Skips when no CUDA device is present.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "lowbit/kernels/cuda.h"
#include "lowbit/model/depth_decoder.h"
#include "model/depth_fixture.h"

namespace lowbit::model {
namespace {

using namespace testing;  // the fixtures' helpers (depth_fixture.h)

void skip_without_gpu() {
  std::string why;
  if (!kernels::cuda::device_available(&why)) GTEST_SKIP() << "no usable CUDA device: " << why;
}

class DepthCudaFixture : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { skip_without_gpu(); }
};

TEST_P(DepthCudaFixture, MatchesTheSeedOnMlx) { expect_matches_fixture(GetParam(), true); }

INSTANTIATE_TEST_SUITE_P(Variants, DepthCudaFixture,
                         ::testing::Values("dense_f16", "quant_f16", "dense_bf16", "dense_f32"),
                         [](const auto& info) { return info.param; });

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class DepthCuda : public ::testing::Test {
 protected:
  void SetUp() override { skip_without_gpu(); }
};

// frame() one at a time (the GPU's unpipelined path), with the sampler's extremes (top-1, no top-k cut, another
// temperature), a speaker then the null memory again, teacher forcing on and off.
TEST_F(DepthCuda, FramesMatchTheCpuUnderOtherSettings) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("lowbit_depth_cuda_{}", ::getpid());
  write_model(dir, true, DType::F16);
  Tensors in = make_inputs("cuda_frames", 2, true, true);
  auto tensor = [&](const std::string& name) -> TensorBuffer& {
    for (auto& [n, b] : in)
      if (n == name) return b;
    throw std::runtime_error("no tensor " + name);
  };
  std::vector<float> speaker(kD);
  for (int64_t i = 0; i < kD; ++i) speaker[i] = load_float(DType::F32, tensor("speaker").bytes.data(), i);
  struct Setting {
    int top_k;
    double temperature;
  };
  for (const Setting s : {Setting{1, 0.7}, Setting{64, 1.3}, Setting{2048, 0.7}}) {
    const DepthOptions options{.dtype = DType::F16, .temperature = s.temperature, .top_k = s.top_k};
    DepthOptions on_gpu = options;
    on_gpu.cuda = true;
    auto cpu = DepthDecoder::load(dir, options);
    auto gpu = DepthDecoder::load(dir, on_gpu);
    for (const bool with_speaker : {true, false}) {
      cpu.set_speaker(with_speaker ? speaker : std::vector<float>{});
      gpu.set_speaker(with_speaker ? speaker : std::vector<float>{});
      for (int64_t t = 0; t < 2; ++t)
        for (const bool forced : {false, true}) {
          const DepthFrameIn fin{{tensor("h").as<uint16_t>() + t * kHidden, static_cast<size_t>(kHidden)},
                                 tensor("cb0").as<int32_t>()[t],
                                 {tensor("uniform").as<float>() + t * 31 * 2048, size_t{31 * 2048}},
                                 forced ? std::span<const int32_t>(tensor("force").as<int32_t>() + t * 32, 32)
                                        : std::span<const int32_t>{}};
          const DepthFrameOut want = cpu.frame(fin, true), got = gpu.frame(fin, true);
          SCOPED_TRACE(fmt::format("top_k {} temperature {} speaker {} frame {} forced {}", s.top_k, s.temperature,
                                   with_speaker, t, forced));
          EXPECT_EQ(got.codes, want.codes);
          EXPECT_TRUE(same_bits(got.logits, want.logits)) << "logits not bit-identical";
          EXPECT_TRUE(same_bits(got.feedback, want.feedback)) << "feedback not bit-identical";
        }
    }
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace lowbit::model
