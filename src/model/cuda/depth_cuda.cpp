// The depth decoder's GPU runtime (DepthOptions::cuda): the CPU loader's weights uploaded once, and
// depth_frame() (depth_decoder_impl.h) run over the kernels of src/kernels/cuda/depth_ops.cu, each the bitwise twin
// of its CPU operation. One frame's 31 levels are one CUDA graph (shapes depend on the level only; the sampled
// codes stay on the device, where the next level's embedding reads them), replayed per frame between the upload
// of its inputs and the download of its codes and logits. What the host keeps, and why:
// - the Gumbel noise log(-log u): a device logf need not round like glibc's, so the host computes it with the CPU
//   path's own function and uploads it with the frame's inputs (while the device runs the previous frame);
// - the feedback: it reads 32 rows of the backbone's table (stored possibly affine, 65536 rows), so the host
//   computes it with the CPU path's own function from the downloaded codes (while the device runs the next frame);
// - the speaker's cross term: computed once per speaker by set_speaker on the CPU and uploaded.
// Built only with LOWBIT_CUDA=ON.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <bit>
#include <vector>

#include "depth_decoder_impl.h"
#include "lowbit/core/error.h"
#include "lowbit/core/thread_pool.h"
#include "lowbit/kernels/cuda.h"
#include "lowbit/kernels/cuda_depth_ops.h"

namespace lowbit::model {

namespace kc = kernels::cuda;

namespace {

void check(cudaError_t status, const char* op) {
  if (status != cudaSuccess) fail(Errc::internal, "[depth] cuda: {}: {}", op, cudaGetErrorString(status));
}

kc::ElemType elem_of(DType t) {
  return t == DType::F16 ? kc::ElemType::f16 : t == DType::BF16 ? kc::ElemType::bf16 : kc::ElemType::f32;
}

kc::DeviceBuffer upload_floats(const std::vector<float>& v) {
  kc::DeviceBuffer b(v.size() * sizeof(float));
  b.upload(v.data(), b.size());
  return b;
}

// Values on the device in the narrowest of f16, bf16 and f32 that holds every one of them with the same bits
// (the kernels widen them back exactly): a 16-bit weight reads half the bytes and multiplies as the same f32.
struct ExactValues {
  kc::DeviceBuffer buffer;
  kc::ElemType type = kc::ElemType::f32;

  static ExactValues upload(const std::vector<float>& v) {
    for (const DType t : {DType::F16, DType::BF16}) {
      const bool exact = std::all_of(v.begin(), v.end(), [t](float x) {
        return std::bit_cast<uint32_t>(round_to(t, x)) == std::bit_cast<uint32_t>(x);
      });
      if (!exact) continue;
      std::vector<uint16_t> narrow(v.size());
      for (size_t i = 0; i < v.size(); ++i) narrow[i] = t == DType::F16 ? f32_to_f16(v[i]) : f32_to_bf16(v[i]);
      kc::DeviceBuffer b(narrow.size() * sizeof(uint16_t));
      b.upload(narrow.data(), b.size());
      return {std::move(b), elem_of(t)};
    }
    return {upload_floats(v), kc::ElemType::f32};
  }
};

struct GpuLinear {
  ExactValues values;
  kc::DepthPanels panels;

  explicit GpuLinear(const DepthLinear& l)
      : values(ExactValues::upload(l.panels)), panels{values.buffer.data(), values.type, l.n, l.k} {}
};

struct GpuNorm {
  kc::DeviceBuffer w, b;
  explicit GpuNorm(const DepthNorm& n) : w(upload_floats(n.w)), b(upload_floats(n.b)) {}
};

struct GpuBlock {
  GpuNorm n1, n2;
  GpuLinear qkv, o, f1, f2;
  explicit GpuBlock(const DepthBlock& b) : n1(b.n1), n2(b.n2), qkv(b.qkv), o(b.o), f1(b.f1), f2(b.f2) {}
};

// Page-locked host memory, so that the frame's copies run asynchronously.
class Pinned {
 public:
  explicit Pinned(size_t bytes) { check(cudaMallocHost(&data_, bytes), "pinned host memory"); }
  Pinned(const Pinned&) = delete;
  Pinned& operator=(const Pinned&) = delete;
  ~Pinned() { cudaFreeHost(data_); }
  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void* data_ = nullptr;
};

constexpr int64_t kNoise = int64_t{kDepthSampled} * kDepthCodes;

class CudaDepth;

// depth_frame's operations as kernel launches on the runtime's stream (capturable: no allocation, no sync).
class GpuOps {
 public:
  explicit GpuOps(const CudaDepth& g);

