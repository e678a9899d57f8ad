// The depth decoder's loaded weights and its per-frame structure, shared by the CPU backend (depth_decoder.cpp) and
// the GPU one (cuda/depth_cuda.cpp, built with LOWBIT_CUDA): both run depth_frame() below over their own ops, so
// the order of operations and every buffer's role are written once. Activations are f32 values of the compute
// dtype; `round_to` is the one rounding each seed operation applies.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "lowbit/codec/codec.h"
#include "lowbit/core/dtype.h"
#include "lowbit/core/tensor.h"
#include "lowbit/io/safetensors.h"
#include "lowbit/model/depth_decoder.h"

namespace lowbit::model {

inline constexpr int kDepthSampled = kDepthLevels - 1;

inline float round_to(DType t, float x) {
  if (t == DType::F16) return f16_to_f32(f32_to_f16(x));
  if (t == DType::BF16) return bf16_to_f32(f32_to_bf16(x));
  return x;
}

// The sampler's Gumbel noise log(-log u) (the score is the masked logit minus it), in fp32 through the host's logf:
// the GPU backend takes it from here too, since a device logf need not round like glibc's.
inline float gumbel_noise(float u) { return std::log(-std::log(u)); }

// A tensor of depth.safetensors as stored: dense, or affine (`.q`, `.scales`, `.biases` through quant.json).
struct DepthSource {
  std::string name;
  Shape shape;  // logical [rows, cols] (or [n])
  TensorView dense;
  std::optional<codec::Params> affine;
  codec::ArrayViews arrays;

  // Rows [r0, r1) as the seed holds them: a dense tensor's stored values; an affine one's s * q + b (fp32),
  // rounded once to the scales' dtype.
  void rows(int64_t r0, int64_t r1, float* out) const;
  // The seed's c(): a dense weight rounded to the compute dtype; an affine one as it dequantizes.
  std::vector<float> weight(DType dt) const;
};

// A linear layer [n, k] in panels of kPanel outputs: panel p holds, for each input j, its kPanel weights (the CPU
// kernel's layout, and the GPU's: a warp's 32 threads then read one panel row, contiguous).
inline constexpr int64_t kDepthPanel = 32;
struct DepthLinear {
  int64_t n = 0, k = 0;
  std::vector<float> panels;  // [ceil(n / kDepthPanel), k, kDepthPanel], zeros past n

  static DepthLinear from(const std::vector<float>& w, int64_t n, int64_t k, int64_t row0 = 0);
};

struct DepthNorm {
  std::vector<float> w, b;  // values of the compute dtype, as fp32
};

struct DepthBlock {
  DepthNorm n1, n2;
  DepthLinear qkv, o, f1, f2;
};

// The buffers of one frame (f32, in the backend's memory). kv[layer][position] holds k then v, D values each.
struct DepthWork {
  float *x0, *prefix, *kv, *x, *y, *qkv, *a, *t, *f1, *logits;

  static int64_t floats(int64_t d, int64_t hidden, int64_t ffn) {
    return hidden + kDepthLevels * (d + kDepthLayers * 2 * d + d + d + 3 * d + d + d + ffn) +
           int64_t{kDepthSampled} * kDepthCodes;
  }
  static DepthWork carve(float* base, int64_t d, int64_t hidden, int64_t ffn) {
    DepthWork w{};
    auto take = [&base](int64_t n) { return std::exchange(base, base + n); };
    w.x0 = take(hidden);
    w.prefix = take(kDepthLevels * d);
    w.kv = take(int64_t{kDepthLayers} * kDepthLevels * 2 * d);
    w.x = take(kDepthLevels * d);
    w.y = take(kDepthLevels * d);
    w.qkv = take(kDepthLevels * 3 * d);
    w.a = take(kDepthLevels * d);
    w.t = take(kDepthLevels * d);
    w.f1 = take(kDepthLevels * ffn);
    w.logits = take(int64_t{kDepthSampled} * kDepthCodes);
    return w;
  }
};

// The first input x0 [hidden] of a frame: h rounded to the compute dtype.
inline void depth_input(DType dt, std::span<const uint16_t> h, float* x0) {
  for (size_t i = 0; i < h.size(); ++i) x0[i] = round_to(dt, bf16_to_f32(h[i]));
}

// Where frames run besides the CPU: the GPU runtime (cuda/depth_cuda.cpp).
class DepthDevice {
 public:
  virtual ~DepthDevice() = default;
  // The speaker's cross-attention term [layers, D], as set_speaker computed it.
  virtual void set_cross(std::span<const float> cross) = 0;
  // Stages a checked frame's inputs and enqueues it, returning at once; at most two frames are in flight (the
  // caller collects the older one before submitting a third).
  virtual void submit(const DepthFrameIn& in, bool logits) = 0;
  // Waits for the oldest submitted frame: its 32 codes, and into `logits` [31 * 2048] the logits it was submitted
  // with `logits` for.
  virtual void collect(std::array<int32_t, kDepthLevels>& codes, std::vector<float>* logits) = 0;
};

struct DepthDecoder::Impl {
  DepthOptions options;
  std::optional<io::SafetensorsFile> file;  // the mapping code_lo and table view
  std::deque<TensorBuffer> copies;          // and their aligned copies
  int64_t d = 0, hidden = 0, head = 0, ffn = 0;
  float inv_temp = 0.0f;
  DepthLinear in_proj;
  std::vector<float> level_emb;  // [32, D], compute dtype
  DepthSource code_lo, table;
  std::vector<float> code_up;  // [D, R], compute dtype
  std::array<std::array<DepthBlock, kDepthLayers>, kDepthGroups> groups;
  DepthNorm norm;
  std::array<DepthLinear, kDepthSampled> heads;
  std::array<DepthLinear, kDepthLayers> cross_v, cross_o;  // cross_v: the V half of cross.i.kv
  std::vector<float> null_mem;                             // [D], stored values
  std::vector<float> fb_w;                                 // [hidden]
  DType fb_dtype = DType::BF16;
  std::vector<float> cross;             // [layers, D]: o(v(memory)) per layer
  std::unique_ptr<DepthDevice> device;  // set: frames run there

