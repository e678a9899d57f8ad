// --device selection: "cpu" keeps the CPU kernels, "cuda" hands forward() to the GPU runtime when this build has
// it (src/model/cuda/, compiled only with LOWBIT_CUDA=ON, which defines LOWBIT_WITH_CUDA here); --devices runs it
// on a list of GPUs through tensor_parallel (src/model/cuda/nccl.cpp).
#include <charconv>
#include <set>

#include "lowbit/core/error.h"
#include "lowbit/model/cuda_model.h"

namespace lowbit::model {

#if LOWBIT_WITH_CUDA
// src/model/cuda/cuda_forward.cpp
std::shared_ptr<DeviceForward> make_cuda_forward(const Model& model, std::span<const int> devices);
bool cuda_built() { return true; }
#else
bool cuda_built() { return false; }

namespace {
[[noreturn]] void no_cuda() {
  fail(Errc::usage, "[--device] cuda: this lowbit was built without CUDA (configure with -DLOWBIT_CUDA=ON)");
}
}  // namespace

std::vector<Speed> measure_cuda(const ModelConfig&, const ModelDesc&, const TensorLookup&, const SpeedOptions&) {
  no_cuda();
}
std::string cuda_device_summary() { no_cuda(); }
TensorParallel tensor_parallel(const ModelConfig&, const ModelDesc&, const TensorLookup&, std::span<const int>,
                               std::string_view) {
  no_cuda();
}
#endif

namespace {
constexpr size_t kMaxDevices = 8;
}

std::vector<int> parse_devices(std::string_view list) {
  std::vector<int> devices;
  std::set<int> seen;
  while (true) {
    const size_t comma = list.find(',');
    const std::string_view entry = list.substr(0, comma);
    int id = -1;
    const auto [end, ec] = std::from_chars(entry.data(), entry.data() + entry.size(), id);
    if (entry.empty() || ec != std::errc() || end != entry.data() + entry.size() || id < 0)
      fail(Errc::usage, "[--devices] '{}' is not a GPU id (expected a list like 0,1)", entry);
    if (!seen.insert(id).second) fail(Errc::usage, "[--devices] GPU {} is listed twice", id);
    devices.push_back(id);
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  if (devices.size() > kMaxDevices)
    fail(Errc::usage, "[--devices] {} GPUs: at most {} (one host)", devices.size(), kMaxDevices);
  return devices;
}

void use_device(Model& model, std::string_view device, std::span<const int> devices) {
  if (!devices.empty() && device != "cuda") fail(Errc::usage, "[--devices] runs on --device cuda, not {}", device);
  if (device == "cpu") {
    model.device.reset();
    return;
  }
  if (device != "cuda") fail(Errc::usage, "[--device] '{}': expected cpu or cuda", device);
  model.require_stored_arrays("use_device cuda");
#if LOWBIT_WITH_CUDA
  model.device = make_cuda_forward(model, devices);
#else
  no_cuda();
#endif
}

}  // namespace lowbit::model
