// The seed 004 depth decoder (include/lowbit/model/depth_decoder.h): the loader, and the CPU backend of the frame
// structure in depth_decoder_impl.h. Matmuls accumulate every output in fp32 over the inputs in order (MLX's CPU
// gemm for f16/bf16, and the rule for quantized weights), vectorized across outputs only, so that the sum order
// never changes. src/kernels/cuda/depth_ops.cu repeats every operation here for the GPU, operation for operation.
#include "lowbit/model/depth_decoder.h"

#include <fmt/format.h>

#include <unistd.h>
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>

#include "lowbit/codec/affine.h"
#include "lowbit/core/checked.h"
#include "lowbit/core/error.h"
#include "lowbit/core/thread_pool.h"
#include "lowbit/io/json.h"
#include "lowbit/io/safetensors.h"

#include "depth_decoder_impl.h"

namespace lowbit::model {
namespace {

namespace fs = std::filesystem;
constexpr int64_t kTableRows = int64_t{kDepthLevels} * kDepthCodes;
constexpr uint64_t kMaxQuantJson = uint64_t{1} << 24;

// MLX's CPU exp (mlx/backend/cpu/simd/math.h): Cephes' 2^x polynomial.
float mlx_exp(float in) {
  if (std::isnan(in)) return in;
  if (in > 88.0f) return std::numeric_limits<float>::infinity();
  if (in < -88.0f) return 0.0f;
  float x = in * 1.442695f;
  const float ipart = std::floor(x + 0.5f);
  const float fpart = x - ipart;
  x = 1.535336188319500e-4f;
  x = std::fma(x, fpart, 1.339887440266574e-3f);
  x = std::fma(x, fpart, 9.618437357674640e-3f);
  x = std::fma(x, fpart, 5.550332471162809e-2f);
  x = std::fma(x, fpart, 2.402264791363012e-1f);
  x = std::fma(x, fpart, 6.931472028550421e-1f);
  x = std::fma(x, fpart, 1.000000000000000f);
  const uint32_t epart = (static_cast<uint32_t>(static_cast<int32_t>(ipart)) + 127u) << 23;
  return std::bit_cast<float>(epart) * x;
}

// MLX's CPU erf (same file; Abramowitz-Stegun 7.1.26 as PyTorch's vectorized CPU erf).
float mlx_erf(float v) {
  const float t = 1.0f / std::fma(0.3275911f, std::fabs(v), 1.0f);
  float r = std::fma(1.061405429f, t, -1.453152027f);
  r = std::fma(r, t, 1.421413741f);
  r = std::fma(r, t, -0.284496736f);
  r = std::fma(r, t, 0.254829592f);
  const float e = -mlx_exp(-v * v);
  const float result = std::fma(e * t, r, 1.0f);
  return v > 0 ? result : -result;
}

// out[r] = sum over j in order of x[r, j] * panel[j], for kRows rows: products and sums are separate fp32
// operations (no contraction into FMA, which would change the bits), vectorized across the panel's outputs only.
#if defined(__clang__)
#define LOWBIT_NO_FP_CONTRACT
#else
#define LOWBIT_NO_FP_CONTRACT __attribute__((optimize("fp-contract=off")))
#endif
template <int kRows>
LOWBIT_NO_FP_CONTRACT inline __attribute__((always_inline)) void panel_rows(const float* x, int64_t k,
                                                                            const float* panel,
                                                                            float (*out)[kDepthPanel]) {
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
  float acc[kRows][kDepthPanel] = {};
  for (int64_t j = 0; j < k; ++j) {
    const float* wj = panel + j * kDepthPanel;
    for (int r = 0; r < kRows; ++r) {
      const float a = x[r * k + j];
      for (int64_t c = 0; c < kDepthPanel; ++c) acc[r][c] += a * wj[c];
    }
  }
  for (int r = 0; r < kRows; ++r) std::copy_n(acc[r], kDepthPanel, out[r]);
}

// One clone per ISA, picked at load time.
constexpr int kRows = 4;
__attribute__((target_clones("avx512f", "avx2", "default"))) LOWBIT_NO_FP_CONTRACT void panel_4rows(
    const float* x, int64_t k, const float* panel, float (*out)[kDepthPanel]) {
  panel_rows<kRows>(x, k, panel, out);
}
__attribute__((target_clones("avx512f", "avx2", "default"))) LOWBIT_NO_FP_CONTRACT void panel_1row(
    const float* x, int64_t k, const float* panel, float (*out)[kDepthPanel]) {
  panel_rows<1>(x, k, panel, out);
}

// out[t, :] = round(x[t, :] @ w.T): each output summed over the inputs in order in fp32, then rounded once.
void matmul(const float* x, int64_t rows, const DepthLinear& w, DType dt, float* out) {
  const int64_t np = (w.n + kDepthPanel - 1) / kDepthPanel;
  const size_t grain = static_cast<size_t>(std::max<int64_t>(1, 32768 / std::max<int64_t>(1, rows * w.k)));
  default_pool().parallel_for(static_cast<size_t>(np), grain, [&](size_t p0, size_t p1) {
    for (auto p = static_cast<int64_t>(p0); p < static_cast<int64_t>(p1); ++p) {
      const float* panel = w.panels.data() + p * w.k * kDepthPanel;
      const int64_t width = std::min(kDepthPanel, w.n - p * kDepthPanel);
      for (int64_t t = 0; t < rows; t += kRows) {
        float acc[kRows][kDepthPanel];
        const int64_t block = std::min<int64_t>(kRows, rows - t);
        if (block == kRows)
          panel_4rows(x + t * w.k, w.k, panel, acc);
        else
          for (int64_t r = 0; r < block; ++r) panel_1row(x + (t + r) * w.k, w.k, panel, acc + r);
        for (int64_t r = 0; r < block; ++r)
          for (int64_t c = 0; c < width; ++c) out[(t + r) * w.n + p * kDepthPanel + c] = round_to(dt, acc[r][c]);
      }
    }
  });
}

// The seed's layer_norm: fp32 statistics (sums in order, biased variance), one rounding.
void layer_norm(const float* x, int64_t rows, int64_t d, const DepthNorm& n, DType dt, float* out) {
  const auto inv = static_cast<float>(1.0 / static_cast<double>(d));  // MLX: mean = sum x fp32(1 / n)
  for (int64_t t = 0; t < rows; ++t) {
    const float* xr = x + t * d;
    float sum = 0.0f;
    for (int64_t i = 0; i < d; ++i) sum += xr[i];
    const float mean = sum * inv;
    float sq = 0.0f;
    for (int64_t i = 0; i < d; ++i) sq += (xr[i] - mean) * (xr[i] - mean);
    const float denom = std::sqrt(sq * inv + 1e-5f);
    for (int64_t i = 0; i < d; ++i) out[t * d + i] = round_to(dt, (xr[i] - mean) / denom * n.w[i] + n.b[i]);
  }
}

[[noreturn]] void bad_tensor(Errc code, const fs::path& file, std::string_view name, std::string_view why) {
  fail(code, "[depth] {}: tensor '{}': {}", file.string(), name, why);
}

bool is_float(DType t) { return t == DType::F16 || t == DType::BF16 || t == DType::F32; }

// Names that may be affine-quantized: the seed passes them through Q.take and uses them as matrices.
bool quantizable(std::string_view name) {
  return name != "level_emb.weight" && name != "norm.weight" && name != "norm.bias" && name != "audio_in.norm.weight" &&
         !name.starts_with("null_mem") && !name.ends_with(".bias") && !name.ends_with("n1.weight") &&
         !name.ends_with("n2.weight");
}

// Reads depth.safetensors and quant.json into Sources, checking every tensor against the expected set.
class Reader {
 public:
  explicit Reader(const fs::path& dir)
      : file_(dir / "depth.safetensors"), st_(io::SafetensorsFile::open(file_)), quant_(dir / "quant.json") {
    if (fs::exists(quant_)) read_recipe();
  }

