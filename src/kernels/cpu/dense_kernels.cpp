// Dense weights (bf16 / f16 / f32): rows converted on the fly, dot products in f32.
#include "kernels/cpu/dense_kernels.h"

#include <vector>

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
    pool.parallel_for(static_cast<size_t>(rows_), 16, [&](size_t r0, size_t r1) {
      std::vector<float> row(static_cast<size_t>(cols_));
      for (size_t r = r0; r < r1; ++r) {
        decode_row(static_cast<int64_t>(r), row.data());
        for (int64_t i = 0; i < m; ++i) {
          const float* xi = x + i * cols_;
          float acc = 0.0f;
          for (int64_t c = 0; c < cols_; ++c) acc += row[c] * xi[c];
          y[i * rows_ + static_cast<int64_t>(r)] = acc;
        }
      }
    });
  }

  void gather_rows(std::span<const int32_t> ids, float* out) const override {
    check_gather_ids(ids, rows_);
    for (size_t i = 0; i < ids.size(); ++i) decode_row(ids[i], out + static_cast<int64_t>(i) * cols_);
  }

 private:
  void decode_row(int64_t r, float* out) const {
    for (int64_t c = 0; c < cols_; ++c)
      out[c] = load_float(data_.dtype, data_.bytes.data(), static_cast<size_t>(r * cols_ + c));
  }
  TensorView data_;
  int64_t rows_ = 0, cols_ = 0;
};

}  // namespace

std::unique_ptr<CpuLinear> prepare_dense(const codec::TensorRef& tensor) {
  return std::make_unique<DenseLinear>(tensor);
}

}  // namespace lowbit::kernels