  // The attention's q scale, rounded to the compute dtype.
  float attention_scale() const {
    return round_to(options.dtype, static_cast<float>(std::pow(static_cast<double>(head), -0.5)));
  }
  // Rows [r0, r1) of code_lo as the embedding reads them (rounded to the compute dtype), into lo [r1 - r0, R].
  void code_rows(int64_t r0, int64_t r1, float* lo) const;
  // embed[level][code] = round(code_lo[level * 2048 + code] @ code_up.T) + level_emb[level + 1], both rounded.
  void embed(int level, int32_t code, float* out) const;
  // The feedback of a frame's 32 codes: the table rows summed in fp32 (rounded), times 1/sqrt(32) (rounded),
  // RMS-normalised and scaled by audio_in.norm.weight, rounded to its dtype.
  std::vector<float> feedback(const std::array<int32_t, kDepthLevels>& codes) const;
};

// One frame's levels (the seed's order of operations) over `ops`, whose buffers `w` holds x0 (h rounded to the
// compute dtype) on entry and every level's logits on return. Ops provide the weights (in_proj(), level_emb(),
// block(group, layer) with n1, n2, qkv, o, f1, f2; final_norm(), head(i), cross(layer)) and the operations, each
// rounding its results to the compute dtype:
//   matmul(x, rows, w, out)                out [rows, w.n] = x @ w.T, every output summed over k in order
//   layer_norm(x, rows, norm, out)
//   add(x, y, rows, y_stride)              x [rows, D] = x + y (y's rows y_stride apart: 0 broadcasts one row)
//   gelu(x, count)
//   attend(q, q_stride, k, v, kv_stride, queries, n, out)
//                                          query i of `queries` over keys 0 .. n - queries + i, out [queries, D]
//   copy_rows(dst, dst_stride, src, src_stride, rows, width)
//   sample(level, logits)                  samples level's code from its logits [2048]
//   embed(level, out)                      out [D] = the next input: level's sampled or forced code embedded
template <class Ops>
void depth_frame(Ops& ops, const DepthWork& w, int64_t d, int64_t ffn) {
  ops.matmul(w.x0, 1, ops.in_proj(), w.prefix);
  ops.add(w.prefix, ops.level_emb(), 1, 0);
  ops.embed(0, w.prefix + d);
  int previous = -1;
  for (int level = 1; level < kDepthLevels; ++level) {
    const int group = kDepthGroupOfLevel[level];
    const int64_t n = level + 1;
    // Inside a weight group the earlier positions' K/V are reused; a new group recomputes every position.
    const bool incremental = group == previous;
    const bool reused_later = level + 1 < kDepthLevels && kDepthGroupOfLevel[level + 1] == group;
    int64_t rows = incremental ? 1 : n;
    float* x = w.x;
    ops.copy_rows(x, d, w.prefix + (n - rows) * d, d, rows, d);
    ops.layer_norm(x, rows, ops.block(group, 0).n1, w.y);
    for (int li = 0; li < kDepthLayers; ++li) {
      const auto& b = ops.block(group, li);
      float* kv = w.kv + int64_t{li} * kDepthLevels * 2 * d;
      ops.matmul(w.y, rows, b.qkv, w.qkv);
      if (incremental) {
        ops.copy_rows(kv + level * 2 * d, 2 * d, w.qkv + d, 3 * d, 1, 2 * d);
        ops.attend(w.qkv, 3 * d, kv, kv + d, 2 * d, 1, n, w.a);
      } else {
        if (reused_later) ops.copy_rows(kv, 2 * d, w.qkv + d, 3 * d, n, 2 * d);
        // Only the last position is read after the last layer.
        const int64_t queries = li == kDepthLayers - 1 ? 1 : rows;
        ops.attend(w.qkv + (rows - queries) * 3 * d, 3 * d, w.qkv + d, w.qkv + 2 * d, 3 * d, queries, n, w.a);
        x += (rows - queries) * d;
        rows = queries;
      }
      ops.matmul(w.a, rows, b.o, w.t);
      ops.add(x, w.t, rows, d);
      ops.layer_norm(x, rows, b.n2, w.y);
      ops.matmul(w.y, rows, b.f1, w.f1);
      ops.gelu(w.f1, rows * ffn);
      ops.matmul(w.f1, rows, b.f2, w.t);
      ops.add(x, w.t, rows, d);
      ops.add(x, ops.cross(li), rows, 0);
      ops.layer_norm(x, rows, li + 1 < kDepthLayers ? ops.block(group, li + 1).n1 : ops.final_norm(), w.y);
    }
    float* logits = w.logits + int64_t{level - 1} * kDepthCodes;
    ops.matmul(w.y + (rows - 1) * d, 1, ops.head(level - 1), logits);
    ops.sample(level, logits);
    if (n < kDepthLevels) ops.embed(level, w.prefix + n * d);
    previous = group;
  }
}

#if LOWBIT_WITH_CUDA
// cuda/depth_cuda.cpp: uploads the weights of `model` (which must outlive it) and the current cross term.
std::unique_ptr<DepthDevice> make_cuda_depth(const DepthDecoder::Impl& model);
#endif

}  // namespace lowbit::model