  // The logical shape of `name` (quantized: from quant.json), without checking it against anything.
  std::optional<Shape> shape_of(std::string_view name) const {
    if (auto it = recipe_.find(std::string(name)); it != recipe_.end()) return it->second.second;
    if (st_.contains(name)) return st_.tensor(name).shape;
    return std::nullopt;
  }
  Shape require_shape(std::string_view name, size_t rank) const {
    const auto s = shape_of(name);
    if (!s) bad_tensor(Errc::format, file_, name, "missing");
    if (s->size() != rank)
      bad_tensor(Errc::shape, file_, name, fmt::format("shape {} is not rank {}", shape_str(*s), rank));
    return *s;
  }

  DepthSource take(const std::string& name, const Shape& shape) {
    DepthSource s{name, shape, {}, std::nullopt, {}};
    if (auto it = recipe_.find(name); it != recipe_.end()) {
      if (!quantizable(name))
        bad_tensor(Errc::unsupported, quant_, name, "the seed reads it dense; it cannot be quantized");
      if (it->second.second != shape)
        bad_tensor(Errc::shape, quant_, name,
                   fmt::format("shape {}, expected {}", shape_str(it->second.second), shape_str(shape)));
      const TensorView& scales = view(name + ".scales");
      codec::Params p = it->second.first;
      p["scale_dtype"] = scales.dtype == DType::F16 ? "f16" : scales.dtype == DType::BF16 ? "bf16" : "f32";
      if (!is_float(scales.dtype)) bad_tensor(Errc::dtype, file_, name + ".scales", "dtype is not F16, BF16 or F32");
      if (shape[1] % p["group_size"].get<int64_t>() != 0)
        bad_tensor(Errc::shape, quant_, name, "columns are not a multiple of group_size");
      const auto specs = codec::affine::arrays(p, shape);
      const char* suffix[] = {".q", ".scales", ".biases"};
      for (size_t i = 0; i < specs.size(); ++i) {
        const std::string stored = name + suffix[i];
        const TensorView& v = view(stored);
        if (v.dtype != specs[i].dtype)
          bad_tensor(Errc::dtype, file_, stored,
                     fmt::format("dtype {}, expected {}", dtype_name(v.dtype), dtype_name(specs[i].dtype)));
        if (v.shape != specs[i].shape)
          bad_tensor(Errc::shape, file_, stored,
                     fmt::format("shape {}, expected {}", shape_str(v.shape), shape_str(specs[i].shape)));
        s.arrays.items.emplace_back(specs[i].role, aligned(v));
      }
      codec::affine::check_content(p, shape, s.arrays);
      s.affine = std::move(p);
      return s;
    }
    s.dense = view(name);
    if (!is_float(s.dense.dtype)) bad_tensor(Errc::dtype, file_, name, "dtype is not F16, BF16 or F32");
    if (s.dense.shape != shape)
      bad_tensor(Errc::shape, file_, name,
                 fmt::format("shape {}, expected {}", shape_str(s.dense.shape), shape_str(shape)));
    return s;
  }

