// Qwen3-ASR's audio encoder on the GPU (speech.h's AudioEncoderDevice), the same steps as encode_audio on the
// CPU: per chunk of the log-mel features the three stride-2 convolutions (patches, then a GEMM each, bias and GELU),
// conv_out over the time rows and the sinusoidal positions; the Transformer layers as a CudaModel of the family
// description (no vocabulary, bidirectional attention, one prefill pass per attention window) whose final norm is
// ln_post; the projector (two GEMMs, GELU between). Built only with LOWBIT_CUDA=ON.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>

#include "lowbit/core/error.h"
#include "lowbit/kernels/cuda.h"
#include "lowbit/kernels/cuda_model_ops.h"
#include "lowbit/model/cuda_model.h"
#include "lowbit/model/speech.h"

namespace lowbit::model {

namespace kc = kernels::cuda;

namespace {

void check(cudaError_t status, const char* op) {
  if (status != cudaSuccess) fail(Errc::internal, "[cuda_speech] {}: {}", op, cudaGetErrorString(status));
}

kc::DeviceBuffer upload_floats(std::span<const float> values) {
  kc::DeviceBuffer b(values.size() * sizeof(float));
  b.upload(values.data(), b.size());
  return b;
}

kc::DeviceBuffer floats(int64_t n) { return kc::DeviceBuffer(static_cast<size_t>(n) * sizeof(float)); }

class CudaAudioEncoder final : public AudioEncoderDevice {
 public:
  explicit CudaAudioEncoder(const SpeechModel& sm) : a_(sm.audio) {
    const auto tensor = [&](const std::string& key) -> const codec::TensorRef& {
      const auto it = sm.encoder_tensors.find(key);
      if (it == sm.encoder_tensors.end()) fail(Errc::internal, "[cuda_speech] encoder tensor '{}' not loaded", key);
      return it->second;
    };
    for (size_t k = 0; k < 3; ++k) {
      const int64_t in = k == 0 ? 1 : a_.conv_channels;
      conv_[k] = kc::prepare_cuda(dense_f32_ref({a_.conv_channels, in * 9}, sm.conv_weight[k]));
      conv_bias_[k] = upload_floats(sm.conv_bias[k]);
    }
    conv_out_ = kc::prepare_cuda(tensor("conv_out.weight"));
    proj1_ = kc::prepare_cuda(tensor("proj1.weight"));
    proj2_ = kc::prepare_cuda(tensor("proj2.weight"));
    proj1_bias_ = upload_floats(codec::decode_all(tensor("proj1.bias")));
    proj2_bias_ = upload_floats(codec::decode_all(tensor("proj2.bias")));
    positions_ = upload_floats(sm.positions);
    // One attention window per prefill pass, from position 0 of slot 0 (each window overwrites the last's keys).
    const ModelConfig& c = sm.encoder.config;
    layers_ = std::make_unique<CudaModel>(
        c, sm.encoder.desc,
        [&](const std::string& name) {
          const auto it = sm.encoder_tensors.find(name);
          return it == sm.encoder_tensors.end() ? nullptr : &it->second;
        },
        CudaModelOptions{.max_batch = 1, .prefill_rows = c.max_seq, .slots = 1, .capacity = c.max_seq});
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "stream");
  }
  ~CudaAudioEncoder() override {
    if (stream_) cudaStreamDestroy(stream_);
  }
  CudaAudioEncoder(const CudaAudioEncoder&) = delete;
  CudaAudioEncoder& operator=(const CudaAudioEncoder&) = delete;

  std::vector<float> encode(const LogMel& mel) override {
    const EncoderPlan plan = plan_encoder(a_, mel);
    const int64_t d = a_.d_model, tokens = plan.total;
    std::vector<float> x(static_cast<size_t>(tokens * d));
    front_end(mel, plan, x);
    std::vector<float> hidden(x.size());
    for (int64_t start = 0; start < tokens; start += plan.window) {
      const int64_t n = std::min(plan.window, tokens - start);
      layers_->prefill_rows(std::span(x).subspan(static_cast<size_t>(start * d), static_cast<size_t>(n * d)), 0, 0,
                            CudaModel::Logits::none, nullptr);
      layers_->download_hidden(0, n, hidden.data() + start * d);
    }
    return project(hidden, tokens);
  }

