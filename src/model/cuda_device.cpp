// --device selection: "cpu" keeps the CPU kernels, "cuda" hands forward() to the GPU runtime when this build has
// it (src/model/cuda/, compiled only with LOWBIT_CUDA=ON, which defines LOWBIT_WITH_CUDA here).
#include "lowbit/core/error.h"
#include "lowbit/model/cuda_model.h"

namespace lowbit::model {

#if LOWBIT_WITH_CUDA
std::shared_ptr<DeviceForward> make_cuda_forward(const Model& model);  // src/model/cuda/cuda_forward.cpp
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
#endif

void use_device(Model& model, std::string_view device) {
  if (device == "cpu") {
    model.device.reset();
    return;
  }
  if (device != "cuda") fail(Errc::usage, "[--device] '{}': expected cpu or cuda", device);
  model.require_stored_arrays("use_device cuda");
#if LOWBIT_WITH_CUDA
  model.device = make_cuda_forward(model);
#else
  no_cuda();
#endif
}

}  // namespace lowbit::model
