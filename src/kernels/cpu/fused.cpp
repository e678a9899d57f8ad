// Kernels over arrays they own: an encoding held in memory (a freshly quantized tensor), and fused matrices, whose
// parts' arrays are concatenated along the rows into one allocation per array and prepared like any stored tensor
// of shape [sum of rows, cols].
#include <vector>

#include "lowbit/core/checked.h"
#include "lowbit/core/error.h"
#include "lowbit/kernels/cpu.h"

namespace lowbit::kernels {

namespace {

// Owns an encoding's arrays and forwards to the kernel prepared over them.
class OwningLinear final : public CpuLinear {
 public:
  OwningLinear(const codec::Codec& codec, const Shape& shape, codec::EncodedTensor tensor)
      : tensor_(std::move(tensor)), inner_(prepare_cpu({&codec, tensor_.params, shape, tensor_.views()})) {
    if (!inner_->reads_stored_arrays()) tensor_.arrays.clear();  // the kernel's copy replaces them
  }
  int64_t rows() const override { return inner_->rows(); }
  int64_t cols() const override { return inner_->cols(); }
  uint64_t weight_bytes() const override { return inner_->weight_bytes(); }
  void matmul(const float* x, int64_t m, float* y, ThreadPool& pool) const override { inner_->matmul(x, m, y, pool); }
  void gather_rows(std::span<const int32_t> ids, float* out) const override { inner_->gather_rows(ids, out); }
  bool reads_stored_arrays() const override { return false; }  // the arrays are its own

 private:
  codec::EncodedTensor tensor_;  // the storage inner_ views (declared first: built before inner_)
  std::unique_ptr<CpuLinear> inner_;
};

void check_compatible(std::span<const codec::TensorRef> parts) {
  if (parts.empty()) fail(Errc::shape, "[prepare_cpu_fused] no matrices to fuse");
  const codec::TensorRef& first = parts.front();
  for (size_t i = 0; i < parts.size(); ++i) {
    const codec::TensorRef& p = parts[i];
    if (p.shape.size() != 2) fail(Errc::shape, "[prepare_cpu_fused] part {} has rank {}, not 2", i, p.shape.size());
    if (p.codec != first.codec || p.params != first.params || p.shape[1] != first.shape[1])
      fail(Errc::shape, "[prepare_cpu_fused] part {} ({} {} {}) is not row-compatible with part 0 ({} {} {})", i,
           p.codec->id, p.params.dump(), shape_str(p.shape), first.codec->id, first.params.dump(),
           shape_str(first.shape));
    for (const codec::ArraySpec& spec : p.codec->arrays(p.params, p.shape))
      if (spec.shape.empty() || spec.shape[0] != p.shape[0])
        fail(Errc::unsupported, "[prepare_cpu_fused] codec '{}': array '{}' is not row-major in the rows",
             p.codec->id, spec.role);
  }
}

}  // namespace

std::unique_ptr<CpuLinear> prepare_cpu_owned(const codec::Codec& codec, const Shape& shape,
                                             codec::EncodedTensor tensor) {
  return std::make_unique<OwningLinear>(codec, shape, std::move(tensor));
}

std::unique_ptr<CpuLinear> prepare_cpu_fused(std::span<const codec::TensorRef> parts) {
  check_compatible(parts);
  const codec::TensorRef& first = parts.front();
  int64_t rows = 0;
  for (const codec::TensorRef& p : parts)
    rows = static_cast<int64_t>(checked_add(static_cast<uint64_t>(rows), static_cast<uint64_t>(p.shape[0]),
                                            "[prepare_cpu_fused] rows"));
  const Shape shape{rows, first.shape[1]};
  codec::EncodedTensor fused{first.params, {}};
  for (const codec::ArraySpec& spec : first.codec->arrays(first.params, shape)) {
    TensorBuffer buffer = make_buffer(spec.dtype, spec.shape);
    size_t offset = 0;
    for (const codec::TensorRef& p : parts) {
      const auto bytes = p.arrays.at(spec.role).bytes;
      if (offset + bytes.size() > buffer.bytes.size())
        fail(Errc::truncated, "[prepare_cpu_fused] array '{}' is larger than its spec", spec.role);
      std::copy(bytes.begin(), bytes.end(), buffer.bytes.begin() + static_cast<std::ptrdiff_t>(offset));
      offset += bytes.size();
    }
    if (offset != buffer.bytes.size())
      fail(Errc::truncated, "[prepare_cpu_fused] array '{}' holds {} bytes, expected {}", spec.role, offset,
           buffer.bytes.size());
    fused.arrays.emplace_back(spec.role, std::move(buffer));
  }
  return prepare_cpu_owned(*first.codec, shape, std::move(fused));
}

}  // namespace lowbit::kernels
