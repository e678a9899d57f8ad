// The hyperparameters of a decoder, whatever file they came from (llama2.c header, HF config.json, GGUF
// metadata, artifact config): generic numbers only. What a family's layer is made of (which norms, biases and
// ops) is its description in family.h, derived from these numbers by the family named in `arch`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace lowbit::model {

// How RoPE pairs the dimensions of a head: Hugging Face rotates element i with i + head_dim/2 ("half");
// llama2.c and GGUF's llama rotate adjacent pairs (2i, 2i+1) ("interleaved"). The q/k weight rows of the two
// layouts differ by a fixed permutation (see permute_rope_rows in model.h).
enum class RopeStyle { half, interleaved };

// RoPE frequency scaling as in HF's rope_scaling: none, "linear" (positions / factor), "llama3" (per-frequency
// blend between scaled and unscaled) or "longrope" (phi3: per-frequency divisors, the short set while the context
// fits original_max_position and the long set beyond, as llama.cpp picks them by context size; cos and sin scaled
// by attention_factor).
struct RopeScaling {
  enum class Kind { none, linear, llama3, longrope } kind = Kind::none;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position = 8192;
  std::vector<float> short_factor, long_factor;  // longrope: [rope_dims / 2] each
  double attention_factor = 1.0;                 // longrope
};

struct ModelConfig {
  std::string arch = "llama";  // the family table's name (family.h)
  int64_t dim = 0;             // hidden size
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;  // usually dim / n_heads; qwen3 sets it explicitly
  int64_t hidden_dim = 0;  // MLP intermediate size
  int64_t vocab = 0;
  int64_t max_seq = 2048;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  RopeStyle rope_style = RopeStyle::half;
  float norm_eps = 1e-5f;
  bool tied_embeddings = false;
  bool qkv_bias = false;        // biases on q, k and v (HF attention_bias; qwen2 always)
  // Sliding-window attention: a query at position p sees keys p - sliding_window + 1 .. p, itself included (0:
  // every earlier key), on the layers sliding_layers marks (gemma2/3 alternate window and full layers; empty:
  // every layer, as mistral and phi3 window).
  int64_t sliding_window = 0;
  std::vector<bool> sliding_layers;  // [n_layers] or empty
  double rope_local_theta = 0.0;     // RoPE base of the sliding-window layers (gemma3); 0: rope_theta
  int64_t rope_dims = 0;             // rotated dimensions of each head (partial rotary); 0: head_dim
  float attn_scale = 0.0f;           // scores = (q . k) * attn_scale; 0: 1 / sqrt(head_dim)
  float attn_softcap = 0.0f;         // scores = attn_softcap * tanh(scores / attn_softcap) when > 0 (gemma2)
  float final_softcap = 0.0f;        // the same on the logits (gemma2/3)
  // Mixture-of-Experts MLPs (qwen3_moe, mixtral); n_experts 0: dense.
  int64_t n_experts = 0;          // experts per MoE layer
  int64_t n_experts_used = 0;     // top-k experts each token runs
  int64_t expert_hidden_dim = 0;  // each expert's intermediate size (qwen3_moe: moe_intermediate_size)
  bool norm_topk_prob = true;     // renormalise the top-k routing weights to sum 1
  std::vector<int64_t> dense_layers;  // layers with a dense MLP (hidden_dim) in an MoE model, ascending
  std::vector<int32_t> eos_ids;  // from config.json / generation_config.json when given
  std::optional<int32_t> bos_id;

  int64_t q_dim() const { return n_heads * head_dim; }
  int64_t kv_dim() const { return n_kv_heads * head_dim; }
  int64_t rotary_dims() const { return rope_dims > 0 ? rope_dims : head_dim; }
  bool is_sliding(int64_t layer) const {
    return sliding_window > 0 && (sliding_layers.empty() || sliding_layers[static_cast<size_t>(layer)]);
  }
};

// Checks ranges and divisibility (Errc::format / Errc::limit naming `source` and the field).
void validate_config(const ModelConfig& c, std::string_view source);

// The per-pair inverse frequencies [head_dim / 2] with rope_scaling applied, computed in f32 as HF and llama2.c
// do: the usual RoPE table of a family's ModelDesc.
std::vector<float> rope_inv_freq(const ModelConfig& c);
// The same for `dims` rotated dimensions of base `theta` (partial rotary, per-layer-type bases). `context` picks
// longrope's short or long set.
std::vector<float> rope_inv_freq(double theta, int64_t dims, const RopeScaling& s, int64_t context);

}  // namespace lowbit::model
