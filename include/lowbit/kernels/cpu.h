// CPU kernels: a weight is prepared once from its stored arrays (possibly re-laid out for the kernel, in
// bounded scratch, never expanded to a dense matrix) and then multiplies activations or gathers rows.
// Dispatch is by codec id through a table (src/kernels/cpu/registry.cpp) that must cover every codec in the
// codec registry; tests/kernels checks that coverage.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "lowbit/codec/codec.h"

namespace lowbit {
class ThreadPool;
}

namespace lowbit::kernels {

// A prepared weight W of logical shape [rows, cols] = [out_features, in_features].
class CpuLinear {
 public:
  virtual ~CpuLinear() = default;
  virtual int64_t rows() const = 0;
  virtual int64_t cols() const = 0;
  // y [m, rows] = x [m, cols] @ W^T. m == 1 takes the matvec path. f32 in and out.
  virtual void matmul(const float* x, int64_t m, float* y, ThreadPool& pool) const = 0;
  // out [ids.size(), cols] = W[ids, :], dequantizing only those rows. ids are checked against rows().
  virtual void gather_rows(std::span<const int32_t> ids, float* out) const = 0;
  // Bytes of weight data read by one matmul (for effective-bandwidth figures).
  virtual uint64_t weight_bytes() const = 0;
  // Whether the kernel still reads the stored arrays it was prepared from; false when prepare re-laid them out
  // into its own copy, which replaces them (the caller may then release or unmap them).
  virtual bool reads_stored_arrays() const { return true; }
};

struct CpuKernelEntry {
  std::string_view codec_id;
  // The tensor has passed codec::validate_tensor; its arrays stay alive as long as the returned object.
  std::unique_ptr<CpuLinear> (*prepare)(const codec::TensorRef& tensor);
};

std::span<const CpuKernelEntry> cpu_kernel_table();

// Prepares a validated tensor for the CPU (Errc::unsupported when no kernel exists for its codec).
std::unique_ptr<CpuLinear> prepare_cpu(const codec::TensorRef& tensor);

// Prepares an encoding held in memory (a freshly quantized tensor, validated): the returned object owns its
// arrays, so it stays usable after the caller's copy is gone.
std::unique_ptr<CpuLinear> prepare_cpu_owned(const codec::Codec& codec, const Shape& shape,
                                             codec::EncodedTensor tensor);

// Fuses row-compatible matrices (same codec, params and width; e.g. q/k/v or gate/up) into one allocation and
// returns one CpuLinear whose rows are theirs, in order: one kernel call computes them all. The originals stay
// usable as views. Works for every codec whose arrays all have the rows as their first dimension; others get
// Errc::unsupported, incompatible parts Errc::shape.
std::unique_ptr<CpuLinear> prepare_cpu_fused(std::span<const codec::TensorRef> parts);

// Gathered ids beyond this are refused: embedding lookups come in bounded batches (seed 001).
inline constexpr size_t kMaxGatherIds = 1 << 16;

// Checks ids against [0, rows) and the batch bound; throws Errc::format naming the bad id.
void check_gather_ids(std::span<const int32_t> ids, int64_t rows);

}  // namespace lowbit::kernels
