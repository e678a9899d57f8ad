#include "trellis_kernels.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "simd.h"
#include "lowbit/codec/hadamard.h"
#include "lowbit/codec/trellis.h"
#include "lowbit/core/thread_pool.h"

namespace lowbit::kernels {

namespace {

namespace tr = codec::trellis;

class TrellisLinear final : public CpuLinear {
 public:
  explicit TrellisLinear(const codec::TensorRef& t) : tensor_(t), layout_(tr::parse_layout(t.params, t.shape)) {
    if (layout_.rotate_input) r_in_.emplace(layout_.padded_cols, layout_.input_seed);
    if (layout_.rotate_output) r_out_.emplace(layout_.padded_rows, layout_.output_seed);
    table_ = tr::code_table(layout_.code, layout_.L);
    codes_ = t.arrays.at("codes").bytes.data();
    const TensorView& scales = t.arrays.at("scales");
    scales_.resize(static_cast<size_t>(layout_.padded_rows));
    for (int64_t r = 0; r < layout_.padded_rows; ++r)
      scales_[r] = load_float(DType::F16, scales.bytes.data(), static_cast<size_t>(layout_.per_row_scale ? r : 0));
  }
  int64_t rows() const override { return layout_.rows; }
  int64_t cols() const override { return layout_.cols; }
  uint64_t weight_bytes() const override {
    return tensor_.arrays.at("codes").bytes.size() + tensor_.arrays.at("scales").bytes.size();
  }

  // y [m, rows] = x [m, cols] @ W^T = R_out^T (W' (R_in x)).
  void matmul(const float* x, int64_t m, float* y, ThreadPool& pool) const override {
    const size_t pc = static_cast<size_t>(layout_.padded_cols), pr = static_cast<size_t>(layout_.padded_rows);
    std::vector<float> xr(static_cast<size_t>(m) * pc, 0.0f);  // x' [m, padded_cols]
    for (int64_t i = 0; i < m; ++i) {
      std::copy_n(x + i * layout_.cols, layout_.cols, xr.data() + i * pc);
      if (r_in_) r_in_->forward(xr.data() + i * pc);
    }
    std::vector<float> yr(static_cast<size_t>(m) * pr);  // y' [m, padded_rows]
    const size_t k_chunk = std::min<size_t>(pc, 1024);
    simd::tiled_matmul(
        pr, pc, k_chunk,
        [&](size_t r0, size_t, size_t k0, size_t k1, float* out, size_t stride) { decode(r0, k0, k1, out, stride); },
        xr.data(), pc, static_cast<size_t>(m), yr.data(), pr, pool);
    for (int64_t i = 0; i < m; ++i) {
      if (r_out_) r_out_->inverse(yr.data() + i * pr);
      std::copy_n(yr.data() + i * pr, layout_.rows, y + i * layout_.rows);
    }
  }

  void gather_rows(std::span<const int32_t> ids, float* out) const override {
    check_gather_ids(ids, layout_.rows);
    for (size_t i = 0; i < ids.size(); ++i)
      tr::decode_rows(tensor_.params, tensor_.shape, tensor_.arrays, ids[i], ids[i] + 1,
                      out + static_cast<int64_t>(i) * layout_.cols);
  }

 private:
  // Rows [r0, r0 + 16) x columns [k0, k1) of W' (tile-aligned) into out (row stride `stride`): the same
  // arithmetic as codec::trellis::decode_tile, with the scales converted once.
  void decode(size_t r0, size_t k0, size_t k1, float* out, size_t stride) const {
    const size_t wpt = static_cast<size_t>(layout_.words_per_tile());
    const size_t tile_row = r0 / tr::kTileDim;
    float tile[tr::kBlock];
    uint16_t words[tr::kBlock * 4 / 16];
    for (size_t c0 = k0; c0 < k1; c0 += tr::kTileDim) {
      const size_t index = tile_row * static_cast<size_t>(layout_.col_tiles()) + c0 / tr::kTileDim;
      std::memcpy(words, codes_ + index * wpt * 2, wpt * 2);
      tr::decode_block(words, tr::kBlock, layout_.k, layout_.L, table_, tile);
      for (int r = 0; r < tr::kTileDim; ++r) {
        const float s = scales_[r0 + r];
        float* dst = out + r * stride + (c0 - k0);
        for (int c = 0; c < tr::kTileDim; ++c) dst[c] = tile[r * tr::kTileDim + c] * s;
      }
    }
  }

  codec::TensorRef tensor_;
  tr::Layout layout_;
  std::optional<codec::hadamard::RandomizedHadamard> r_in_, r_out_;
  const float* table_ = nullptr;
  const std::byte* codes_ = nullptr;  // [row_tiles, col_tiles, 16 k] U16, possibly unaligned
  std::vector<float> scales_;         // per padded row
};

}  // namespace

std::unique_ptr<CpuLinear> prepare_trellis(const codec::TensorRef& tensor) {
  return std::make_unique<TrellisLinear>(tensor);
}

}  // namespace lowbit::kernels
