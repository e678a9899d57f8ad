// Dense weights (bf16 / f16 / f32): batch-1 rows converted in registers and dotted with SIMD (simd.h); the
// batched path converts a tile of rows once into scratch and reuses it across the activations.
#include "dense_kernels.h"

#include <algorithm>

#include "simd.h"
#include "lowbit/core/thread_pool.h"

namespace lowbit::kernels {

namespace {

class DenseLinear final : public CpuLinear {
 public:
  explicit DenseLinear(const codec::TensorRef& t) : data_(t.arrays.at("data")) {
    std::tie(rows_, cols_) = codec::matrix_dims(t.shape);
  }
  int64_t rows() const override { return rows_; }
  int64_t cols() const override { return cols_; }
  uint64_t weight_bytes() const override { return data_.bytes.size(); }

  // y [m, rows] = x [m, cols] @ W^T, parallel over output rows.
  void matmul(const float* x, int64_t m, float* y, ThreadPool& pool) const override {
    const size_t rows = static_cast<size_t>(rows_), cols = static_cast<size_t>(cols_);
    if (m == 1) {
      pool.parallel_for(rows, 16, [&](size_t r0, size_t r1) {
        simd::dense_matvec(data_.dtype, data_.bytes.data(), cols, x, r0, r1, y + r0);
      });
      return;
    }
    simd::tiled_matmul(
        rows, cols, 1024,
        [&](size_t r0, size_t r1, size_t k0, size_t k1, float* out, size_t stride) {
          for (size_t r = r0; r < r1; ++r) convert(r, k0, k1 - k0, out + (r - r0) * stride);
        },
        x, cols, static_cast<size_t>(m), y, rows, pool);
  }

  void gather_rows(std::span<const int32_t> ids, float* out) const override {
    check_gather_ids(ids, rows_);
    for (size_t i = 0; i < ids.size(); ++i)
      convert(static_cast<size_t>(ids[i]), 0, static_cast<size_t>(cols_), out + static_cast<int64_t>(i) * cols_);
  }

 private:
  // out[0, n) = W[r, c0 : c0 + n) as f32.
  void convert(size_t r, size_t c0, size_t n, float* out) const {
    const size_t element = r * static_cast<size_t>(cols_) + c0;
    simd::to_f32(data_.dtype, data_.bytes.data() + element * dtype_size(data_.dtype), n, out);
  }

  TensorView data_;
  int64_t rows_ = 0, cols_ = 0;
};

}  // namespace

std::unique_ptr<CpuLinear> prepare_dense(const codec::TensorRef& tensor) {
  return std::make_unique<DenseLinear>(tensor);
}

}  // namespace lowbit::kernels
