// Speech recognition with Qwen3-ASR: an audio encoder (three stride-2 Conv2d over 100-frame chunks of the
// log-mel features, conv_out, sinusoidal positions, Transformer layers with bidirectional attention inside windows
// of n_window_infer frames, ln_post, a two-layer GELU projector) whose outputs replace the audio placeholder
// tokens of the prompt of a Qwen3 text decoder, which then decodes greedily.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "lowbit/codec/codec.h"
#include "lowbit/model/log_mel.h"
#include "lowbit/model/model.h"
#include "lowbit/model/sampler.h"

namespace lowbit::model {

struct AudioEncoderConfig {
  int64_t mel_bins = 128;  // num_mel_bins
  int64_t layers = 24;     // encoder_layers
  int64_t heads = 16;      // encoder_attention_heads
  int64_t ffn_dim = 4096;  // encoder_ffn_dim
  int64_t d_model = 1024;
  int64_t output_dim = 2048;     // the projector's output: the text decoder's width
  int64_t conv_channels = 480;   // downsample_hidden_size
  int64_t n_window = 50;         // a conv chunk is 2 * n_window mel frames
  int64_t n_window_infer = 800;  // an attention window spans this many mel frames (whole chunks)
  int64_t positions = 13;        // max_position_embeddings: outputs of one chunk

