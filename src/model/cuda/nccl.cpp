// tensor_parallel (cuda_model.h): the sharded description and its all-reduce through NCCL, which is loaded at run
// time with dlopen so that lowbit neither links nor requires it (nccl.h gives the types only).
#include <dlfcn.h>

#include <cstdlib>
#include <memory>
#include <string>

#include <cuda_runtime.h>
#include <nccl.h>

#include "lowbit/core/error.h"
#include "lowbit/model/cuda_model.h"
#include "lowbit/model/shard.h"

namespace lowbit::model {

namespace {

// The NCCL entry points lowbit calls, from the library dlopen found.
struct Nccl {
  decltype(&ncclCommInitAll) comm_init_all = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
};

const Nccl& nccl() {
  static const Nccl loaded = [] {
    const char* env = std::getenv("LOWBIT_NCCL");
    const std::string file = env && *env ? env : "libnccl.so.2";
    void* lib = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib)
      fail(Errc::unsupported,
           "[--devices] cannot load NCCL ({}): put the CUDA toolkit's or PyTorch's libnccl.so.2 on the library path, "
           "or name the file in LOWBIT_NCCL",
           dlerror());
    Nccl n;
    const auto sym = [&]<class F>(F& fn, const char* name) {
      fn = reinterpret_cast<F>(dlsym(lib, name));
      if (!fn) fail(Errc::unsupported, "[--devices] {} has no {}", file, name);
    };
    sym(n.comm_init_all, "ncclCommInitAll");
    sym(n.comm_destroy, "ncclCommDestroy");
    sym(n.all_reduce, "ncclAllReduce");
    sym(n.error_string, "ncclGetErrorString");
    return n;
  }();
  return loaded;
}

void check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) fail(Errc::io, "[nccl] {}: {}", what, nccl().error_string(r));
}

}  // namespace

TensorParallel tensor_parallel(const ModelDesc& desc, std::span<const int> devices) {
  if (devices.size() != 1)
    fail(Errc::unsupported,
         "[--devices] {} GPUs: this build runs one rank per process on one GPU (--devices N); a "
         "rank per GPU is not built yet",
         devices.size());
  const Nccl& n = nccl();
  if (cudaSetDevice(devices[0]) != cudaSuccess)
    fail(Errc::usage, "[--devices] GPU {}: {}", devices[0], cudaGetErrorString(cudaGetLastError()));
  ncclComm_t raw = nullptr;
  check(n.comm_init_all(&raw, 1, devices.data()), "ncclCommInitAll");
  const std::shared_ptr<ncclComm> comm(raw, [](ncclComm_t c) { nccl().comm_destroy(c); });
  return {
      shard_desc(desc), [comm](float* data, size_t count, void* stream) {
        check(nccl().all_reduce(data, data, count, ncclFloat32, ncclSum, comm.get(), static_cast<cudaStream_t>(stream)),
              "ncclAllReduce");
      }};
}

}  // namespace lowbit::model
