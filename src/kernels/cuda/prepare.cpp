// The CUDA kernel table, keyed by codec id, and the adapters that upload a stored tensor in its device layout
// (docs/CUDA.md): rows padded to whole 64-weight chunks, affine scales and biases interleaved so that one load
// fetches both. Everything else stays as the artifact stores it.
#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gemm.h"
#include "matvec.h"
#include "prepare.h"
#include "trellis.h"
#include "lowbit/codec/affine.h"
#include "lowbit/codec/dense.h"
#include "lowbit/codec/hadamard.h"
#include "lowbit/codec/offset_scale.h"
#include "lowbit/codec/trellis.h"
#include "lowbit/codec/two_plane.h"
#include "lowbit/core/checked.h"
#include "lowbit/core/error.h"
#include "lowbit/core/thread_pool.h"
#include "lowbit/kernels/cuda.h"

namespace lowbit::kernels::cuda {

// offset_scale: w = scale (q - offset) is affine with bias = -offset scale. Its codes are the same LSB-first
// bit stream (rows of whole 64-code groups, so whole u32 words); scales and biases become f32 arrays.
codec::EncodedTensor offset_scale_as_affine(const codec::TensorRef& t) {
  namespace os = codec::offset_scale;
  const os::Layout l = os::layout(t.params, t.shape);
  const TensorView &codes = t.arrays.at("codes"), &scales = t.arrays.at("scales");
  const int64_t groups = l.groups_per_row();
  codec::EncodedTensor affine;
  affine.params = {{"bits", l.grid.bits}, {"group_size", os::kGroupSize}, {"scale_dtype", "f32"},
                   {"padded_cols", l.padded_cols}};
  TensorBuffer words = make_buffer(DType::U32, {l.rows, l.row_bytes() / 4});
  std::memcpy(words.bytes.data(), codes.bytes.data(), words.bytes.size());
  for (int64_t r = 0; r < l.rows; ++r)  // offset_scale pads with the zero point, affine with code 0
    for (int64_t c = l.cols; c < l.padded_cols; ++c)
      codec::affine::write_code(words.as<uint32_t>() + r * (l.row_bytes() / 4), c, l.grid.bits, 0);
  TensorBuffer affine_scales = make_buffer(DType::F32, {l.rows, groups}), biases = make_buffer(DType::F32, {l.rows, groups});
  for (int64_t i = 0; i < l.rows * groups; ++i) {
    const float s = load_float(DType::F16, scales.bytes.data(), static_cast<size_t>(i));
    affine_scales.as<float>()[i] = s;
    biases.as<float>()[i] = -static_cast<float>(l.grid.offset) * s;
  }
  affine.arrays.emplace_back("codes", std::move(words));
  affine.arrays.emplace_back("scales", std::move(affine_scales));
  affine.arrays.emplace_back("biases", std::move(biases));
  return affine;
}

namespace {

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// fn(r) for r in [0, rows) on the default pool: the re-layouts of whole 8B-sized models take seconds per core.
// Rows (or row tiles) write disjoint parts of the staged layout.
template <class Fn>
void for_rows(int64_t rows, Fn fn) {
  default_pool().parallel_for(static_cast<size_t>(rows), 16, [&](size_t begin, size_t end) {
    for (size_t r = begin; r < end; ++r) fn(static_cast<int64_t>(r));
  });
}

// rows x src_row bytes -> rows x dst_row bytes (dst_row >= src_row), zero-filled past each source row.
DeviceBuffer upload_padded_rows(std::span<const std::byte> src, int64_t rows, size_t src_row, size_t dst_row) {
  DeviceBuffer out(checked_mul(static_cast<uint64_t>(rows), dst_row, "[prepare_cuda] padded rows"));
  if (src_row == dst_row) {
    out.upload(src.data(), out.size());
    return out;
  }
  std::vector<std::byte> staged(out.size());
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(staged.data() + r * dst_row, src.data() + r * src_row, src_row);
  out.upload(staged.data(), staged.size());
  return out;
}

// Where column `col` of a row sits in the coalesced layout (matvec.h), counted in codes of `bits` bits.
int64_t coalesced_index(int64_t col, int bits) {
  const int64_t step_cols = coalesced_step_cols(bits);
  const int64_t step = col / step_cols, rem = col % step_cols;
  const int64_t t = rem / 128, lane = (rem % 128) / 4, u = rem % 4;
  return (step * 32 + lane) * (128 / bits) + t * 4 + u;
}

// Where code (row, col) sits in the tensor-core layout (AffineMmaDevice in matvec.h): u32 index and bit.
struct MmaSlot {
  int64_t word;
  int bit;
};
MmaSlot mma_slot(int64_t row, int64_t col, int bits, int64_t kblocks) {
  const int64_t kblock_cols = mma_kblock_cols(bits);
  const int64_t tile = row / 16, kb = col / kblock_cols, in_block = col % kblock_cols;
  const int r = static_cast<int>(row % 16), step = static_cast<int>(in_block / 16), kc = static_cast<int>(in_block % 16);
  const int g = r % 8, t = (kc % 8) / 2, e = kc % 2, reg = r / 8 + 2 * (kc / 8);
  const int word = bits == 4 ? step : step / 2;
  const int bit = (bits == 4 ? 4 * reg : 2 * (4 * (step % 2) + reg)) + 16 * e;
  return {((tile * kblocks + kb) * 32 + 4 * g + t) * 4 + word, bit};
}

// Codes of `bits` bits in the tensor-core layout (AffineMmaDevice), uploaded; fill_row(r, codes) writes row r's
// codes, one per byte, into room for the padded width (kblocks whole k-blocks); the first `cols` are used and
// padding rows and columns hold code 0. Row tiles own disjoint words, so they are packed in parallel (fill_row
// is called from several threads).
template <class FillRow>
DeviceBuffer upload_mma_codes(int64_t rows, int64_t cols, int bits, int64_t row_tiles, int64_t kblocks, FillRow fill_row) {
  const int64_t row_words = kblocks * mma_kblock_cols(bits) * bits / 32;
  std::vector<uint32_t> staged(checked_mul(static_cast<uint64_t>(row_tiles * 16), static_cast<uint64_t>(row_words), "[prepare_cuda] codes"));
  default_pool().parallel_for(static_cast<size_t>((rows + 15) / 16), 1, [&](size_t t0, size_t t1) {
    std::vector<uint8_t> codes(static_cast<size_t>(kblocks * mma_kblock_cols(bits)));
    for (int64_t r = static_cast<int64_t>(t0) * 16; r < std::min<int64_t>(rows, static_cast<int64_t>(t1) * 16); ++r) {
      fill_row(r, codes.data());
      for (int64_t c = 0; c < cols; ++c) {
        const MmaSlot slot = mma_slot(r, c, bits, kblocks);
        staged[slot.word] |= uint32_t{codes[c]} << slot.bit;
      }
    }
  });
  DeviceBuffer out(staged.size() * sizeof(uint32_t));
  out.upload(staged.data(), out.size());
  return out;
}

// A prepared weight whose layout the grouped expert kernels take (matvec.h: ExpertLayout); nullopt where its
// layout has no grouped kernel yet.
class GroupableLinear : public CudaLinear {
 public:
  virtual std::optional<ExpertLayout> expert_layout() const = 0;
};

MetaType meta_type(DType t) {
  switch (t) {
    case DType::BF16: return MetaType::bf16;
    case DType::F16: return MetaType::f16;
    case DType::F32: return MetaType::f32;
    default: fail(Errc::unsupported, "[prepare_cuda] element type {} has no CUDA kernel", dtype_name(t));
  }
}

class DenseLinear final : public GroupableLinear {
 public:
  explicit DenseLinear(const codec::TensorRef& t) {
    const TensorView& data = t.arrays.at("data");
    const auto [rows, cols] = codec::matrix_dims(t.shape);
    bytes_ = data.bytes.size();
    if (data.dtype == DType::BF16) {
      upload_coalesced(data, rows, cols);
      return;
    }
    w_ = {nullptr, rows, cols, round_up(cols, kChunkWeights), meta_type(data.dtype)};
    const size_t elem = dtype_size(data.dtype);
    buffer_ = upload_padded_rows(data.bytes, rows, cols * elem, w_.kpad * elem);
    w_.data = buffer_.data();
  }
  int64_t rows() const override { return coalesced_ ? cw_.rows : w_.rows; }
  int64_t cols() const override { return coalesced_ ? cw_.cols : w_.cols; }
  void matmul(const float* x, int m, float* y, Stream s) const override {
    if (coalesced_) return coalesced_matmul(cw_, x, m, y, s);
    dense_matmul(w_, x, m, y, s);
  }
  // bf16: more rows than a decode batch run the tensor-core GEMM (f16/f32 stay on chunks of kMaxBatch rows).
  void gemm(const float* x, int64_t m, float* y, Stream s) const override {
    if (coalesced_ && m > kMaxBatch) return coalesced_gemm(cw_, x, m, y, s);
    CudaLinear::gemm(x, m, y, s);
  }
  uint64_t weight_bytes() const override { return bytes_; }
  std::optional<ExpertLayout> expert_layout() const override {
    ExpertLayout l;
    l.kind = coalesced_ ? ExpertLayout::Kind::coalesced : ExpertLayout::Kind::dense;
    l.dense = w_;
    l.coalesced = cw_;
    return l;
  }

