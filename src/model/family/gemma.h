// What Gemma 2 and Gemma 3 share (gemma2.cpp, gemma3.cpp): the decoder layer with a norm after attention and
// after the MLP, (1 + w) RMSNorm gains, a tanh-GELU gated MLP, query_pre_attn_scalar, alternating sliding-window
// and full-attention layers, and a sqrt(dim)-scaled embedding.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "lowbit/model/family.h"

namespace lowbit::model::gemma {

// The fields both read from config.json: head_dim, hidden_activation, query_pre_attn_scalar, sliding_window,
// layer_types (else every `pattern`-th layer full, the rest sliding: HF's and llama.cpp's default),
// final_logit_softcapping.
void parse_hf(const nlohmann::json& hf, ModelConfig& c, std::string_view source, int64_t pattern);
// The same from GGUF metadata (llama.cpp's keys): attention.sliding_window (default `default_window`),
// attention.sliding_window_pattern (a period or a per-layer bool array; default `pattern`), the soft-caps, and
// the attention scale llama.cpp derives (1 / sqrt(head_dim), except Gemma's 27B models: 1 / sqrt(dim / heads)).
void parse_gguf(const io::GgufFile& f, const std::string& arch, ModelConfig& c, int64_t pattern,
                int64_t default_window);
// Writes those fields back as HF config.json keys.
void write_hf(const ModelConfig& c, nlohmann::json& hf);
// The layers; qk_norm: Gemma 3's per-head norms of q and k. RoPE table 0 is rope_theta with rope_scaling; layers
// on the sliding window use table `sliding_rope`.
ModelDesc describe(const ModelConfig& c, bool qk_norm, int sliding_rope);

}  // namespace lowbit::model::gemma
