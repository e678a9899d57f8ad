// forward() on the GPU for a loaded Model (use_device("cuda")): one token through the decode step (its graph
// replayed), several through CudaModel::prefill; logits copied back for the CPU sampler and the evaluators.
#include <algorithm>
#include <vector>

#include "lowbit/core/error.h"
#include "lowbit/model/cuda_model.h"

namespace lowbit::model {

namespace {

class CudaForward final : public DeviceForward {
 public:
  // devices not empty: tensor-parallel over them (tensor_parallel).
  CudaForward(const Model& model, std::span<const int> devices)
      : gpu_(make_cuda_model(
            model.config, model.desc,
            [&model](const std::string& name) {
              const NamedTensor* t = model.find(name);
              return t ? &t->ref : nullptr;
            },
            devices, {.max_batch = 1, .slots = 1, .capacity = std::min<int64_t>(model.config.max_seq, 256)},
            "[--devices]")) {}

  void forward(KvCache& cache, std::span<const int32_t> tokens, int64_t pos, float* logits,
               bool all_logits) override {
    const auto m = static_cast<int64_t>(tokens.size());
    follow(cache, pos, m);
    if (m > 1) {
      gpu_->prefill(tokens, pos, 0, all_logits ? CudaModel::Logits::all : CudaModel::Logits::last, logits);
      return;
    }
    const std::vector<int32_t> position{static_cast<int32_t>(pos)}, slot{0};
    gpu_->step(tokens, position, slot);
    gpu_->download_logits(0, 1, logits);
  }

  void forward_embeddings(KvCache& cache, std::span<const float> x, int64_t pos, float* logits,
                          bool all_logits) override {
    follow(cache, pos, static_cast<int64_t>(x.size()) / gpu_->config().dim);
    gpu_->prefill_rows(x, pos, 0, all_logits ? CudaModel::Logits::all : CudaModel::Logits::last, logits);
  }

 private:
  // Positions pos..pos+m-1 of the sequence whose host cache is `cache` (its capacity reserved on the device).
  void follow(KvCache& cache, int64_t pos, int64_t m) {
    if (m < 1 || pos < 0 || pos + m > cache.capacity())
      fail(Errc::limit, "[forward] positions {}..{} exceed the context of {}", pos, pos + m, cache.capacity());
    if (&cache != cache_ && pos != 0)
      fail(Errc::unsupported, "[forward] cuda: a new sequence must start at position 0 (one sequence at a time)");
    cache_ = &cache;
    if (cache.capacity() > gpu_->options().capacity) gpu_->reserve(cache.capacity());
  }

  std::unique_ptr<CudaModel> gpu_;
  const KvCache* cache_ = nullptr;
};

}  // namespace

std::shared_ptr<DeviceForward> make_cuda_forward(const Model& model, std::span<const int> devices) {
  return std::make_shared<CudaForward>(model, devices);
}

}  // namespace lowbit::model