 private:
  void upload_coalesced(const TensorView& data, int64_t rows, int64_t cols) {
    coalesced_ = true;
    cw_ = {nullptr, nullptr, rows, cols, round_up(cols, coalesced_step_cols(16)), 16, 0, MetaType::bf16};
    std::vector<uint16_t> staged(checked_mul(static_cast<uint64_t>(rows), static_cast<uint64_t>(cw_.kpad), "[prepare_cuda] dense"));
    const auto* src = data.as<uint16_t>();
    for_rows(rows, [&](int64_t r) {
      for (int64_t c = 0; c < cols; ++c) staged[r * cw_.kpad + coalesced_index(c, 16)] = src[r * cols + c];
    });
    buffer_ = DeviceBuffer(staged.size() * sizeof(uint16_t));
    buffer_.upload(staged.data(), buffer_.size());
    cw_.codes = buffer_.data();
  }

  bool coalesced_ = false;
  DenseDevice w_;
  CoalescedDevice cw_;
  DeviceBuffer buffer_;
  uint64_t bytes_ = 0;
};

class AffineLinear final : public GroupableLinear {
 public:
  explicit AffineLinear(const codec::TensorRef& t) {
    const codec::affine::Layout l = codec::affine::layout(t.params, t.shape);
    if (l.bits == 4 || (l.bits == 2 && l.group_size >= 32)) {  // the tensor-core layout has no groups of 16
      upload_mma(l, t);
      return;
    }
    coalesced_ = l.bits == 8;
    w_.rows = l.rows;
    w_.cols = l.cols;
    w_.kpad = round_up(l.padded_cols, coalesced_ ? coalesced_step_cols(l.bits) : kChunkWeights);
    w_.bits = l.bits;
    w_.group = static_cast<int>(l.group_size);
    w_.meta_type = meta_type(l.scale_dtype);
    const TensorView& codes = t.arrays.at("codes");
    if (coalesced_) {
      upload_coalesced_codes(l, codes);
    } else {
      codes_ = upload_padded_rows(codes.bytes, l.rows, l.words_per_row() * 4, w_.kpad * l.bits / 8);
    }
    upload_meta(l, t.arrays.at("scales"), t.arrays.at("biases"));
    w_.codes = codes_.as<const uint32_t>();
    w_.meta = meta_.as<const uint32_t>();
    bytes_ = codes.bytes.size() + t.arrays.at("scales").bytes.size() + t.arrays.at("biases").bytes.size();
  }
  int64_t rows() const override { return mma_ ? mw_.rows : w_.rows; }
  int64_t cols() const override { return mma_ ? mw_.cols : w_.cols; }
  void matmul(const float* x, int m, float* y, Stream s) const override {
    if (mma_) return affine_mma_matmul(mw_, x, m, y, s);
    if (coalesced_) return coalesced_matmul(coalesced(), x, m, y, s);
    affine_matmul(w_, x, m, y, s);
  }
  // More rows than a decode batch run a tensor-core GEMM: the tensor-core layout's at 2/4 bits, the tile GEMM's
  // decoding into shared memory at 3/5/6/8 bits; groups of 16 (GGUF's Q2_K, Q3_K, Q6_K) the matvec over chunks of
  // rows.
  void gemm(const float* x, int64_t m, float* y, Stream s) const override {
    if (m <= kMaxBatch || (!mma_ && !coalesced_ && w_.group < 32)) return CudaLinear::gemm(x, m, y, s);
    if (mma_) return affine_mma_gemm(mw_, x, m, y, s);
    if (coalesced_) return coalesced_gemm(coalesced(), x, m, y, s);
    affine_gemm(w_, x, m, y, s);
  }
  uint64_t weight_bytes() const override { return bytes_; }
  // Counts `bytes` as the weight's stored size (a codec re-expressed as affine stores fewer).
  void set_weight_bytes(uint64_t bytes) { bytes_ = bytes; }
  std::optional<ExpertLayout> expert_layout() const override {
    ExpertLayout l;
    if (mma_) {
      l.kind = ExpertLayout::Kind::affine_mma;
      l.mma = mw_;
    } else if (coalesced_) {
      l.kind = ExpertLayout::Kind::coalesced;
      l.coalesced = coalesced();
    } else {
      return std::nullopt;  // 3, 5, 6 bits, 2 in groups of 16: the row-chunk kernel has no grouped instance yet
    }
    return l;
  }

