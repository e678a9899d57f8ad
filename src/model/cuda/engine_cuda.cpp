// The engine's GPU backend: one CudaModel whose KV slots hold the engine's sequences; a decode step is one
// CudaModel::step with a row per active sequence (its batch-size graph replayed), a prefill pass one
// CudaModel::prefill on the sequence's slot.
#include <algorithm>

#include "lowbit/core/error.h"
#include "lowbit/model/cuda_model.h"
#include "engine_backend.h"

namespace lowbit::model {

namespace {

class CudaEngineBackend final : public EngineBackend {
 public:
  // devices not empty: tensor-parallel over them (tensor_parallel).
  CudaEngineBackend(const Model& model, int slots, int64_t capacity, std::span<const int> devices)
      : gpu_(make_cuda_model(
            model.config, model.desc,
            [&model](const std::string& name) {
              const NamedTensor* t = model.find(name);
              return t ? &t->ref : nullptr;
            },
            devices, {.max_batch = slots, .slots = slots, .capacity = capacity}, "[--devices]")) {}

  void prefill(int slot, std::span<const int32_t> tokens, int64_t pos, float* logits) override {
    gpu_->prefill(tokens, pos, slot, CudaModel::Logits::last, logits);
  }

  void decode(std::span<const int32_t> tokens, std::span<const int32_t> pos, std::span<const int32_t> slot,
              std::span<float* const> logits, std::span<int32_t> next) override {
    gpu_->step(tokens, pos, slot);
    gpu_->argmax(static_cast<int>(tokens.size()), next);
    for (size_t i = 0; i < logits.size(); ++i)
      if (logits[i]) gpu_->download_logits(static_cast<int>(i), static_cast<int>(i) + 1, logits[i]);
  }

 private:
  std::unique_ptr<CudaModel> gpu_;
};

}  // namespace

std::unique_ptr<EngineBackend> make_cuda_engine_backend(const Model& model, int slots, int64_t capacity,
                                                        std::span<const int> devices) {
  return std::make_unique<CudaEngineBackend>(model, slots, capacity, devices);
}

}  // namespace lowbit::model
