// Every model family on the GPU against Hugging Face transformers: each fixture of tests/model/fixtures/families/
// (the same tiny models family_fixture_test.cpp runs on the CPU) through CudaModel: the prompt as prefill passes
// of 7 positions (every position's logits), then greedy decode steps, logits within the CPU test's 1e-4 of
// transformers' and greedy ids identical; the GGUF variant where the fixture has one. The MoE families (qwen3_moe,
// mixtral) run their experts through the grouped expert kernels: prefill passes of 7 rows route 7 rows at a time
// (groups of several rows), decode steps one. The 1-rank NCCL path (tensor_parallel on GPU 0: the sharded
// description, its all_reduce ops through ncclAllReduce inside the captured graph) must give the same. Skips without
// a device (and the NCCL test without a loadable libnccl).
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "lowbit/core/error.h"
#include "lowbit/kernels/cuda.h"
#include "lowbit/model/cuda_model.h"
#include "lowbit/model/model.h"
#include "model/family_fixtures.h"

namespace lowbit::model {
namespace {

namespace fs = std::filesystem;

void check_on_gpu(const Model& m, const testing::FamilyExpected& e, const std::string& what, TensorParallel tp = {}) {
  const int64_t vocab = m.config.vocab, n = static_cast<int64_t>(e.tokens.size());
  const TensorLookup lookup = [&m](const std::string& name) {
    const NamedTensor* t = m.find(name);
    return t ? &t->ref : nullptr;
  };
  const bool sharded = bool(tp.all_reduce);
  CudaModel gpu(m.config, sharded ? std::move(tp.desc) : m.desc, lookup,
                {.max_batch = 1,
                 .prefill_rows = 7,
                 .capacity = n + static_cast<int64_t>(e.greedy.size()),
                 .all_reduce = std::move(tp.all_reduce)});
  std::vector<float> logits(e.logits.size(), std::nanf(""));
  gpu.prefill(e.tokens, 0, 0, CudaModel::Logits::all, logits.data());
  const double rel = testing::max_relative_diff(logits, e.logits);
  std::cout << "[ family   ] " << what << " on the GPU: max |logit diff| / max |logit| = " << rel << "\n";
  EXPECT_LE(rel, testing::kFamilyTolerance) << what;

  std::vector<int32_t> greedy;
  std::vector<float> last(logits.end() - vocab, logits.end());
  for (size_t i = 0; i < e.greedy.size(); ++i) {
    greedy.push_back(testing::argmax_of(last));
    gpu.step(std::span(&greedy.back(), 1), std::vector{static_cast<int32_t>(n + i)}, std::vector<int32_t>{0});
    gpu.download_logits(0, 1, last.data());
  }
  EXPECT_EQ(greedy, e.greedy) << what;
}

class CudaFamilyFixture : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string why;
    if (!kernels::cuda::device_available(&why)) GTEST_SKIP() << "no usable CUDA device: " << why;
  }
};

TEST_P(CudaFamilyFixture, MatchesTransformers) {
  const fs::path dir = testing::kFamilyFixtures / GetParam();
  const testing::FamilyExpected e = testing::family_expected_for(dir, false);
  const LoadOptions options{static_cast<int64_t>(e.tokens.size() + e.greedy.size())};
  const auto m = load_model(dir, options);
  check_on_gpu(*m, e, GetParam() + " (HF)");
  if (fs::exists(dir / "model.gguf"))
    check_on_gpu(*load_model(dir / "model.gguf", options), testing::family_expected_for(dir, true),
                 GetParam() + " (GGUF)");
}

TEST_P(CudaFamilyFixture, OneRankNcclMatchesTransformers) {
  const fs::path dir = testing::kFamilyFixtures / GetParam();
  const testing::FamilyExpected e = testing::family_expected_for(dir, false);
  const auto m = load_model(dir, LoadOptions{static_cast<int64_t>(e.tokens.size() + e.greedy.size())});
  const std::vector<int> gpu0{0};
  TensorParallel tp;
  try {
    tp = tensor_parallel(m->desc, gpu0);
  } catch (const Error& err) {
    if (std::string(err.what()).find("cannot load NCCL") != std::string::npos) GTEST_SKIP() << err.what();
    throw;
  }
  check_on_gpu(*m, e, GetParam() + " (1-rank NCCL)", std::move(tp));
}

INSTANTIATE_TEST_SUITE_P(Families, CudaFamilyFixture, ::testing::ValuesIn(testing::family_fixture_dirs()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace lowbit::model
