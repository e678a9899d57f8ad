// tensor_parallel (cuda_model.h): the sharded description and its all-reduce through NCCL, which is loaded at run
// time with dlopen so that lowbit neither links nor requires it (nccl.h gives the types only).
#include <dlfcn.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

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

TensorParallel tensor_parallel(const ModelConfig& config, const ModelDesc& desc, const TensorLookup& lookup,
                               std::span<const int> devices, std::string_view source) {
  const int ranks = static_cast<int>(devices.size());
  if (ranks < 1) fail(Errc::internal, "[--devices] no GPU");
  check_shardable(config, ranks, source);
  const Nccl& n = nccl();
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  for (const int d : devices)
    if (d < 0 || d >= count) fail(Errc::usage, "[--devices] GPU {}: this machine has {} GPUs", d, count);
  std::vector<ncclComm_t> raw(devices.size(), nullptr);
  check(n.comm_init_all(raw.data(), ranks, devices.data()), "ncclCommInitAll");
  std::vector<std::shared_ptr<ncclComm>> comms;
  comms.reserve(raw.size());
  for (ncclComm_t c : raw) comms.emplace_back(c, [](ncclComm_t owned) { nccl().comm_destroy(owned); });
  TensorParallel tp{shard_desc(desc), {}};
  for (int r = 0; r < ranks; ++r) {
    tp.ranks.push_back({devices[static_cast<size_t>(r)], rank_tensors(config, desc, lookup, r, ranks, source),
                        [comm = comms[static_cast<size_t>(r)]](float* data, size_t count, void* stream) {
                          check(nccl().all_reduce(data, data, count, ncclFloat32, ncclSum, comm.get(),
                                                  static_cast<cudaStream_t>(stream)),
                                "ncclAllReduce");
                        }});
  }
  return tp;
}

}  // namespace lowbit::model