  // Every stored tensor and recipe entry was used.
  void finish() const {
    for (const auto& name : st_.names())
      if (!used_.contains(name)) bad_tensor(Errc::format, file_, name, "not a depth decoder tensor");
    for (const auto& [name, entry] : recipe_)
      if (!used_.contains(name + ".q")) bad_tensor(Errc::format, quant_, name, "not a depth decoder tensor");
  }

  const fs::path& file() const { return file_; }
  io::SafetensorsFile release() { return std::move(st_); }
  std::deque<TensorBuffer> release_copies() { return std::move(copies_); }
  bool contains(std::string_view name) const { return st_.contains(name) || recipe_.contains(std::string(name)); }

 private:
  const TensorView& view(const std::string& name) {
    if (!st_.contains(name)) bad_tensor(Errc::format, file_, name, "missing");
    used_.insert(name);
    return views_.emplace(name, st_.tensor(name)).first->second;
  }

  // A view the codec may read as its element type: a file written without alignment (MLX's writer) is copied.
  TensorView aligned(const TensorView& v) {
    if (reinterpret_cast<uintptr_t>(v.bytes.data()) % dtype_size(v.dtype) == 0) return v;
    TensorBuffer& b = copies_.emplace_back(make_buffer(v.dtype, v.shape));
    std::memcpy(b.bytes.data(), v.bytes.data(), v.bytes.size());
    return b.view();
  }

  void read_recipe() {
    const auto j = io::read_json_file(quant_, "[depth]", kMaxQuantJson);
    if (!j.is_object() || !j.contains("tensors") || !j["tensors"].is_object())
      fail(Errc::format, "[depth] {}: field 'tensors' must be an object", quant_.string());
    for (const auto& item : j["tensors"].items()) {
      const std::string& name = item.key();
      const nlohmann::json& r = item.value();
      auto field = [&](const char* key) -> const nlohmann::json& {
        if (!r.is_object() || !r.contains(key))
          fail(Errc::format, "[depth] {}: tensors.{}.{} is missing", quant_.string(), name, key);
        return r[key];
      };
      const auto& bits = field("bits");
      const auto& group = field("group_size");
      const auto& shape = field("shape");
      if (!bits.is_number_integer() || !group.is_number_integer())
        fail(Errc::format, "[depth] {}: tensors.{}: bits and group_size must be integers", quant_.string(), name);
      if (!shape.is_array() || shape.size() != 2 || !shape[0].is_number_integer() || !shape[1].is_number_integer())
        fail(Errc::format, "[depth] {}: tensors.{}.shape must be two integers", quant_.string(), name);
      codec::Params p = {{"bits", bits}, {"group_size", group}};
      recipe_.emplace(name, std::make_pair(p, Shape{shape[0].get<int64_t>(), shape[1].get<int64_t>()}));
    }
  }

