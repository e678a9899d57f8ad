// The Llama layer, which the Llama-shaped families (mistral, qwen2, qwen3) describe themselves with: a
// pre-norm attention block and a pre-norm SwiGLU MLP, each added to the residual stream.
#pragma once

#include <string_view>

#include <nlohmann/json.hpp>

#include "lowbit/model/family.h"

namespace lowbit::model {

struct LlamaLayerOptions {
  bool qkv_bias = false;    // biases on q, k and v
  bool qk_norm = false;     // an RMSNorm over each head of q and k before RoPE
  int64_t window = 0;       // sliding-window attention (0: every earlier key)
};

// Every layer alike: RMSNorm, HF's RoPE table from the config, scale 1 / sqrt(head_dim).
ModelDesc llama_model(const ModelConfig& c, const LlamaLayerOptions& options);

// Refuses a hidden_act other than silu (exit 3 naming the file and the field).
void require_silu(const nlohmann::json& hf, std::string_view source);

}  // namespace lowbit::model