  const GpuLinear& in_proj() const;
  const float* level_emb() const;
  const GpuBlock& block(int group, int layer) const;
  const GpuNorm& final_norm() const;
  const GpuLinear& head(int i) const;
  const float* cross(int layer) const;

  void matmul(const float* x, int64_t rows, const GpuLinear& w, float* out) const;
  void layer_norm(const float* x, int64_t rows, const GpuNorm& n, float* out) const;
  void add(float* x, const float* y, int64_t rows, int64_t y_stride) const;
  void gelu(float* x, int64_t count) const;
  void attend(const float* q, int64_t q_stride, const float* k, const float* v, int64_t kv_stride, int64_t queries,
              int64_t n, float* out) const;
  void copy_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t rows,
                 int64_t width) const;
  void sample(int level, const float* logits) const;
  void embed(int level, float* out) const;

 private:
  const CudaDepth& g_;
};

class CudaDepth final : public DepthDevice {
 public:
  explicit CudaDepth(const DepthDecoder::Impl& m)
      : m_(m),
        round_(elem_of(m.options.dtype)),
        scale_(m.attention_scale()),
        in_proj_(m.in_proj),
        level_emb_(upload_floats(m.level_emb)),
        norm_(m.norm),
        cross_(static_cast<size_t>(kDepthLayers * m.d) * sizeof(float)),
        noise_(static_cast<size_t>(kNoise) * sizeof(float)),
        codes_(2 * kDepthLevels * sizeof(int32_t)),
        work_(static_cast<size_t>(DepthWork::floats(m.d, m.hidden, m.ffn)) * sizeof(float)),
        w_(DepthWork::carve(work_.as<float>(), m.d, m.hidden, m.ffn)) {
    // The layer norm holds a row in shared memory (48 KiB without opting in).
    if (m.d > 12288) fail(Errc::unsupported, "[depth] cuda: width {} (the GPU layer norm takes at most 12288)", m.d);
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "stream");
    blocks_.reserve(size_t{kDepthGroups} * kDepthLayers);
    heads_.reserve(kDepthSampled);
    for (const auto& group : m.groups)
      for (const DepthBlock& b : group) blocks_.emplace_back(b);
    for (const DepthLinear& h : m.heads) heads_.emplace_back(h);
    {
      const int64_t rows = int64_t{kDepthSampled} * kDepthCodes, rank = m.code_lo.shape[1];
      std::vector<float> lo(static_cast<size_t>(rows * rank));
      m.code_rows(0, rows, lo.data());
      code_lo_ = ExactValues::upload(lo);
      std::vector<float> up_t(static_cast<size_t>(rank * m.d));
      for (int64_t i = 0; i < m.d; ++i)
        for (int64_t j = 0; j < rank; ++j) up_t[j * m.d + i] = m.code_up[i * rank + j];
      code_up_t_ = upload_floats(up_t);
    }
    for (auto& e : done_) check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "event");
    set_cross(m.cross);
  }

  ~CudaDepth() override {
    if (stream_) cudaStreamSynchronize(stream_);
    if (graph_) cudaGraphExecDestroy(graph_);
    for (auto& e : done_)
      if (e) cudaEventDestroy(e);
    if (stream_) cudaStreamDestroy(stream_);
  }

  void set_cross(std::span<const float> cross) override {
    check(cudaStreamSynchronize(stream_), "synchronize");
    cross_.upload(cross.data(), cross.size_bytes());
  }

  void submit(const DepthFrameIn& in, bool logits) override {
    if (submitted_ - collected_ >= 2) fail(Errc::internal, "[depth] cuda: a third frame in flight");
    const int slot = static_cast<int>(submitted_ % 2);
    Staging& s = staging_[slot];
    depth_input(m_.options.dtype, in.h, s.x0.as<float>());
    float* noise = s.noise.as<float>();
    default_pool().parallel_for(static_cast<size_t>(kDepthSampled), 1, [&](size_t l0, size_t l1) {
      for (auto i = static_cast<int64_t>(l0 * kDepthCodes); i < static_cast<int64_t>(l1 * kDepthCodes); ++i)
        noise[i] = gumbel_noise(in.uniform[static_cast<size_t>(i)]);
    });
    int32_t* ints = s.ints.as<int32_t>();
    std::fill_n(ints, kDepthLevels, 0);
    ints[0] = in.cb0;
    // force[level] < 0: the sampled code is the next input
    if (in.force.empty())
      std::fill_n(ints + kDepthLevels, kDepthLevels, -1);
    else
      std::copy(in.force.begin(), in.force.end(), ints + kDepthLevels);
    check(cudaMemcpyAsync(w_.x0, s.x0.as<float>(), static_cast<size_t>(m_.hidden) * sizeof(float),
                          cudaMemcpyHostToDevice, stream_),
          "upload h");
    check(cudaMemcpyAsync(noise_.data(), noise, static_cast<size_t>(kNoise) * sizeof(float), cudaMemcpyHostToDevice,
                          stream_),
          "upload noise");
    check(cudaMemcpyAsync(codes_.data(), ints, 2 * kDepthLevels * sizeof(int32_t), cudaMemcpyHostToDevice, stream_),
          "upload codes");
    run_levels();
    Results& r = results_[slot];
    check(cudaMemcpyAsync(r.codes.as<int32_t>(), codes_.data(), kDepthLevels * sizeof(int32_t), cudaMemcpyDeviceToHost,
                          stream_),
          "download codes");
    r.logits = logits;
    if (logits)
      check(cudaMemcpyAsync(r.values.as<float>(), w_.logits, static_cast<size_t>(kNoise) * sizeof(float),
                            cudaMemcpyDeviceToHost, stream_),
            "download logits");
    check(cudaEventRecord(done_[slot], stream_), "record");
    ++submitted_;
  }

  void collect(std::array<int32_t, kDepthLevels>& codes, std::vector<float>* logits) override {
    if (collected_ == submitted_) fail(Errc::internal, "[depth] cuda: no frame in flight");
    const int slot = static_cast<int>(collected_ % 2);
    ++collected_;
    check(cudaEventSynchronize(done_[slot]), "frame");
    kc::check_last_error("[depth] cuda frame");
    const Results& r = results_[slot];
    std::copy_n(r.codes.as<int32_t>(), kDepthLevels, codes.begin());
    if (logits && r.logits) logits->assign(r.values.as<float>(), r.values.as<float>() + kNoise);
  }

 private:
  friend class GpuOps;

  // The first frame runs eagerly (loading the kernels' modules), then its graph is captured for later frames.
  void run_levels() {
    if (graph_) {
      check(cudaGraphLaunch(graph_, stream_), "graph launch");
      return;
    }
    GpuOps ops(*this);
    depth_frame(ops, w_, m_.d, m_.ffn);
    kc::check_last_error("[depth] cuda frame");
    cudaGraph_t graph = nullptr;
    check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "begin capture");
    try {
      depth_frame(ops, w_, m_.d, m_.ffn);
    } catch (...) {
      cudaStreamEndCapture(stream_, &graph);
      if (graph) cudaGraphDestroy(graph);
      throw;
    }
    check(cudaStreamEndCapture(stream_, &graph), "end capture");
    const cudaError_t status = cudaGraphInstantiate(&graph_, graph, 0);
    cudaGraphDestroy(graph);
    check(status, "graph instantiate");
  }

  // A frame's inputs on the host, and its outputs: two of each, one per frame in flight.
  struct Staging {
    Pinned x0, noise, ints;  // ints: codes (cb0 first) then force
    explicit Staging(int64_t hidden)
        : x0(static_cast<size_t>(hidden) * sizeof(float)),
          noise(static_cast<size_t>(kNoise) * sizeof(float)),
          ints(2 * kDepthLevels * sizeof(int32_t)) {}
  };
  struct Results {
    Pinned codes{kDepthLevels * sizeof(int32_t)};
    Pinned values{static_cast<size_t>(kNoise) * sizeof(float)};  // logits
    bool logits = false;
  };

  const DepthDecoder::Impl& m_;
  kc::ElemType round_;
  float scale_;
  GpuLinear in_proj_;
  kc::DeviceBuffer level_emb_;
  std::vector<GpuBlock> blocks_;  // [group * layers + layer]
  GpuNorm norm_;
  std::vector<GpuLinear> heads_;
  ExactValues code_lo_;         // [31 * 2048, R], as code_rows gives it
  kc::DeviceBuffer code_up_t_;  // [R, D]
  kc::DeviceBuffer cross_;      // [layers, D]
  kc::DeviceBuffer noise_;      // [31, 2048]
  kc::DeviceBuffer codes_;      // [32] codes, then [32] force
  kc::DeviceBuffer work_;
  DepthWork w_;
  cudaStream_t stream_ = nullptr;
  cudaGraphExec_t graph_ = nullptr;
  std::array<Staging, 2> staging_{Staging(m_.hidden), Staging(m_.hidden)};
  std::array<Results, 2> results_;
  std::array<cudaEvent_t, 2> done_{};
  int64_t submitted_ = 0, collected_ = 0;
};

