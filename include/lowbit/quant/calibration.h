// Calibration: the model runs over a calibration text, layer by layer, and each linear's input second moment
// H = sum of x x^T is collected (GPTQ's Hessian). Layers are processed in order so that a layer's inputs come
// from the already-quantized layers before it: the caller quantizes layer l between capture(l) and advance(l).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "lowbit/model/model.h"
#include "lowbit/quant/gptq.h"

namespace lowbit::quant {

// The four distinct linear inputs of a layer (model/family.h derives them from the roles: q/k/v or qkv share
// one, gate/up or gate_up share one).
using model::LinearInput;

struct LayerHessians {
  Hessian attn_in, attn_out, ffn_in, ffn_mid;
  // Per expert of an MoE layer, from the rows routed to it only: the input of its gate and up, of its down.
  std::vector<Hessian> expert_in, expert_mid;
  Hessian& of(LinearInput input);
  // The Hessian of a layer linear: the one shared by its input, or its expert's own (expert >= 0). nullptr for an
  // expert whose Hessian has fewer samples (routed tokens) than its width: such a Hessian is singular beyond what
  // GPTQ's damping repairs, so that expert is rounded plainly (the report says "rtn" for its tensors).
  Hessian* for_linear(LinearInput input, int32_t expert);
  // The rows that Hessian was collected from (for an expert: the tokens routed to it).
  uint64_t rows(LinearInput input, int32_t expert);
};
// Whether `input` is read by the linears of one expert only (expert_in, expert_mid).
bool is_expert_input(LinearInput input);

// A linear of a layer as the model's description names it: its layer, role and input ("model.layers.3.
// mlp.down_proj.weight" in a llama -> 3, down, ffn_mid); nullopt for tensors outside the layers' linears.
struct LayerLinear {
  int64_t layer;
  model::Role role;
  LinearInput input;
  int32_t expert = -1;  // the expert of an expert tensor
};
std::optional<LayerLinear> layer_linear(const model::ModelDesc& desc, std::string_view tensor_name);

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