 private:
  void upload_coalesced_codes(const codec::affine::Layout& l, const TensorView& codes) {
    const int64_t device_words = w_.kpad * l.bits / 32;
    std::vector<uint32_t> staged(checked_mul(static_cast<uint64_t>(l.rows), static_cast<uint64_t>(device_words), "[prepare_cuda] codes"));
    for_rows(l.rows, [&](int64_t r) {
      const uint32_t* src = codes.as<uint32_t>() + r * l.words_per_row();
      uint32_t* dst = staged.data() + r * device_words;
      for (int64_t c = 0; c < l.cols; ++c)
        codec::affine::write_code(dst, coalesced_index(c, l.bits), l.bits, codec::affine::read_code(src, c, l.bits));
    });
    codes_ = DeviceBuffer(staged.size() * sizeof(uint32_t));
    codes_.upload(staged.data(), codes_.size());
  }

  // 2 and 4 bits: the tensor-core layout (codes as mma A fragments, meta per 16-row tile).
  void upload_mma(const codec::affine::Layout& l, const codec::TensorRef& t) {
    mma_ = true;
    const int64_t kpad = round_up(l.padded_cols, std::max<int64_t>(mma_kblock_cols(l.bits), l.group_size));
    mw_ = {nullptr, nullptr, l.rows, l.cols, round_up(l.rows, kMmaRows) / 16, kpad / mma_kblock_cols(l.bits),
           l.bits, static_cast<int>(l.group_size), l.scale_dtype != DType::BF16};
    const TensorView& codes = t.arrays.at("codes");
    codes_ = upload_mma_codes(l.rows, l.cols, l.bits, mw_.row_tiles, mw_.kblocks, [&](int64_t r, uint8_t* out) {
      const uint32_t* src = codes.as<uint32_t>() + r * l.words_per_row();
      for (int64_t c = 0; c < l.cols; ++c) out[c] = static_cast<uint8_t>(codec::affine::read_code(src, c, l.bits));
    });
    mw_.codes = codes_.as<const uint32_t>();

    // [row_tiles][kpad / group][16 rows]: a bf16 (scale, bias) pair in one u32, else two f32 words.
    const TensorView &scales = t.arrays.at("scales"), &biases = t.arrays.at("biases");
    const int64_t groups = l.groups_per_row(), device_groups = kpad / l.group_size;
    const uint64_t entries = checked_mul(static_cast<uint64_t>(mw_.row_tiles * 16), static_cast<uint64_t>(device_groups), "[prepare_cuda] meta");
    std::vector<uint32_t> meta(checked_mul(entries, mw_.meta_f32 ? 2 : 1, "[prepare_cuda] meta"));
    for_rows(l.rows, [&](int64_t r) {
      for (int64_t gi = 0; gi < groups; ++gi) {
        const size_t src = static_cast<size_t>(r * groups + gi);
        const int64_t dst = ((r / 16) * device_groups + gi) * 16 + r % 16;
        if (mw_.meta_f32) {
          meta[2 * dst] = std::bit_cast<uint32_t>(load_float(l.scale_dtype, scales.bytes.data(), src));
          meta[2 * dst + 1] = std::bit_cast<uint32_t>(load_float(l.scale_dtype, biases.bytes.data(), src));
        } else {
          meta[dst] = uint32_t{scales.as<uint16_t>()[src]} | uint32_t{biases.as<uint16_t>()[src]} << 16;
        }
      }
    });
    meta_ = DeviceBuffer(meta.size() * sizeof(uint32_t));
    meta_.upload(meta.data(), meta_.size());
    mw_.meta = meta_.as<const uint32_t>();
    bytes_ = codes.bytes.size() + scales.bytes.size() + biases.bytes.size();
  }