GpuOps::GpuOps(const CudaDepth& g) : g_(g) {}
const GpuLinear& GpuOps::in_proj() const { return g_.in_proj_; }
const float* GpuOps::level_emb() const { return g_.level_emb_.as<float>(); }
const GpuBlock& GpuOps::block(int group, int layer) const {
  return g_.blocks_[static_cast<size_t>(group) * kDepthLayers + static_cast<size_t>(layer)];
}
const GpuNorm& GpuOps::final_norm() const { return g_.norm_; }
const GpuLinear& GpuOps::head(int i) const { return g_.heads_[static_cast<size_t>(i)]; }
const float* GpuOps::cross(int layer) const { return g_.cross_.as<float>() + layer * g_.m_.d; }

void GpuOps::matmul(const float* x, int64_t rows, const GpuLinear& w, float* out) const {
  kc::launch_depth_matmul(x, static_cast<int>(rows), w.panels, g_.round_, out, g_.stream_);
}
void GpuOps::layer_norm(const float* x, int64_t rows, const GpuNorm& n, float* out) const {
  kc::launch_depth_layer_norm(x, static_cast<int>(rows), g_.m_.d, n.w.as<float>(), n.b.as<float>(), g_.round_, out,
                              g_.stream_);
}
void GpuOps::add(float* x, const float* y, int64_t rows, int64_t y_stride) const {
  kc::launch_depth_add(x, y, static_cast<int>(rows), g_.m_.d, y_stride, g_.round_, g_.stream_);
}
void GpuOps::gelu(float* x, int64_t count) const { kc::launch_depth_gelu(x, count, g_.round_, g_.stream_); }
void GpuOps::attend(const float* q, int64_t q_stride, const float* k, const float* v, int64_t kv_stride,
                    int64_t queries, int64_t n, float* out) const {
  kc::launch_depth_attend(q, q_stride, k, v, kv_stride, static_cast<int>(queries), static_cast<int>(n), g_.m_.d,
                          static_cast<int>(g_.m_.head), g_.scale_, g_.round_, out, g_.stream_);
}
void GpuOps::copy_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t rows,
                       int64_t width) const {
  check(cudaMemcpy2DAsync(dst, static_cast<size_t>(dst_stride) * sizeof(float), src,
                          static_cast<size_t>(src_stride) * sizeof(float), static_cast<size_t>(width) * sizeof(float),
                          static_cast<size_t>(rows), cudaMemcpyDeviceToDevice, g_.stream_),
        "copy rows");
}
void GpuOps::sample(int level, const float* logits) const {
  kc::launch_depth_sample(logits, g_.noise_.as<float>() + int64_t{level - 1} * kDepthCodes, g_.m_.inv_temp,
                          g_.m_.options.top_k, level, g_.codes_.as<int32_t>(), g_.stream_);
}
void GpuOps::embed(int level, float* out) const {
  kc::launch_depth_embed(level, g_.codes_.as<int32_t>(), g_.codes_.as<int32_t>() + kDepthLevels,
                         g_.code_lo_.buffer.data(), g_.code_lo_.type, g_.m_.code_lo.shape[1], g_.code_up_t_.as<float>(),
                         g_.level_emb_.as<float>(), g_.m_.d, g_.round_, out, g_.stream_);
}

}  // namespace

std::unique_ptr<DepthDevice> make_cuda_depth(const DepthDecoder::Impl& model) {
  std::string why;
  if (!kc::device_available(&why)) fail(Errc::unsupported, "[depth] cuda: no usable CUDA device: {}", why);
  return std::make_unique<CudaDepth>(model);
}

}  // namespace lowbit::model