  fs::path file_;
  io::SafetensorsFile st_;
  fs::path quant_;
  std::map<std::string, std::pair<codec::Params, Shape>> recipe_;
  std::map<std::string, TensorView> views_;
  std::set<std::string> used_;
  std::deque<TensorBuffer> copies_;  // aligned copies of misaligned affine arrays
};

}  // namespace

void DepthSource::rows(int64_t r0, int64_t r1, float* out) const {
  const int64_t cols = shape.back();
  if (!affine) {
    for (int64_t i = r0 * cols; i < r1 * cols; ++i) *out++ = load_float(dense.dtype, dense.bytes.data(), i);
    return;
  }
  codec::affine::decode_rows(*affine, shape, arrays, r0, r1, out);
  const DType sdt = arrays.at("scales").dtype;
  for (int64_t i = 0; i < (r1 - r0) * cols; ++i) out[i] = round_to(sdt, out[i]);
}

std::vector<float> DepthSource::weight(DType dt) const {
  std::vector<float> v(checked_numel(shape, name));
  rows(0, shape.size() == 1 ? 1 : shape[0], v.data());
  if (!affine)
    for (float& x : v) x = round_to(dt, x);
  return v;
}

DepthLinear DepthLinear::from(const std::vector<float>& w, int64_t n, int64_t k, int64_t row0) {
  DepthLinear l{n, k, {}};
  const int64_t np = (n + kDepthPanel - 1) / kDepthPanel;
  l.panels.assign(static_cast<size_t>(np * k * kDepthPanel), 0.0f);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < k; ++j)
      l.panels[static_cast<size_t>(((r / kDepthPanel) * k + j) * kDepthPanel + r % kDepthPanel)] =
          w[(row0 + r) * k + j];
  return l;
}

void DepthDecoder::Impl::code_rows(int64_t r0, int64_t r1, float* lo) const {
  code_lo.rows(r0, r1, lo);
  for (int64_t j = 0; j < (r1 - r0) * code_lo.shape[1]; ++j) lo[j] = round_to(options.dtype, lo[j]);
}

void DepthDecoder::Impl::embed(int level, int32_t code, float* out) const {
  const DType dt = options.dtype;
  const int64_t r = code_lo.shape[1];
  std::vector<float> lo(static_cast<size_t>(r));
  const int64_t row = int64_t{level} * kDepthCodes + code;
  code_rows(row, row + 1, lo.data());
  for (int64_t i = 0; i < d; ++i) {
    float acc = 0.0f;
    for (int64_t j = 0; j < r; ++j) acc += lo[j] * code_up[i * r + j];
    out[i] = round_to(dt, round_to(dt, acc) + level_emb[(level + 1) * d + i]);
  }
}

std::vector<float> DepthDecoder::Impl::feedback(const std::array<int32_t, kDepthLevels>& codes) const {
  const DType fdt = fb_dtype;
  std::vector<float> sum(static_cast<size_t>(hidden), 0.0f), row(static_cast<size_t>(hidden));
  for (int l = 0; l < kDepthLevels; ++l) {
    const int64_t r = int64_t{l} * kDepthCodes + codes[l];
    table.rows(r, r + 1, row.data());
    for (int64_t i = 0; i < hidden; ++i) sum[i] += row[i];
  }
  const float fb_inv = 1.0f / static_cast<float>(std::sqrt(static_cast<double>(kDepthLevels)));
  float sq = 0.0f;
  for (float& v : sum) {
    v = round_to(fdt, round_to(fdt, v) * fb_inv);
    sq += v * v;
  }
  const float rs = 1.0f / std::sqrt(sq * static_cast<float>(1.0 / static_cast<double>(hidden)) + 0x1p-23f);
  std::vector<float> out(static_cast<size_t>(hidden));
  for (int64_t i = 0; i < hidden; ++i) out[i] = round_to(fdt, sum[i] * rs * fb_w[i]);
  return out;
}

