// The depth decoder of seed 004 (model family `depth_decoder`): per audio frame, 31 codebook levels sampled by a
// small transformer in 11 weight groups from the backbone's hidden state and level 0's code, and the feedback
// vector the backbone reads next. Every numeric rule is the seed's (its code run on MLX's CPU backend is the
// reference, scripts/make_depth_fixtures.py): activations rounded to the compute dtype after every operation the
// seed rounds, LayerNorm and GELU in fp32 with one rounding, matmuls accumulating in fp32 in input order with one
// rounding, MLX's CPU exp and erf, the top-k Gumbel sampler fed with the caller's uniforms. docs/FORMAT.md
// ("Depth decoder directories") describes the model directory and the input and output files.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "lowbit/core/dtype.h"

namespace lowbit::model {

inline constexpr int kDepthLevels = 32;   // level 0 comes from the backbone; 31 are sampled here
inline constexpr int kDepthCodes = 2048;  // codes per level
inline constexpr int kDepthGroups = 11;   // weight groups
inline constexpr int kDepthLayers = 4;    // blocks per group
inline constexpr int kDepthHeads = 16;    // attention heads
inline constexpr std::array<int, kDepthLevels> kDepthGroupOfLevel = {
    -1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 8, 8, 8, 8, 8, 8, 8, 9, 9, 9, 9, 9, 9, 9, 9, 10, 10, 10, 10, 10, 10, 10};

struct DepthOptions {
  DType dtype = DType::F16;  // compute dtype: F16, BF16 or F32
  double temperature = 0.7;  // the sampler scales logits by fp32(1 / temperature), as the seed does
  int top_k = 64;
  // Frames on the GPU (the build's CUDA runtime; Errc::usage in a build without CUDA), bit-identical to the CPU.
  bool cuda = false;
};

// One frame's inputs. `force` (optional, 32 codes): entry l replaces the sampled code of level l as the input of
// level l + 1 (teacher forcing); the returned codes stay the sampled ones.
struct DepthFrameIn {
  std::span<const uint16_t> h;  // [hidden] bf16
  int32_t cb0 = 0;
  std::span<const float> uniform;  // [31 * 2048]
  std::span<const int32_t> force;  // empty or [32]
};

struct DepthFrameOut {
  std::array<int32_t, kDepthLevels> codes{};
  std::vector<float> feedback;  // [hidden], values of the feedback dtype
  std::vector<float> logits;    // [31 * 2048] when asked for, values of the compute dtype
};

class DepthDecoder {
 public:
  // Loads MODEL/depth.safetensors (+ quant.json). Every tensor is checked by name, shape and dtype; a missing,
  // extra or misshapen one is Errc::shape / Errc::format naming it (exit 3).
  static DepthDecoder load(const std::filesystem::path& dir, const DepthOptions& options = {});
  DepthDecoder(DepthDecoder&&) noexcept;
  DepthDecoder& operator=(DepthDecoder&&) noexcept;
  ~DepthDecoder();

  int64_t width() const;         // D: the depth transformer's width (= the speaker memory's length)
  int64_t hidden() const;        // the backbone's width (h and feedback)
  DType feedback_dtype() const;  // audio_in.norm.weight's dtype
  DType dtype() const;

  bool on_cuda() const;

  // The cross-attention term from a speaker memory [width] (values of any float dtype), or the learned null
  // memory when `memory` is empty. Must be called before frame().
  void set_speaker(std::span<const float> memory);
  // One frame. On the CPU any number of threads may call it; on the GPU one at a time.
  DepthFrameOut frame(const DepthFrameIn& in, bool logits) const;
  // Frames 0 .. count - 1: in_of(t) gives frame t's inputs (its spans must stay valid until sink(t) is called),
  // sink(t, out) takes its outputs. On the CPU frames run in parallel on the thread pool (whole frames, or each
  // matmul when there are fewer frames than threads) and sink is called from its threads; on the GPU in order,
  // two in flight, so that the host prepares the next frame's noise and finishes the last one's feedback while
  // the device runs.
  void frames(int64_t count, bool logits, const std::function<DepthFrameIn(int64_t)>& in_of,
              const std::function<void(int64_t, const DepthFrameOut&)>& sink) const;

  struct Impl;  // src/model/depth_decoder_impl.h, shared with the GPU runtime

 private:
  explicit DepthDecoder(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// `lowbit depth`: reads IN (h, cb0, uniform, optional force and speaker; every tensor checked, exit 3 naming
// it), runs every frame (frames()) and writes OUT atomically: codes [frames, 32] I32,
// feedback [frames, hidden] in the feedback dtype and, with `logits`, logits [frames, 31, 2048] in the compute
// dtype. Returns the number of frames.
int64_t run_depth_file(DepthDecoder& model, const std::filesystem::path& in, const std::filesystem::path& out,
                       bool logits);

}  // namespace lowbit::model
