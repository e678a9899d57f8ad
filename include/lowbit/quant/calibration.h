// Calibration: the model runs over a calibration text, layer by layer, and each linear's input second moment
// H = sum of x x^T is collected (GPTQ's Hessian). Layers are processed in order so that a layer's inputs come
// from the already-quantized layers before it: the caller quantizes layer l between capture(l) and advance(l).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "lowbit/model/model.h"
#include "lowbit/quant/gptq.h"

namespace lowbit::quant {

// The four distinct linear inputs of a Llama-family layer: q/k/v share one, gate/up share one.
enum class LinearInput { attn_in, attn_out, ffn_in, ffn_mid };

struct LayerHessians {
  Hessian attn_in, attn_out, ffn_in, ffn_mid;
  Hessian& of(LinearInput input);
};

// Which input a layer tensor reads ("model.layers.3.mlp.down_proj.weight" -> ffn_mid); false for tensors
// outside the layers' linears.
bool linear_input_of(std::string_view tensor_name, int64_t& layer, LinearInput& input);

struct CalibrationText {
  std::vector<std::vector<int32_t>> windows;  // each starts with BOS when the tokenizer has one
  std::string sha256;                         // of the text (decompressed when the file is gzip)
  int64_t tokens() const;
};

// Reads `path` (plain text or gzip, io/text_file.h), tokenizes it and cuts it into `ctx`-token windows until
// `max_tokens` tokens are taken.
CalibrationText load_calibration(const std::filesystem::path& path, const model::Tokenizer& tokenizer,
                                 int64_t max_tokens, int64_t ctx);

class LayerwiseCalibrator {
 public:
  LayerwiseCalibrator(model::Model& model, const CalibrationText& text);
  // Runs layer l over the current hidden states, capturing its linears' input moments. Does not advance.
  LayerHessians capture(int64_t layer);
  // Runs layer l (now possibly quantized) over the hidden states, which become layer l + 1's inputs.
  void advance(int64_t layer);

 private:
  void run_layer(int64_t layer);
  model::Model& model_;
  int64_t ctx_ = 0;
  std::vector<std::vector<float>> hidden_;  // per window [len, dim]
};

}  // namespace lowbit::quant
