// The serving engine on the GPU (--device cuda): greedy requests decoded together in one CudaModel::step (a row
// per sequence, each in its own KV slot, prefills interleaved in passes) give the tokens each gives alone.
// Skips when no CUDA device is present or ../shared is absent.
#include <gtest/gtest.h>

#include <filesystem>

#include "lowbit/core/thread_pool.h"
#include "lowbit/kernels/cuda.h"
#include "lowbit/model/engine.h"

namespace lowbit::model {
namespace {

namespace fs = std::filesystem;

std::vector<int32_t> greedy_tokens(GenerationStream& stream) {
  std::vector<int32_t> out;
  GenerationEvent e;
  for (bool done = false; !done;) {
    if (!stream.next(e, std::chrono::seconds(60))) {
      ADD_FAILURE() << "no event in 60 s";
      break;
    }
    for (const auto& t : e.tokens) out.push_back(t.token);
    EXPECT_NE(e.finish, FinishReason::error) << e.error;
    done = e.finish != FinishReason::none;
  }
  return out;
}

TEST(EngineCuda, GreedyIsTheSameAloneAndBatched) {
  std::string why;
  if (!kernels::cuda::device_available(&why)) GTEST_SKIP() << "no usable CUDA device: " << why;
  const fs::path dir = fs::path(LOWBIT_SHARED_DIR) / "models" / "stories260K";
  if (!fs::exists(dir / "stories260K.bin")) GTEST_SKIP() << dir << " is absent";
  const auto model = load_model(dir / "stories260K.bin");
  const auto tokenizer = load_tokenizer(dir / "stories260K.bin", dir / "tok512.bin");
  ThreadPool pool(2);
  const std::vector<std::string> prompts = {"Once upon a time", "The dog", "Lily and Tom went to the park. They",
                                            "Sam", "One day, a little bird", "Mom said"};
  auto request = [&](const std::string& p) {
    GenerationRequest r;
    r.prompt = tokenizer->encode(p, true);
    r.max_tokens = 48;
    r.sampler.temperature = 0;
    r.stop_tokens = tokenizer->eos_ids();
    return r;
  };
  EngineOptions o;
  o.device = "cuda";
  o.context = 256;
  o.prefill_chunk = 4;
  std::vector<std::vector<int32_t>> alone;
  {
    o.parallel = 1;
    Engine e(*model, *tokenizer, o, pool);
    e.start();
    for (const auto& p : prompts) alone.push_back(greedy_tokens(*e.submit(request(p))));
  }
  o.parallel = 16;
  int widest = 0;
  o.after_step = [&](int decoded) { widest = std::max(widest, decoded); };
  Engine e(*model, *tokenizer, o, pool);
  std::vector<std::shared_ptr<GenerationStream>> streams;
  for (int copy = 0; copy < 2; ++copy)
    for (const auto& p : prompts) streams.push_back(e.submit(request(p)));
  e.start();
  for (size_t i = 0; i < streams.size(); ++i) {
    const auto got = greedy_tokens(*streams[i]);
    EXPECT_FALSE(got.empty());
    EXPECT_EQ(got, alone[i % prompts.size()]) << prompts[i % prompts.size()];
  }
  e.stop();
  EXPECT_GT(widest, 1) << "the sequences were never decoded together";
}

}  // namespace
}  // namespace lowbit::model