  // meta [rows, kpad / group] (scale, bias) pairs; groups past the stored padding stay zero.
  void upload_meta(const codec::affine::Layout& l, const TensorView& scales, const TensorView& biases) {
    const int64_t groups = l.groups_per_row(), device_groups = w_.kpad / w_.group;
    const size_t elem = dtype_size(l.scale_dtype);
    std::vector<std::byte> staged(checked_mul(static_cast<uint64_t>(l.rows * device_groups), 2 * elem, "[prepare_cuda] meta"));
    for (int64_t r = 0; r < l.rows; ++r)
      for (int64_t g = 0; g < groups; ++g) {
        std::byte* dst = staged.data() + (r * device_groups + g) * 2 * elem;
        std::memcpy(dst, scales.bytes.data() + (r * groups + g) * elem, elem);
        std::memcpy(dst + elem, biases.bytes.data() + (r * groups + g) * elem, elem);
      }
    meta_ = DeviceBuffer(staged.size());
    meta_.upload(staged.data(), staged.size());
  }

  CoalescedDevice coalesced() const {
    return {w_.codes, w_.meta, w_.rows, w_.cols, w_.kpad, w_.bits, w_.group, w_.meta_type};
  }

  // 2/4 bits: tensor-core layout; 8 bits: coalesced layout; 3/5/6 bits and 2 in groups of 16: row-chunk layout.
  bool coalesced_ = false, mma_ = false;
  AffineMmaDevice mw_;
  AffineDevice w_;
  DeviceBuffer codes_, meta_;
  uint64_t bytes_ = 0;
};

// Rows of x' and y' one rotated trellis gemm call rotates at a time.
constexpr int64_t kRotatedGemmRows = 512;

// x' and y' of kRotatedGemmRows rows for the widest rotated trellis sides prepared so far, one pair of device
// buffers shared by every rotated TrellisLinear of the process (an 8B model has 224 linears), grown as weights are
// prepared and freed with the last of them. So gemm on rotated trellis weights serves one stream at a time.
class RotatedGemmScratch {
 public:
  static std::shared_ptr<RotatedGemmScratch> at_least(int64_t x_cols, int64_t y_cols) {
    static std::mutex mutex;
    static std::weak_ptr<RotatedGemmScratch> shared;
    const std::lock_guard<std::mutex> lock(mutex);
    std::shared_ptr<RotatedGemmScratch> s = shared.lock();
    if (!s) shared = s = std::make_shared<RotatedGemmScratch>();
    grow(s->x_, x_cols);
    grow(s->y_, y_cols);
    return s;
  }
  float* x() const { return x_.as<float>(); }
  float* y() const { return y_.as<float>(); }

