// Every model family on the GPU against Hugging Face transformers: each fixture of tests/model/fixtures/families/
// (the same tiny models family_fixture_test.cpp runs on the CPU) through CudaModel: the prompt as prefill passes
// of 7 positions (every position's logits), then greedy decode steps, logits within the CPU test's 1e-4 of
// transformers' and greedy ids identical; the GGUF variant where the fixture has one. The MoE families (qwen3_moe,
// mixtral) run their experts through the grouped expert kernels: prefill passes of 7 rows route 7 rows at a time
// (groups of several rows), decode steps one. Tensor parallelism (shard.h) must give the same: the 1-rank NCCL
// path (tensor_parallel on GPU 0: the sharded description, its all_reduce ops through ncclAllReduce inside the
// captured graph), and 2 ranks on one GPU, each its slices on a thread of its own, their all-reduces summed on the
// host (the CPU simulation's communicator: NCCL refuses two ranks on one GPU), so that every sliced kernel, the
// vocabulary-parallel embedding and head and the experts split by expert run as on two GPUs. Skips without a device
// (and the NCCL test without a loadable libnccl).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "lowbit/core/error.h"
#include "lowbit/kernels/cuda.h"
#include "lowbit/model/cuda_model.h"
#include "lowbit/model/model.h"
#include "lowbit/model/shard.h"
#include "model/family_fixtures.h"

namespace lowbit::model {
namespace {

namespace fs = std::filesystem;

// The GPU model of a fixture's tensors under some options: the whole model, or tensor-parallel ranks.
using Build = std::function<std::unique_ptr<CudaModel>(const Model& m, const TensorLookup& lookup,
                                                       const CudaModelOptions& options)>;

std::unique_ptr<CudaModel> whole(const Model& m, const TensorLookup& lookup, const CudaModelOptions& options) {
  return std::make_unique<CudaModel>(m.config, m.desc, lookup, options);
}

void check_on_gpu(const Model& m, const testing::FamilyExpected& e, const std::string& what, const Build& build = whole,
                  bool graphs = true) {
  const int64_t vocab = m.config.vocab, n = static_cast<int64_t>(e.tokens.size());
  const TensorLookup lookup = [&m](const std::string& name) {
    const NamedTensor* t = m.find(name);
    return t ? &t->ref : nullptr;
  };
  const std::unique_ptr<CudaModel> gpu = build(
      m, lookup,
      {.max_batch = 1, .prefill_rows = 7, .capacity = n + static_cast<int64_t>(e.greedy.size()), .use_graphs = graphs});
  std::vector<float> logits(e.logits.size(), std::nanf(""));
  gpu->prefill(e.tokens, 0, 0, CudaModel::Logits::all, logits.data());
  const double rel = testing::max_relative_diff(logits, e.logits);
  std::cout << "[ family   ] " << what << " on the GPU: max |logit diff| / max |logit| = " << rel << "\n";
  EXPECT_LE(rel, testing::kFamilyTolerance) << what;

  std::vector<int32_t> greedy;
  std::vector<float> last(logits.end() - vocab, logits.end());
  for (size_t i = 0; i < e.greedy.size(); ++i) {
    greedy.push_back(testing::argmax_of(last));
    gpu->step(std::span(&greedy.back(), 1), std::vector{static_cast<int32_t>(n + i)}, std::vector<int32_t>{0});
    gpu->download_logits(0, 1, last.data());
  }
  EXPECT_EQ(greedy, e.greedy) << what;
}

// `ranks` ranks of the model on GPU 0, whose all-reduces meet on the host: each rank copies its buffer back, the
// CPU simulation's communicator sums the ranks' buffers in rank order, and each copies the sum to the device. A
// host sum cannot be captured in a graph, so these models launch every kernel each step.
TensorParallel ranks_on_gpu0(const Model& m, const TensorLookup& lookup, int ranks) {
  TensorParallel tp{shard_desc(m.desc), {}};
  const std::vector<std::shared_ptr<Communicator>> comms = local_group(ranks);
  for (int r = 0; r < ranks; ++r)
    tp.ranks.push_back(
        {0, rank_tensors(m.config, m.desc, lookup, r, ranks, "fixture"),
         [comm = comms[static_cast<size_t>(r)]](float* data, size_t count, void* stream) {
           std::vector<float> host(count);
           const auto s = static_cast<cudaStream_t>(stream);
           ASSERT_EQ(cudaMemcpyAsync(host.data(), data, count * sizeof(float), cudaMemcpyDeviceToHost, s), cudaSuccess);
           ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
           comm->all_reduce(host.data(), count);
           ASSERT_EQ(cudaMemcpyAsync(data, host.data(), count * sizeof(float), cudaMemcpyHostToDevice, s), cudaSuccess);
           ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
         }});
  return tp;
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
  try {
    check_on_gpu(*m, e, GetParam() + " (1-rank NCCL)",
                 [&](const Model& model, const TensorLookup& lookup, const CudaModelOptions& options) {
                   return std::make_unique<CudaModel>(
                       model.config, tensor_parallel(model.config, model.desc, lookup, gpu0, GetParam()), options);
                 });
  } catch (const Error& err) {
    if (std::string(err.what()).find("cannot load NCCL") != std::string::npos) GTEST_SKIP() << err.what();
    throw;
  }
}

TEST_P(CudaFamilyFixture, TwoRanksOnOneGpuMatchTransformers) {
  const fs::path dir = testing::kFamilyFixtures / GetParam();
  const testing::FamilyExpected e = testing::family_expected_for(dir, false);
  const auto m = load_model(dir, LoadOptions{static_cast<int64_t>(e.tokens.size() + e.greedy.size())});
  if (m->config.n_kv_heads % 2 != 0 || m->config.hidden_dim % 2 != 0)
    GTEST_SKIP() << GetParam() << ": " << m->config.n_kv_heads << " KV heads, MLP width " << m->config.hidden_dim
                 << " do not split in two";
  check_on_gpu(
      *m, e, GetParam() + " (2 ranks on GPU 0)",
      [](const Model& model, const TensorLookup& lookup, const CudaModelOptions& options) {
        return std::make_unique<CudaModel>(model.config, ranks_on_gpu0(model, lookup, 2), options);
      },
      false);
}

INSTANTIATE_TEST_SUITE_P(Families, CudaFamilyFixture, ::testing::ValuesIn(testing::family_fixture_dirs()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace lowbit::model