  int64_t chunk_frames() const { return 2 * n_window; }
  int64_t conv_freq() const { return (((mel_bins + 1) / 2 + 1) / 2 + 1) / 2; }
  // Tokens after the three stride-2 convolutions of a chunk of `frames` valid frames (0 stays 0).
  static int64_t conv_tokens(int64_t frames);
  int64_t window_tokens() const { return conv_tokens(chunk_frames()) * (n_window_infer / chunk_frames()); }
};

// How encode_audio takes features of `mel.frames` valid frames (Errc::shape when they do not fit `a`): each chunk of
// chunk_frames() gives tokens[i] audio tokens (0 for chunks past the valid frames), `total` in all; the encoder's
// layers attend within windows of `window` consecutive tokens (n_window_infer frames' worth of the longest chunk's
// tokens, as transformers' get_audio_cu_seqlens).
struct EncoderPlan {
  std::vector<int64_t> tokens;
  int64_t total = 0, window = 0;
};
EncoderPlan plan_encoder(const AudioEncoderConfig& a, const LogMel& mel);

// The audio encoder on a device (make_cuda_audio_encoder): encode_audio's work for features encode_audio checked.
class AudioEncoderDevice {
 public:
  virtual ~AudioEncoderDevice() = default;
  virtual std::vector<float> encode(const LogMel& mel) = 0;
};

// Reads config.json's audio_config (or thinker_config.audio_config): Errc::format naming `source` and the field.
AudioEncoderConfig parse_audio_encoder_config(const nlohmann::json& audio, std::string_view source);

struct SpeechModel {
  std::unique_ptr<Model> decoder;  // the Qwen3 text decoder
  AudioEncoderConfig audio;
  MelOptions mel;
  // The encoder's layers as a model of their own (config, desc, layers only): forward_layers runs them.
  Model encoder;
  std::array<std::vector<float>, 3> conv_weight;  // [out, in * 9]: torch's [out, in, 3, 3]
  std::array<std::vector<float>, 3> conv_bias;    // [out]
  // Each convolution as a matmul over the 3x3 patches of its input (viewing conv_weight).
  std::array<std::unique_ptr<kernels::CpuLinear>, 3> conv;
  std::unique_ptr<kernels::CpuLinear> conv_out;  // [d_model, conv_channels * conv_freq], no bias
  std::vector<float> ln_post_weight, ln_post_bias;
  std::unique_ptr<kernels::CpuLinear> proj1, proj2;  // [d_model, d_model], [output_dim, d_model]
  std::vector<float> proj1_bias, proj2_bias;
  std::vector<float> positions;  // [positions, d_model] sinusoids
  // Every encoder tensor as loaded, for a device's upload: the layers' under hf_tensor_name, ln_post under
  // kFinalNormTensor / kFinalNormBiasTensor, and "conv_out.weight", "proj1.weight", "proj1.bias", "proj2.weight",
  // "proj2.bias" (their storage kept alive by decoder and keep_alive).
  std::map<std::string, codec::TensorRef> encoder_tensors;
  std::shared_ptr<AudioEncoderDevice> encoder_device;  // null: encode_audio runs on the CPU
  int32_t audio_token = 151676, audio_start_token = 151669, audio_end_token = 151670;
  std::vector<std::shared_ptr<const void>> keep_alive;
};

// A transformers qwen3_asr checkpoint as `lowbit quantize` takes it: the text decoder as a model of its own (HF
// names, model.language_model.* read as model.*) and the audio tower's and projector's tensors under their own
// names (model.audio_tower.*, model.multi_modal_projector.*), which the decoder's keep_alive holds.
struct SpeechCheckpoint {
  std::unique_ptr<Model> decoder;
  std::vector<NamedTensor> tower;
};
bool is_qwen3_asr_checkpoint(const std::filesystem::path& dir);  // config.json's model_type is qwen3_asr
SpeechCheckpoint load_qwen3_asr_checkpoint(const std::filesystem::path& dir, const LoadOptions& options);

// Loads a transformers qwen3_asr directory (Qwen3ASRForConditionalGeneration: model.audio_tower.*,
// model.multi_modal_projector.*, model.language_model.*, lm_head), a lowbit artifact quantized from one (its
// config.json file the source's, the decoder's tensors under model.*), or a Phonon directory (mlx_audio's names:
// audio_tower.* with proj1/proj2 and MLX conv layout, the text decoder as the phonon reader opens it). Any tensor
// the description does not name, or one missing or of another shape, is Errc::format / Errc::shape naming it.
// `device` "cuda" runs the encoder (its convolutions, layers and projector) and the decoder on the GPU
// (Errc::usage in a build without CUDA); "cpu" keeps both on the CPU, holding the decoder's weights once.
std::unique_ptr<SpeechModel> load_speech_model(const std::filesystem::path& dir, std::string_view device = "cpu");

// The projected encoder output [plan_encoder(..).total, output_dim] for features of mel.padded_frames (a multiple
// of the chunk), on the CPU or model.encoder_device.
std::vector<float> encode_audio(const SpeechModel& model, const LogMel& mel, ThreadPool& pool);

struct TranscribeOptions {
  std::optional<std::string> language;  // forces "language <L><asr_text>" after the prompt
  int64_t max_tokens = 1024;
  // Greedy by default (temperature 0, as mlx_audio's default); temperature > 0 samples (sampler.h), one sampler
  // across all chunks of long audio.
  SamplerOptions sampler{.temperature = 0.0f};
  double chunk_seconds = 1200.0;  // longer audio is split (split_audio), as mlx_audio's chunk_duration
};

// Samples [begin, end) of one chunk of long audio.
struct AudioChunk {
  int64_t begin = 0, end = 0;
  bool operator==(const AudioChunk&) const = default;
};
// mlx_audio's split_audio_into_chunks: audio of at most chunk_seconds is one chunk; longer audio is cut near each
// chunk_seconds mark at the lowest mean energy over 100 ms windows within 5 s of it, each chunk at least a second.
std::vector<AudioChunk> split_audio(std::span<const float> samples, int64_t rate, double chunk_seconds);

struct Transcript {
  std::string text;                // decoded token_ids
  std::vector<int32_t> token_ids;  // generated, without the prompt and the final end-of-sequence token
  int64_t audio_tokens = 0, prompt_tokens = 0;
  double features_seconds = 0, encoder_seconds = 0, prefill_seconds = 0, decode_seconds = 0;
};

// Transcription of 16 kHz mono samples (greedy, or sampled per options.sampler); audio split into several chunks is
// transcribed chunk by chunk (each zero-padded to a second) within one max_tokens, the texts joined by spaces, as
// mlx_audio does.
Transcript transcribe(const SpeechModel& model, const Tokenizer& tokenizer, std::span<const float> samples,
                      const TranscribeOptions& options, ThreadPool& pool);

}  // namespace lowbit::model