 private:
  static void grow(DeviceBuffer& b, int64_t cols) {
    const uint64_t bytes = checked_mul(static_cast<uint64_t>(kRotatedGemmRows * cols), sizeof(float), "[prepare_cuda] gemm scratch");
    if (b.size() < bytes) b = DeviceBuffer(bytes);
  }
  DeviceBuffer x_, y_;
};

// The trellis kernels decode k = 2..4 bits per step of L >= 8 state bits and rotate sides of up to kMaxRotation.
std::string trellis_without_kernel(const codec::TensorRef& t) {
  const codec::trellis::Layout l = codec::trellis::parse_layout(t.params, t.shape);
  if (l.k < 2 || l.k > 4 || l.L < 8)
    return fmt::format("[prepare_cuda] trellis k {} L {} has no CUDA kernel", l.k, l.L);
  for (const auto& [rotated, n] : {std::pair{l.rotate_input, l.padded_cols}, std::pair{l.rotate_output, l.padded_rows}})
    if (rotated && n > kMaxRotation)
      return fmt::format("[prepare_cuda] trellis rotation of size {} exceeds {}", n, kMaxRotation);
  return {};
}

class TrellisLinear final : public CudaLinear {
 public:
  explicit TrellisLinear(const codec::TensorRef& t) {
    namespace tr = codec::trellis;
    const tr::Layout l = tr::parse_layout(t.params, t.shape);  // trellis_without_kernel passed it
    rows_ = l.rows;
    cols_ = l.cols;
    // A rotated side runs on the padded width: x' = R_in x [m, padded_cols], y' [m, padded_rows].
    w_.rows = l.rotate_output ? l.padded_rows : l.rows;
    w_.cols = l.rotate_input ? l.padded_cols : l.cols;
    if (l.rotate_input) {
      in_ = Rotation(l.padded_cols, l.input_seed);
      x_rotated_ = DeviceBuffer(checked_mul(static_cast<uint64_t>(kMaxBatch * l.padded_cols), sizeof(float), "[prepare_cuda] x'"));
    }
    if (l.rotate_output) {
      out_ = Rotation(l.padded_rows, l.output_seed);
      y_rotated_ = DeviceBuffer(checked_mul(static_cast<uint64_t>(kMaxBatch * l.padded_rows), sizeof(float), "[prepare_cuda] y'"));
    }
    if (l.rotate_input || l.rotate_output)
      gemm_scratch_ = RotatedGemmScratch::at_least(l.rotate_input ? l.padded_cols : 0, l.rotate_output ? l.padded_rows : 0);
    w_.padded_rows = l.padded_rows;
    w_.chunks = (l.col_tiles() + 3) / 4;
    w_.k = l.k;
    w_.L = l.L;
    w_.mad1 = l.code == tr::Code::mad1;
    upload_codes(l, t.arrays.at("codes"));
    upload_scales(l, t.arrays.at("scales"));
    bytes_ = t.arrays.at("codes").bytes.size() + t.arrays.at("scales").bytes.size();
  }
  int64_t rows() const override { return rows_; }
  int64_t cols() const override { return cols_; }
  // With rotation the activations pass through per-weight scratch buffers: one stream at a time per weight.
  void matmul(const float* x, int m, float* y, Stream s) const override {
    if (m < 1 || m > kMaxBatch) fail(Errc::limit, "[cuda matmul] batch {} outside [1, {}]", m, kMaxBatch);
    multiply(x, m, y, x_rotated_.as<float>(), y_rotated_.as<float>(), s,
             [](const TrellisDevice& w, const float* x, int64_t m, float* y, Stream s) {
               trellis_matmul(w, x, static_cast<int>(m), y, s);
             });
  }
  // With rotation, chunks of kRotatedGemmRows rows pass through the process's shared scratch (one stream at a
  // time for all rotated trellis weights); without, one GEMM over all rows.
  void gemm(const float* x, int64_t m, float* y, Stream s) const override {
    if (!gemm_scratch_) return trellis_gemm(w_, x, m, y, s);
    if (m < 1) fail(Errc::limit, "[cuda trellis gemm] {} rows", m);
    for (int64_t row = 0; row < m; row += kRotatedGemmRows)
      multiply(x + row * cols_, std::min(kRotatedGemmRows, m - row), y + row * rows_, gemm_scratch_->x(),
               gemm_scratch_->y(), s, trellis_gemm);
  }
  uint64_t weight_bytes() const override { return bytes_; }