 private:
  // x [tokens, d_model] = conv_out(the convolutions of each chunk's features) + positions.
  void front_end(const LogMel& mel, const EncoderPlan& plan, std::vector<float>& x) {
    const int64_t chunk = a_.chunk_frames(), d = a_.d_model, ch = a_.conv_channels;
    // the largest patches and outputs: the first convolution's over one channel, the second's over ch
    const int64_t h1 = (mel.bins + 1) / 2, w1 = (chunk + 1) / 2, h2 = (h1 + 1) / 2, w2 = (w1 + 1) / 2;
    kc::DeviceBuffer in = floats(mel.bins * chunk), patches = floats(std::max(h1 * w1 * 9, h2 * w2 * ch * 9));
    std::array<kc::DeviceBuffer, 2> act = {floats(h1 * w1 * ch), floats(h1 * w1 * ch)};
    kc::DeviceBuffer rows = floats(plan.window * ch * a_.conv_freq()), out = floats(plan.window * d);
    int64_t row = 0;
    for (size_t i = 0; i < plan.tokens.size(); ++i) {
      const int64_t n = plan.tokens[i];
      if (n == 0) continue;
      // the chunk [bins, chunk frames] of features [bins, padded_frames]: [h, w, 1] channels last
      check(cudaMemcpy2DAsync(in.data(), static_cast<size_t>(chunk) * sizeof(float),
                              mel.values.data() + static_cast<int64_t>(i) * chunk,
                              static_cast<size_t>(mel.padded_frames) * sizeof(float),
                              static_cast<size_t>(chunk) * sizeof(float), static_cast<size_t>(mel.bins),
                              cudaMemcpyHostToDevice, stream_),
            "upload features");
      const float* src = in.as<float>();
      int64_t h = mel.bins, w = chunk, ci = 1;
      for (size_t k = 0; k < 3; ++k) {
        const int64_t oh = (h + 1) / 2, ow = (w + 1) / 2;
        float* dst = act[k % 2].as<float>();
        kc::launch_conv3x3s2_patches(src, h, w, ci, patches.as<float>(), stream_);
        conv_[k]->gemm(patches.as<float>(), oh * ow, dst, stream_);
        kc::launch_activation(kc::ActType::gelu_erf, nullptr, dst, conv_bias_[k].as<float>(), ch, dst,
                              static_cast<int>(oh * ow), ch, stream_);
        src = dst;
        h = oh, w = ow, ci = ch;
      }
      kc::launch_conv_time_rows(src, h, w, ch, n, rows.as<float>(), stream_);
      conv_out_->gemm(rows.as<float>(), n, out.as<float>(), stream_);
      kc::launch_add(out.as<float>(), positions_.as<float>(), static_cast<int>(n), d, stream_);
      check(cudaMemcpyAsync(x.data() + row * d, out.data(), static_cast<size_t>(n * d) * sizeof(float),
                            cudaMemcpyDeviceToHost, stream_),
            "download chunk");
      check(cudaStreamSynchronize(stream_), "synchronize");  // `in`, `rows` and `out` are reused
      row += n;
    }
    kc::check_last_error("cuda_speech front end");
  }

  // [tokens, output_dim] = proj2(gelu(proj1(hidden) + bias)) + bias.
  std::vector<float> project(const std::vector<float>& hidden, int64_t tokens) {
    const int64_t d = a_.d_model, od = a_.output_dim;
    kc::DeviceBuffer in = upload_floats(hidden), mid = floats(tokens * d), out = floats(tokens * od);
    proj1_->gemm(in.as<float>(), tokens, mid.as<float>(), stream_);
    kc::launch_activation(kc::ActType::gelu_erf, nullptr, mid.as<float>(), proj1_bias_.as<float>(), d, mid.as<float>(),
                          static_cast<int>(tokens), d, stream_);
    proj2_->gemm(mid.as<float>(), tokens, out.as<float>(), stream_);
    kc::launch_add_bias(out.as<float>(), proj2_bias_.as<float>(), static_cast<int>(tokens), od, stream_);
    std::vector<float> result(static_cast<size_t>(tokens * od));
    check(cudaMemcpyAsync(result.data(), out.data(), result.size() * sizeof(float), cudaMemcpyDeviceToHost, stream_),
          "download projection");
    check(cudaStreamSynchronize(stream_), "synchronize");
    kc::check_last_error("cuda_speech projector");
    return result;
  }

  AudioEncoderConfig a_;
  std::array<std::unique_ptr<kc::CudaLinear>, 3> conv_;
  std::array<kc::DeviceBuffer, 3> conv_bias_;
  std::unique_ptr<kc::CudaLinear> conv_out_, proj1_, proj2_;
  kc::DeviceBuffer proj1_bias_, proj2_bias_, positions_;
  std::unique_ptr<CudaModel> layers_;
  cudaStream_t stream_ = nullptr;
};

}  // namespace

std::shared_ptr<AudioEncoderDevice> make_cuda_audio_encoder(const SpeechModel& sm) {
  return std::make_shared<CudaAudioEncoder>(sm);
}

}  // namespace lowbit::model