DepthDecoder::DepthDecoder(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DepthDecoder::DepthDecoder(DepthDecoder&&) noexcept = default;
DepthDecoder& DepthDecoder::operator=(DepthDecoder&&) noexcept = default;
DepthDecoder::~DepthDecoder() = default;
int64_t DepthDecoder::width() const { return impl_->d; }
int64_t DepthDecoder::hidden() const { return impl_->hidden; }
DType DepthDecoder::feedback_dtype() const { return impl_->fb_dtype; }
DType DepthDecoder::dtype() const { return impl_->options.dtype; }
bool DepthDecoder::on_cuda() const { return impl_->device != nullptr; }

DepthDecoder DepthDecoder::load(const fs::path& dir, const DepthOptions& options) {
  if (options.dtype != DType::F16 && options.dtype != DType::BF16 && options.dtype != DType::F32)
    fail(Errc::usage, "[depth] compute dtype {} is not f16, bf16 or f32", dtype_name(options.dtype));
  if (options.top_k < 1 || options.top_k > kDepthCodes)
    fail(Errc::usage, "[depth] top_k {} is not in [1, {}]", options.top_k, kDepthCodes);
  if (!(options.temperature > 0.0)) fail(Errc::usage, "[depth] temperature must be positive");
#if !LOWBIT_WITH_CUDA
  if (options.cuda)
    fail(Errc::usage, "[depth] --device cuda: this lowbit was built without CUDA (configure with -DLOWBIT_CUDA=ON)");
#endif
  Reader rd(dir);
  const DType dt = options.dtype;
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->inv_temp = static_cast<float>(1.0 / options.temperature);
  const Shape lvl = rd.require_shape("level_emb.weight", 2);
  const int64_t d = lvl[1];
  if (d < kDepthHeads || d % kDepthHeads != 0)
    bad_tensor(Errc::shape, rd.file(), "level_emb.weight",
               fmt::format("width {} is not a multiple of {}", d, kDepthHeads));
  const int64_t hidden = rd.require_shape("in_proj.weight", 2)[1];
  const int64_t rank = rd.require_shape("code_lo.weight", 2)[1];
  const int64_t ffn = rd.require_shape("groups.0.0.f1.weight", 2)[0];
  impl->d = d;
  impl->hidden = hidden;
  impl->head = d / kDepthHeads;
  impl->ffn = ffn;

  // Linears are checked in order here and converted to panels afterwards, in parallel.
  struct Pending {
    DepthSource source;
    DepthLinear* target;
    int64_t n, k, row0;
  };
  std::vector<Pending> pending;
  auto linear = [&](DepthLinear& target, const std::string& name, int64_t n, int64_t k) {
    pending.push_back({rd.take(name, {n, k}), &target, n, k, 0});
  };
  auto norm = [&](const std::string& prefix) {
    return DepthNorm{rd.take(prefix + ".weight", {d}).weight(dt), rd.take(prefix + ".bias", {d}).weight(dt)};
  };
  linear(impl->in_proj, "in_proj.weight", d, hidden);
  impl->level_emb = rd.take("level_emb.weight", {kDepthLevels, d}).weight(dt);
  impl->code_lo = rd.take("code_lo.weight", {int64_t{kDepthSampled} * kDepthCodes, rank});
  impl->code_up = rd.take("code_up.weight", {d, rank}).weight(dt);
  for (int g = 0; g < kDepthGroups; ++g)
    for (int li = 0; li < kDepthLayers; ++li) {
      const std::string p = fmt::format("groups.{}.{}.", g, li);
      DepthBlock& b = impl->groups[g][li];
      b.n1 = norm(p + "n1");
      b.n2 = norm(p + "n2");
      linear(b.qkv, p + "qkv.weight", 3 * d, d);
      linear(b.o, p + "o.weight", d, d);
      linear(b.f1, p + "f1.weight", ffn, d);
      linear(b.f2, p + "f2.weight", d, ffn);
    }
  impl->norm = norm("norm");
  for (int i = 0; i < kDepthSampled; ++i) linear(impl->heads[i], fmt::format("heads.{}.weight", i), kDepthCodes, d);
  for (int li = 0; li < kDepthLayers; ++li) {
    pending.push_back({rd.take(fmt::format("cross.{}.kv.weight", li), {2 * d, d}), &impl->cross_v[li], d, d, d});
    linear(impl->cross_o[li], fmt::format("cross.{}.o.weight", li), d, d);
  }
  const std::string null_name = rd.contains("null_mem.weight") ? "null_mem.weight" : "null_mem";
  const auto null_shape = rd.shape_of(null_name);
  const DepthSource null_mem = rd.take(null_name, null_shape && null_shape->size() == 2 ? Shape{1, d} : Shape{d});
  impl->null_mem.resize(static_cast<size_t>(d));
  null_mem.rows(0, 1, impl->null_mem.data());
  impl->table = rd.take("audio_in.table", {kTableRows, hidden});
  const DepthSource fbw = rd.take("audio_in.norm.weight", {hidden});
  impl->fb_dtype = fbw.dense.dtype;
  impl->fb_w.resize(static_cast<size_t>(hidden));
  fbw.rows(0, 1, impl->fb_w.data());
  rd.finish();
  default_pool().parallel_for(pending.size(), 1, [&](size_t i0, size_t i1) {
    for (size_t i = i0; i < i1; ++i) {
      const Pending& p = pending[i];
      *p.target = DepthLinear::from(p.source.weight(dt), p.n, p.k, p.row0);
    }
  });
  impl->file.emplace(rd.release());
  impl->copies = rd.release_copies();
  DepthDecoder model(std::move(impl));
  model.set_speaker({});
#if LOWBIT_WITH_CUDA
  if (options.cuda) model.impl_->device = make_cuda_depth(*model.impl_);
#endif
  return model;
}

void DepthDecoder::set_speaker(std::span<const float> memory) {
  Impl& m = *impl_;
  const DType dt = m.options.dtype;
  if (!memory.empty() && static_cast<int64_t>(memory.size()) != m.d)
    fail(Errc::shape, "[depth] speaker memory has {} values, expected {}", memory.size(), m.d);
  std::vector<float> mem(static_cast<size_t>(m.d)), v(static_cast<size_t>(m.d));
  for (int64_t i = 0; i < m.d; ++i) mem[i] = round_to(dt, memory.empty() ? m.null_mem[i] : memory[i]);
  m.cross.assign(static_cast<size_t>(kDepthLayers * m.d), 0.0f);
  for (int li = 0; li < kDepthLayers; ++li) {
    matmul(mem.data(), 1, m.cross_v[li], dt, v.data());
    matmul(v.data(), 1, m.cross_o[li], dt, m.cross.data() + li * m.d);
  }
  if (m.device) m.device->set_cross(m.cross);
}

namespace {

// Scaled dot-product attention of MLX's CPU fallback for one query row over `n` keys: q * scale (rounded),
// scores q.k (fp32 sums, rounded), precise softmax (MLX exp, fp32 normalizer, rounded), p @ v (rounded).
// `k` and `v` hold key j's heads at row j with stride `stride`.
void attend(const float* q, const float* k, const float* v, int64_t stride, int64_t n, int64_t d, int64_t head,
            float scale, DType dt, float* out) {
  std::vector<float> s(static_cast<size_t>(n)), qs(static_cast<size_t>(head));
  for (int64_t h = 0; h < d / head; ++h) {
    for (int64_t i = 0; i < head; ++i) qs[i] = round_to(dt, scale * q[h * head + i]);
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (int64_t i = 0; i < head; ++i) acc += qs[i] * k[j * stride + h * head + i];
      s[j] = round_to(dt, acc);
      m = std::max(m, s[j]);
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < n; ++j) sum += mlx_exp(s[j] - m);
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j < n; ++j) s[j] = round_to(dt, mlx_exp(s[j] - m) * inv);
    for (int64_t i = 0; i < head; ++i) {
      float acc = 0.0f;
      for (int64_t j = 0; j < n; ++j) acc += s[j] * v[j * stride + h * head + i];
      out[h * head + i] = round_to(dt, acc);
    }
  }
}