 private:
  // [row_tiles, col_tiles, 16 k] u16 -> [row_tiles][chunks][16 rows][4 tiles][k] u16 (trellis.h).
  void upload_codes(const codec::trellis::Layout& l, const TensorView& codes) {
    const int k = l.k, words = l.words_per_tile();
    std::vector<uint16_t> staged(checked_mul(static_cast<uint64_t>(l.row_tiles() * w_.chunks), 16 * 4 * k, "[prepare_cuda] trellis"));
    const auto* src = codes.as<uint16_t>();
    for_rows(l.row_tiles(), [&](int64_t rt) {
      for (int64_t ct = 0; ct < l.col_tiles(); ++ct)
        for (int r = 0; r < 16; ++r)
          std::memcpy(&staged[(((rt * w_.chunks + ct / 4) * 16 + r) * 4 + ct % 4) * k],
                      src + (rt * l.col_tiles() + ct) * words + r * k, sizeof(uint16_t) * k);
    });
    codes_ = DeviceBuffer(staged.size() * sizeof(uint16_t));
    codes_.upload(staged.data(), codes_.size());
    w_.codes = codes_.as<const uint32_t>();
  }
  void upload_scales(const codec::trellis::Layout& l, const TensorView& scales) {
    std::vector<float> staged(static_cast<size_t>(l.padded_rows));
    for (int64_t r = 0; r < l.padded_rows; ++r)
      staged[r] = load_float(DType::F16, scales.bytes.data(), static_cast<size_t>(l.per_row_scale ? r : 0));
    scales_ = DeviceBuffer(staged.size() * sizeof(float));
    scales_.upload(staged.data(), scales_.size());
    w_.scales = scales_.as<const float>();
  }

  // y = x @ W^T through R_in and R_out^T where the tensor has them, with scratch for m rows of x' and y'.
  template <class Kernel>
  void multiply(const float* x, int64_t m, float* y, float* x_scratch, float* y_scratch, Stream s, Kernel kernel) const {
    const float* xin = x;
    if (in_.device.n > 0) {
      rotate(in_.device, false, x, cols_, static_cast<int>(m), x_scratch, w_.cols, s);
      xin = x_scratch;
    }
    if (out_.device.n == 0) return kernel(w_, xin, m, y, s);
    kernel(w_, xin, m, y_scratch, s);
    rotate(out_.device, true, y_scratch, w_.rows, static_cast<int>(m), y, rows_, s);
  }

  // R = H D / sqrt(n) of codec/hadamard.h on the device (signs and the small Hadamard factor).
  struct Rotation {
    Rotation() = default;
    Rotation(int64_t n, uint64_t seed) {
      const int64_t small = codec::hadamard::small_factor(n);
      std::vector<float> signs(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) signs[static_cast<size_t>(i)] = codec::hadamard::random_sign(seed, static_cast<uint64_t>(i));
      const std::vector<int8_t> matrix = codec::hadamard::small_matrix(small);
      signs_ = DeviceBuffer(signs.size() * sizeof(float));
      signs_.upload(signs.data(), signs_.size());
      matrix_ = DeviceBuffer(matrix.size());
      matrix_.upload(matrix.data(), matrix_.size());
      device = {signs_.as<const float>(), matrix_.as<const int8_t>(), n, static_cast<int>(small)};
    }
    RotationDevice device;
    DeviceBuffer signs_, matrix_;
  };

