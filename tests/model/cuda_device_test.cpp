// --device selection without a GPU: "cpu" keeps the CPU forward, "cuda" in a build without CUDA is a one-line
// usage error (exit 2 from the CLI), and `lowbit bench` measures the CPU path (decode batches through
// forward_rows). The GPU runtime itself is tested in tests/cuda.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "lowbit/core/error.h"
#include "lowbit/model/cuda_model.h"
#include "cuda/stack_rows.h"
#include "model/tiny_model.h"

namespace lowbit::model {
namespace {

namespace fs = std::filesystem;

// Runs the lowbit binary with `args`; returns (exit status, stdout).
std::pair<int, std::string> run_cli(const std::string& args) {
  FILE* p = ::popen((std::string(LOWBIT_CLI) + " " + args + " 2>/dev/null").c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(UseDevice, CpuKeepsTheCpuForwardAndUnknownDevicesAreUsageErrors) {
  auto m = testing::tiny_model(testing::tiny_config());
  use_device(*m, "cpu");
  EXPECT_FALSE(m->device);
  try {
    use_device(*m, "tpu");
    FAIL() << "expected Errc::usage";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::usage);
  }
}

TEST(UseDevice, CudaInABuildWithoutCudaSaysSo) {
  if (cuda_built()) GTEST_SKIP() << "this build has the CUDA backend (tests/cuda covers it)";
  auto m = testing::tiny_model(testing::tiny_config());
  try {
    use_device(*m, "cuda");
    FAIL() << "expected Errc::usage";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::usage);
    EXPECT_NE(std::string(e.what()).find("built without CUDA"), std::string::npos) << e.what();
  }
  EXPECT_EQ(run_cli("bench --synthetic llama3-8b --device cuda").first, 2);
}

// --devices: a list of distinct GPU ids, refused as a usage error otherwise, before any model is loaded (exit 2
// from every command that takes it).
TEST(Devices, ParsesAListOfDistinctIds) {
  EXPECT_EQ(parse_devices("0"), (std::vector<int>{0}));
  EXPECT_EQ(parse_devices("0,1,3"), (std::vector<int>{0, 1, 3}));
  for (const char* bad : {"", "a", "1,", ",1", "-1", "0,0", "1 ,2", "0,1,2,3,4,5,6,7,8"}) {
    try {
      parse_devices(bad);
      FAIL() << "accepted --devices '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::usage) << bad;
    }
  }
  for (const char* cmd :
       {"generate no-model", "chat no-model", "eval ppl no-model --text /dev/null", "bench no-model", "serve no-model"})
    EXPECT_EQ(run_cli(std::string(cmd) + " --device cuda --devices 0,0").first, 2) << cmd;
}

TEST(Devices, RunOnCudaOnly) {
  auto m = testing::tiny_model(testing::tiny_config());
  const std::vector<int> one{0};
  try {
    use_device(*m, "cpu", one);
    FAIL() << "expected Errc::usage";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::usage);
    EXPECT_NE(std::string(e.what()).find("--device cuda"), std::string::npos) << e.what();
  }
}

// The refusals, which need no GPU: a model whose KV heads do not split over the devices (before anything is
// loaded), a libnccl that is not there.
TEST(Devices, TensorParallelRefusesWhatItCannotRun) {
  const ModelConfig c = testing::tiny_config();  // 2 KV heads
  const ModelDesc d = describe_model(c, "tiny");
  const TensorLookup none = [](const std::string&) { return nullptr; };
  const std::vector<int> three{0, 1, 2}, one{0};
  const auto refusal = [&](std::span<const int> devices) {
    try {
      tensor_parallel(c, d, none, devices, "tiny");
    } catch (const Error& e) {
      return std::pair(e.code(), std::string(e.what()));
    }
    return std::pair(Errc::internal, std::string("no error"));
  };
  if (!cuda_built()) {
    EXPECT_EQ(refusal(one).first, Errc::usage);
    return;
  }
  const auto [split_code, split_what] = refusal(three);
  EXPECT_EQ(split_code, Errc::usage) << split_what;
  EXPECT_NE(split_what.find("2 KV heads do not split over 3 devices"), std::string::npos) << split_what;
  ::setenv("LOWBIT_NCCL", "/nonexistent/libnccl.so.2", 1);
  const auto [code, what] = refusal(one);
  ::unsetenv("LOWBIT_NCCL");
  EXPECT_EQ(code, Errc::unsupported) << what;
  EXPECT_NE(what.find("cannot load NCCL"), std::string::npos) << what;
}

std::vector<float> concat_decoded(std::span<const codec::TensorRef* const> parts) {
  std::vector<float> out;
  for (const codec::TensorRef* p : parts) {
    const std::vector<float> d = codec::decode_all(*p);
    out.insert(out.end(), d.begin(), d.end());
  }
  return out;
}

// q, k and v stack into one tensor that decodes to their rows one after another, in dense and affine storage;
// tensors whose parameters differ do not stack.
TEST(StackRows, StacksRowsOfOneCodecAndRefusesMixedParameters) {
  const ModelConfig c = testing::tiny_config();
  const auto m = testing::tiny_model(c, 3);
  const auto ref = [&](std::string_view p) { return &m->find(fmt::format("model.layers.1.self_attn.{}_proj.weight", p))->ref; };
  const std::vector<const codec::TensorRef*> dense{ref("q"), ref("k"), ref("v")};
  const auto stacked_dense = stack_rows(dense);
  ASSERT_TRUE(stacked_dense);
  EXPECT_EQ(stacked_dense->ref.shape, (Shape{c.q_dim() + 2 * c.kv_dim(), c.dim}));
  EXPECT_EQ(codec::decode_all(stacked_dense->ref), concat_decoded(dense));

  const codec::Codec& affine = codec::codec_or_throw("affine", "test");
  std::vector<codec::EncodedTensor> enc;
  std::vector<codec::TensorRef> refs;
  for (const auto* r : dense) {
    const std::vector<float> w = codec::decode_all(*r);
    enc.push_back(affine.encode({{"bits", 4}, {"group_size", 32}, {"scale_dtype", "bf16"}}, r->shape, w.data(), {}));
  }
  for (size_t i = 0; i < dense.size(); ++i) refs.push_back({&affine, enc[i].params, dense[i]->shape, enc[i].views()});
  const std::vector<const codec::TensorRef*> quantized{&refs[0], &refs[1], &refs[2]};
  const auto stacked_affine = stack_rows(quantized);
  ASSERT_TRUE(stacked_affine);
  EXPECT_EQ(codec::decode_all(stacked_affine->ref), concat_decoded(quantized));

  const std::vector<const codec::TensorRef*> mixed{&refs[0], dense[1]};
  EXPECT_FALSE(stack_rows(mixed));
}

TEST(Bench, CpuReportsPrefillAndDecodeSpeed) {
  const fs::path bin = fs::path(LOWBIT_SHARED_DIR) / "models" / "stories260K" / "stories260K.bin";
  if (!fs::exists(bin)) GTEST_SKIP() << "../shared/models/stories260K is absent";
  const auto [status, out] = run_cli("bench " + bin.string() + " --prompt 8 -n 4 --threads 1 --batch 1,3 --json");
  ASSERT_EQ(status, 0) << out;
  const auto j = nlohmann::json::parse(out);
  ASSERT_EQ(j["rows"].size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(j["rows"][i]["batch"].get<int>(), i == 0 ? 1 : 3);
    EXPECT_GT(j["rows"][i]["prefill_tokens_per_s"].get<double>(), 0.0);
    EXPECT_GT(j["rows"][i]["decode_tokens_per_s"].get<double>(), 0.0);
  }
  EXPECT_EQ(run_cli("bench " + bin.string() + " --batch 17").first, 2);
}

}  // namespace
}  // namespace lowbit::model