// The seed's top-k Gumbel sampler: logits * (1/T) in fp32, the k-th largest as threshold, argmax of
// masked - log(-log(u)) (first index on ties).
int32_t sample(const float* logits, const float* uniform, float inv_temp, int top_k) {
  std::array<float, kDepthCodes> xs{};
  for (int i = 0; i < kDepthCodes; ++i) xs[i] = logits[i] * inv_temp;
  std::array<float, kDepthCodes> sorted = xs;
  std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(), std::greater<>());
  const float kth = sorted[top_k - 1];
  int32_t best = 0;
  float best_score = 0.0f;
  for (int i = 0; i < kDepthCodes; ++i) {
    const float xm = xs[i] >= kth ? xs[i] : -std::numeric_limits<float>::infinity();
    const float score = xm - gumbel_noise(uniform[i]);
    if (i == 0 || score > best_score) {
      best = i;
      best_score = score;
    }
  }
  return best;
}

// depth_frame's operations on the CPU, for one frame.
class CpuOps {
 public:
  CpuOps(const DepthDecoder::Impl& m, const DepthFrameIn& in, std::array<int32_t, kDepthLevels>& codes)
      : m_(m), in_(in), codes_(codes), dt_(m.options.dtype), scale_(m.attention_scale()) {}

  const DepthLinear& in_proj() const { return m_.in_proj; }
  const float* level_emb() const { return m_.level_emb.data(); }
  const DepthBlock& block(int group, int layer) const { return m_.groups[group][layer]; }
  const DepthNorm& final_norm() const { return m_.norm; }
  const DepthLinear& head(int i) const { return m_.heads[i]; }
  const float* cross(int layer) const { return m_.cross.data() + layer * m_.d; }

  void matmul(const float* x, int64_t rows, const DepthLinear& w, float* out) const {
    model::matmul(x, rows, w, dt_, out);
  }
  void layer_norm(const float* x, int64_t rows, const DepthNorm& n, float* out) const {
    model::layer_norm(x, rows, m_.d, n, dt_, out);
  }
  void add(float* x, const float* y, int64_t rows, int64_t y_stride) const {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < m_.d; ++i) x[r * m_.d + i] = round_to(dt_, x[r * m_.d + i] + y[r * y_stride + i]);
  }
  void gelu(float* x, int64_t count) const {
    for (int64_t i = 0; i < count; ++i) x[i] = round_to(dt_, x[i] * 0.5f * (1.0f + mlx_erf(x[i] * 0.70710677f)));
  }
  void attend(const float* q, int64_t q_stride, const float* k, const float* v, int64_t kv_stride, int64_t queries,
              int64_t n, float* out) const {
    for (int64_t i = 0; i < queries; ++i)
      model::attend(q + i * q_stride, k, v, kv_stride, n - queries + 1 + i, m_.d, m_.head, scale_, dt_, out + i * m_.d);
  }
  void copy_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t rows,
                 int64_t width) const {
    for (int64_t r = 0; r < rows; ++r) std::copy_n(src + r * src_stride, width, dst + r * dst_stride);
  }
  void sample(int level, const float* logits) const {
    codes_[level] =
        model::sample(logits, in_.uniform.data() + int64_t{level - 1} * kDepthCodes, m_.inv_temp, m_.options.top_k);
  }
  void embed(int level, float* out) const {
    m_.embed(level, level == 0 || in_.force.empty() ? codes_[level] : in_.force[level], out);
  }

 private:
  const DepthDecoder::Impl& m_;
  const DepthFrameIn& in_;
  std::array<int32_t, kDepthLevels>& codes_;
  DType dt_;
  float scale_;
};