  int64_t rows_ = 0, cols_ = 0;
  TrellisDevice w_;
  DeviceBuffer codes_, scales_;
  Rotation in_, out_;
  DeviceBuffer x_rotated_, y_rotated_;
  std::shared_ptr<RotatedGemmScratch> gemm_scratch_;  // rotated tensors only
  uint64_t bytes_ = 0;
};

// Two 2-bit planes in the tensor-core layout (TwoPlaneDevice in matvec.h); quint5/trit3 storage and slim
// metadata are expanded to planes and per-group values here. bf16 metadata stays bf16 (slim's expansion is
// exact in bf16: alpha, the single residual scale and their negations).
class TwoPlaneLinear final : public CudaLinear {
 public:
  explicit TwoPlaneLinear(const codec::TensorRef& t) {
    namespace tp = codec::two_plane;
    const tp::Layout l = tp::layout(t.params, t.shape);
    w_ = {nullptr, nullptr, nullptr, l.rows, l.cols, round_up(l.rows, kMmaRows) / 16, l.padded_cols / 128,
          l.scale_dtype != DType::BF16};
    // row_plane_codes writes both planes; each upload keeps one (the other goes to per-call scratch).
    const auto padded = static_cast<size_t>(l.padded_cols);
    base_ = upload_mma_codes(l.rows, l.cols, 2, w_.row_tiles, w_.kblocks, [&](int64_t r, uint8_t* out) {
      std::vector<uint8_t> residual(padded);
      tp::row_plane_codes(l, t.arrays, r, out, residual.data());
    });
    residual_ = upload_mma_codes(l.rows, l.cols, 2, w_.row_tiles, w_.kblocks, [&](int64_t r, uint8_t* out) {
      std::vector<uint8_t> base(padded);
      tp::row_plane_codes(l, t.arrays, r, base.data(), out);
    });
    w_.base = base_.as<const uint32_t>();
    w_.residual = residual_.as<const uint32_t>();

    const tp::ExpandedMetadata e = tp::expand_metadata(l, t.arrays);
    const int64_t groups = l.groups_per_row();
    const int words = w_.meta_f32 ? 4 : 2;
    std::vector<uint32_t> meta(checked_mul(static_cast<uint64_t>(w_.row_tiles * 16 * groups), words, "[prepare_cuda] meta"));
    auto bf16_pair = [](float scale, float bias) {
      return uint32_t{f32_to_bf16(scale)} | uint32_t{f32_to_bf16(bias)} << 16;
    };
    for (int64_t r = 0; r < l.rows; ++r)
      for (int64_t gi = 0; gi < groups; ++gi) {
        const size_t src = static_cast<size_t>(r * groups + gi);
        uint32_t* dst = meta.data() + (((r / 16) * groups + gi) * 16 + r % 16) * words;
        if (w_.meta_f32) {
          const float v[4] = {e.base_scales[src], e.base_biases[src], e.residual_scales[src], e.residual_biases[src]};
          std::memcpy(dst, v, sizeof(v));
        } else {
          dst[0] = bf16_pair(e.base_scales[src], e.base_biases[src]);
          dst[1] = bf16_pair(e.residual_scales[src], e.residual_biases[src]);
        }
      }
    meta_ = DeviceBuffer(meta.size() * sizeof(uint32_t));
    meta_.upload(meta.data(), meta_.size());
    w_.meta = meta_.as<const uint32_t>();
    for (const auto& [name, view] : t.arrays.items) bytes_ += view.bytes.size();
  }
  int64_t rows() const override { return w_.rows; }
  int64_t cols() const override { return w_.cols; }
  void matmul(const float* x, int m, float* y, Stream s) const override { two_plane_matmul(w_, x, m, y, s); }
  void gemm(const float* x, int64_t m, float* y, Stream s) const override {
    if (m > kMaxBatch) return two_plane_gemm(w_, x, m, y, s);
    CudaLinear::gemm(x, m, y, s);
  }
  uint64_t weight_bytes() const override { return bytes_; }

