// forward() on the GPU for a loaded Model (use_device("cuda")): prefill in chunks of up to kMaxBatch positions
// of one sequence, decode one row per step, logits copied back for the CPU sampler and the evaluators.
#include <algorithm>
#include <vector>

#include "lowbit/core/error.h"
#include "lowbit/kernels/cuda.h"
#include "lowbit/model/cuda_model.h"

namespace lowbit::model {

namespace {

constexpr int kRows = kernels::cuda::kMaxBatch;

class CudaForward final : public DeviceForward {
 public:
  explicit CudaForward(const Model& model)
      : gpu_(model.config,
             [&model](const std::string& name) {
               const NamedTensor* t = model.find(name);
               return t ? &t->ref : nullptr;
             },
             {.max_batch = kRows, .slots = 1, .capacity = std::min<int64_t>(model.config.max_seq, 256)}) {}

  void forward(KvCache& cache, std::span<const int32_t> tokens, int64_t pos, float* logits,
               bool all_logits) override {
    const auto m = static_cast<int64_t>(tokens.size());
    if (m < 1 || pos < 0 || pos + m > cache.capacity())
      fail(Errc::limit, "[forward] positions {}..{} exceed the context of {}", pos, pos + m, cache.capacity());
    if (&cache != cache_ && pos != 0)
      fail(Errc::unsupported, "[forward] cuda: a new sequence must start at position 0 (one sequence at a time)");
    cache_ = &cache;
    if (cache.capacity() > gpu_.options().capacity) gpu_.reserve(cache.capacity());
    const int64_t vocab = gpu_.config().vocab;
    std::vector<int32_t> positions, slots;
    for (int64_t off = 0; off < m; off += kRows) {
      const int n = static_cast<int>(std::min<int64_t>(kRows, m - off));
      positions.resize(n);
      slots.assign(n, 0);
      for (int r = 0; r < n; ++r) positions[r] = static_cast<int32_t>(pos + off + r);
      gpu_.step(tokens.subspan(off, n), positions, slots);
      if (all_logits) {
        gpu_.download_logits(0, n, logits + off * vocab);
      } else if (off + n == m) {
        gpu_.download_logits(n - 1, n, logits);
      }
    }
  }

 private:
  CudaModel gpu_;
  const KvCache* cache_ = nullptr;
};

}  // namespace

std::shared_ptr<DeviceForward> make_cuda_forward(const Model& model) { return std::make_shared<CudaForward>(model); }

}  // namespace lowbit::model