void check_frame(const DepthDecoder::Impl& m, const DepthFrameIn& in) {
  if (static_cast<int64_t>(in.h.size()) != m.hidden || in.uniform.size() != size_t{kDepthSampled} * kDepthCodes ||
      (!in.force.empty() && in.force.size() != size_t{kDepthLevels}))
    fail(Errc::shape, "[depth] frame: h, uniform or force has the wrong length");
  auto is_code = [](int32_t c) { return c >= 0 && c < kDepthCodes; };
  if (!is_code(in.cb0) || (!in.force.empty() && !std::all_of(in.force.begin() + 1, in.force.end() - 1, is_code)))
    fail(Errc::reserved_code, "[depth] frame: cb0 or force holds a value outside [0, {})", kDepthCodes);
}

DepthFrameOut cpu_frame(const DepthDecoder::Impl& m, const DepthFrameIn& in, bool want_logits) {
  DepthFrameOut out;
  std::vector<float> work(static_cast<size_t>(DepthWork::floats(m.d, m.hidden, m.ffn)));
  const DepthWork w = DepthWork::carve(work.data(), m.d, m.hidden, m.ffn);
  depth_input(m.options.dtype, in.h, w.x0);
  out.codes[0] = in.cb0;
  CpuOps ops(m, in, out.codes);
  depth_frame(ops, w, m.d, m.ffn);
  if (want_logits) out.logits.assign(w.logits, w.logits + int64_t{kDepthSampled} * kDepthCodes);
  out.feedback = m.feedback(out.codes);
  return out;
}

// Frames on the device, in order with two in flight: frame t + 1 is submitted (its inputs staged on the host)
// before frame t is collected and its feedback computed, both on the host while the device runs.
void device_frames(const DepthDecoder::Impl& m, int64_t count, bool want_logits,
                   const std::function<DepthFrameIn(int64_t)>& in_of,
                   const std::function<void(int64_t, const DepthFrameOut&)>& sink) {
  auto collect = [&](int64_t t) {
    DepthFrameOut out;
    m.device->collect(out.codes, want_logits ? &out.logits : nullptr);
    out.feedback = m.feedback(out.codes);
    sink(t, out);
  };
  for (int64_t t = 0; t < count; ++t) {
    const DepthFrameIn in = in_of(t);
    check_frame(m, in);
    m.device->submit(in, want_logits);
    if (t > 0) collect(t - 1);
  }
  if (count > 0) collect(count - 1);
}

}  // namespace

DepthFrameOut DepthDecoder::frame(const DepthFrameIn& in, bool want_logits) const {
  if (!impl_->device) {
    check_frame(*impl_, in);
    return cpu_frame(*impl_, in, want_logits);
  }
  DepthFrameOut out;
  device_frames(
      *impl_, 1, want_logits, [&](int64_t) { return in; }, [&](int64_t, const DepthFrameOut& o) { out = o; });
  return out;
}

void DepthDecoder::frames(int64_t count, bool want_logits, const std::function<DepthFrameIn(int64_t)>& in_of,
                          const std::function<void(int64_t, const DepthFrameOut&)>& sink) const {
  if (impl_->device) return device_frames(*impl_, count, want_logits, in_of, sink);
  auto run = [&](size_t f0, size_t f1) {
    for (auto t = static_cast<int64_t>(f0); t < static_cast<int64_t>(f1); ++t) sink(t, frame(in_of(t), want_logits));
  };
  // Frames are independent: with at least one per thread they run in parallel, else each matmul does.
  if (static_cast<size_t>(count) >= default_pool().size())
    default_pool().parallel_for(static_cast<size_t>(count), 1, run);
  else
    run(0, static_cast<size_t>(count));
}

namespace {

[[noreturn]] void bad_input(const fs::path& file, std::string_view name, std::string_view why) {
  bad_tensor(Errc::shape, file, name, why);
}

// The tensor `name` of IN with dtype `dtype` and shape `shape`, else exit 3 naming it.
TensorView input(const io::SafetensorsFile& f, const fs::path& path, std::string_view name, DType dtype,
                 const Shape& shape) {
  if (!f.contains(name)) bad_tensor(Errc::format, path, name, "missing");
  TensorView v = f.tensor(name);
  if (v.dtype != dtype)
    bad_tensor(Errc::dtype, path, name, fmt::format("dtype {}, expected {}", dtype_name(v.dtype), dtype_name(dtype)));
  if (v.shape != shape)
    bad_input(path, name, fmt::format("shape {}, expected {}", shape_str(v.shape), shape_str(shape)));
  return v;
}

// The values of a view (files may leave tensors unaligned for their element type).
template <class T>
std::vector<T> values_of(const TensorView& v) {
  std::vector<T> out(v.bytes.size() / sizeof(T));
  std::memcpy(out.data(), v.bytes.data(), out.size() * sizeof(T));
  return out;
}

void check_codes(const fs::path& path, std::string_view name, const int32_t* codes, int64_t n, int64_t stride,
                 int64_t first, int64_t last) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = first; c < last; ++c)
      if (const int32_t v = codes[i * stride + c]; v < 0 || v >= kDepthCodes)
        bad_tensor(Errc::reserved_code, path, name,
                   fmt::format("[{}, {}] = {} is not a code in [0, {})", i, c, v, kDepthCodes));
}

}  // namespace