 private:
  TwoPlaneDevice w_;
  DeviceBuffer base_, residual_, meta_;
  uint64_t bytes_ = 0;
};

std::unique_ptr<CudaLinear> prepare_offset_scale(const codec::TensorRef& t) {
  const codec::EncodedTensor affine = offset_scale_as_affine(t);
  const codec::TensorRef ref{&codec::codec_or_throw("affine", "prepare_cuda"), affine.params, t.shape, affine.views()};
  auto linear = std::make_unique<AffineLinear>(ref);
  linear->set_weight_bytes(t.arrays.at("codes").bytes.size() + t.arrays.at("scales").bytes.size());
  return linear;
}

template <class T>
std::unique_ptr<CudaLinear> make(const codec::TensorRef& t) {
  return std::make_unique<T>(t);
}

constexpr std::array kCudaKernels{
    CudaKernelEntry{"dense", make<DenseLinear>},
    CudaKernelEntry{"affine", make<AffineLinear>},
    CudaKernelEntry{"offset_scale", prepare_offset_scale},
    CudaKernelEntry{"trellis", make<TrellisLinear>, trellis_without_kernel},
    CudaKernelEntry{"two_plane", make<TwoPlaneLinear>},
};

// The device arrays a grouped kernel reads for one expert, and whether two experts share everything else.
ExpertArrays expert_arrays(const ExpertLayout& l) {
  switch (l.kind) {
    case ExpertLayout::Kind::dense: return {l.dense.data, nullptr};
    case ExpertLayout::Kind::coalesced: return {l.coalesced.codes, l.coalesced.meta};
    case ExpertLayout::Kind::affine_mma: return {l.mma.codes, l.mma.meta};
  }
  return {};
}

bool same_layout(const ExpertLayout& a, const ExpertLayout& b) {
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case ExpertLayout::Kind::dense:
      return a.dense.rows == b.dense.rows && a.dense.cols == b.dense.cols && a.dense.kpad == b.dense.kpad &&
             a.dense.type == b.dense.type;
    case ExpertLayout::Kind::coalesced: {
      const CoalescedDevice &x = a.coalesced, &y = b.coalesced;
      return x.rows == y.rows && x.cols == y.cols && x.kpad == y.kpad && x.bits == y.bits && x.group == y.group &&
             x.meta_type == y.meta_type;
    }
    case ExpertLayout::Kind::affine_mma: {
      const AffineMmaDevice &x = a.mma, &y = b.mma;
      return x.rows == y.rows && x.cols == y.cols && x.row_tiles == y.row_tiles && x.kblocks == y.kblocks &&
             x.bits == y.bits && x.group == y.group && x.meta_f32 == y.meta_f32;
    }
  }
  return false;
}

}  // namespace

struct CudaExperts::Impl {
  std::vector<std::unique_ptr<CudaLinear>> experts;
  ExpertLayout layout;
  DeviceBuffer table;  // [experts] ExpertArrays
};

CudaExperts::CudaExperts(std::vector<std::unique_ptr<CudaLinear>> experts, std::string_view what)
    : impl_(std::make_unique<Impl>()) {
  if (experts.empty()) fail(Errc::internal, "[prepare_cuda] {}: no experts", what);
  std::vector<ExpertArrays> table;
  for (size_t e = 0; e < experts.size(); ++e) {
    const auto* groupable = dynamic_cast<const GroupableLinear*>(experts[e].get());
    const std::optional<ExpertLayout> l = groupable ? groupable->expert_layout() : std::nullopt;
    if (!l)
      fail(Errc::unsupported,
           "[prepare_cuda] {}: this codec's layout has no grouped expert kernel on the GPU yet "
           "(dense and affine 4/8 bits and 2 bits in groups of 32 or more have)",
           what);
    if (e == 0) impl_->layout = *l;
    if (!same_layout(impl_->layout, *l))
      fail(Errc::unsupported,
           "[prepare_cuda] {}: expert {} is stored unlike expert 0 (the grouped kernels take one "
           "layout per role)",
           what, e);
    table.push_back(expert_arrays(*l));
  }
  impl_->experts = std::move(experts);
  impl_->table = DeviceBuffer(table.size() * sizeof(ExpertArrays));
  impl_->table.upload(table.data(), impl_->table.size());
}

CudaExperts::~CudaExperts() = default;
int64_t CudaExperts::count() const { return static_cast<int64_t>(impl_->experts.size()); }
int64_t CudaExperts::rows() const { return impl_->experts.front()->rows(); }
int64_t CudaExperts::cols() const { return impl_->experts.front()->cols(); }
const CudaLinear& CudaExperts::expert(int64_t e) const { return *impl_->experts.at(static_cast<size_t>(e)); }

void CudaExperts::grouped_matmul(const float* x, const Groups& g, int batch, float* y, Stream s) const {
  const ExpertGroups groups{impl_->table.as<const ExpertArrays>(), g.expert, g.start, g.count, g.x_rows, g.max_groups};
  cuda::grouped_matmul(impl_->layout, groups, x, batch, y, s);
}

uint64_t CudaExperts::weight_bytes() const {
  uint64_t bytes = 0;
  for (const auto& e : impl_->experts) bytes += e->weight_bytes();
  return bytes;
}

std::span<const CudaKernelEntry> cuda_kernel_table() { return kCudaKernels; }

std::unique_ptr<CudaLinear> prepare_cuda(const codec::TensorRef& tensor) {
  for (const auto& entry : kCudaKernels) {
    if (entry.codec_id != tensor.codec->id) continue;
    if (entry.no_kernel)
      if (const std::string why = entry.no_kernel(tensor); !why.empty()) throw Error(Errc::unsupported, why);
    return entry.prepare(tensor);
  }
  fail(Errc::unsupported, "[prepare_cuda] no CUDA kernel for codec '{}'", tensor.codec->id);
}

}  // namespace lowbit::kernels::cuda
