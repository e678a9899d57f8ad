// Where the engine's forward passes run: the CPU forward() with one KvCache per slot, or a CudaModel with one
// KV slot per sequence (src/model/cuda/engine_cuda.cpp, built with LOWBIT_CUDA).
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "lowbit/model/model.h"

namespace lowbit::model {

class EngineBackend {
 public:
  virtual ~EngineBackend() = default;
  // Runs tokens at positions pos, pos + 1, .. of KV slot `slot`; `logits` [vocab] gets the last token's.
  virtual void prefill(int slot, std::span<const int32_t> tokens, int64_t pos, float* logits) = 0;
  // One decode step: row i runs tokens[i] at position pos[i] of KV slot slot[i] and next[i] gets its argmax (the
  // greedy token, the lowest id on ties); only rows with logits[i] != nullptr get their [vocab] logits there. Greedy
  // rows without logprobs need no logits, and on the GPU not copying 16 rows of a 262144-word vocabulary to the host
  // every step is what lets 16 streams scale.
  virtual void decode(std::span<const int32_t> tokens, std::span<const int32_t> pos, std::span<const int32_t> slot,
                      std::span<float* const> logits, std::span<int32_t> next) = 0;
};

#if LOWBIT_WITH_CUDA
// `slots` sequences of `capacity` positions each, decoded together in one CudaModel::step; on `devices` through
// tensor_parallel (cuda_model.h) when not empty.
std::unique_ptr<EngineBackend> make_cuda_engine_backend(const Model& model, int slots, int64_t capacity,
                                                        std::span<const int> devices);
#endif

}  // namespace lowbit::model
