// The CPU kernel table, keyed by codec id. Adding a codec: one row here next to its row in the codec registry.
#include <array>

#include "affine_kernels.h"
#include "dense_kernels.h"
#include "offset_scale_kernels.h"
#include "trellis_kernels.h"
#include "two_plane_kernels.h"
#include "lowbit/core/error.h"
#include "lowbit/kernels/cpu.h"

namespace lowbit::kernels {

namespace {
constexpr std::array kCpuKernels{
    CpuKernelEntry{"dense", prepare_dense},
    CpuKernelEntry{"affine", prepare_affine},
    CpuKernelEntry{"trellis", prepare_trellis},
    CpuKernelEntry{"offset_scale", prepare_offset_scale},
    CpuKernelEntry{"two_plane", prepare_two_plane},
};
}  // namespace

std::span<const CpuKernelEntry> cpu_kernel_table() { return kCpuKernels; }

std::unique_ptr<CpuLinear> prepare_cpu(const codec::TensorRef& tensor) {
  for (const auto& entry : kCpuKernels)
    if (entry.codec_id == tensor.codec->id) return entry.prepare(tensor);
  fail(Errc::unsupported, "[prepare_cpu] no CPU kernel for codec '{}'", tensor.codec->id);
}

void check_gather_ids(std::span<const int32_t> ids, int64_t rows) {
  if (ids.size() > kMaxGatherIds) fail(Errc::limit, "[gather_rows] {} ids exceed the bound {}", ids.size(), kMaxGatherIds);
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= rows) fail(Errc::format, "[gather_rows] id {} at position {} outside [0, {})", ids[i], i, rows);
}

}  // namespace lowbit::kernels