int64_t run_depth_file(DepthDecoder& model, const fs::path& in, const fs::path& out, bool logits) {
  const auto f = io::SafetensorsFile::open(in);
  for (const auto& name : f.names())
    if (name != "h" && name != "cb0" && name != "uniform" && name != "force" && name != "speaker")
      bad_tensor(Errc::format, in, name, "not a depth input (h, cb0, uniform, force, speaker)");
  if (!f.contains("h")) bad_tensor(Errc::format, in, "h", "missing");
  const Shape hs = f.tensor("h").shape;
  if (hs.size() != 2 || hs[0] < 1)
    bad_input(in, "h", fmt::format("shape {}, expected [frames, {}]", shape_str(hs), model.hidden()));
  const int64_t frames = hs[0];
  const auto h = values_of<uint16_t>(input(f, in, "h", DType::BF16, {frames, model.hidden()}));
  const auto cb0 = values_of<int32_t>(input(f, in, "cb0", DType::I32, {frames}));
  const auto uniform = values_of<float>(input(f, in, "uniform", DType::F32, {frames, kDepthLevels - 1, kDepthCodes}));
  check_codes(in, "cb0", cb0.data(), frames, 1, 0, 1);
  std::vector<int32_t> force;
  if (f.contains("force")) {
    force = values_of<int32_t>(input(f, in, "force", DType::I32, {frames, kDepthLevels}));
    check_codes(in, "force", force.data(), frames, kDepthLevels, 1, kDepthLevels - 1);
  }
  std::vector<float> speaker;
  if (f.contains("speaker")) {
    const TensorView s = f.tensor("speaker");
    if (!is_float(s.dtype)) bad_tensor(Errc::dtype, in, "speaker", "dtype is not F16, BF16 or F32");
    if (s.shape != Shape{model.width()})
      bad_input(in, "speaker", fmt::format("shape {}, expected [{}]", shape_str(s.shape), model.width()));
    for (int64_t i = 0; i < model.width(); ++i) speaker.push_back(load_float(s.dtype, s.bytes.data(), i));
  }
  model.set_speaker(speaker);

  const int64_t hidden = model.hidden();
  const size_t nlog = static_cast<size_t>(kDepthSampled) * kDepthCodes;
  auto codes = make_buffer(DType::I32, {frames, kDepthLevels});
  auto feedback = make_buffer(model.feedback_dtype(), {frames, hidden});
  auto all_logits = make_buffer(model.dtype(), logits ? Shape{frames, kDepthSampled, kDepthCodes} : Shape{0});
  auto in_of = [&](int64_t t) {
    return DepthFrameIn{{h.data() + t * hidden, static_cast<size_t>(hidden)},
                        cb0[t],
                        {uniform.data() + t * static_cast<int64_t>(nlog), nlog},
                        !force.empty() ? std::span<const int32_t>(force.data() + t * kDepthLevels, kDepthLevels)
                                       : std::span<const int32_t>{}};
  };
  model.frames(frames, logits, in_of, [&](int64_t t, const DepthFrameOut& o) {
    std::copy(o.codes.begin(), o.codes.end(), codes.as<int32_t>() + t * kDepthLevels);
    for (int64_t i = 0; i < hidden; ++i)
      store_float(model.feedback_dtype(), feedback.bytes.data(), t * hidden + i, o.feedback[i]);
    for (size_t i = 0; logits && i < nlog; ++i)
      store_float(model.dtype(), all_logits.bytes.data(), t * static_cast<int64_t>(nlog) + static_cast<int64_t>(i),
                  o.logits[i]);
  });
  std::vector<std::pair<std::string, TensorView>> tensors{{"codes", codes.view()}, {"feedback", feedback.view()}};
  if (logits) tensors.emplace_back("logits", all_logits.view());
  std::random_device rd;
  const fs::path dir = out.parent_path().empty() ? fs::path(".") : out.parent_path();
  const fs::path tmp = dir / fmt::format(".{}.tmp-{}-{:08x}", out.filename().string(), ::getpid(), rd());
  try {
    io::write_safetensors(tmp, tensors);
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
  std::error_code ec;
  fs::rename(tmp, out, ec);
  if (ec) {
    fs::remove(tmp, ec);
    fail(Errc::io, "[depth] {}: cannot rename the output into place", out.string());
  }
  return frames;
}

}  // namespace lowbit::model
