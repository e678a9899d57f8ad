// Qwen3 (dense): an explicit head_dim (not dim / n_heads) and an RMSNorm over each head of q and k, applied
// before RoPE; no q/k/v bias unless attention_bias says so.
#include "lowbit/model/architecture.h"
#include "model/json_fields.h"

namespace lowbit::model {

const Architecture kQwen3Arch{"qwen3", "Qwen3ForCausalLM", [](const nlohmann::json& hf, ModelConfig& c, std::string_view source) {
  c.qk_norm = true;
  c.head_dim = json_int_or(hf, "head_dim", c.head_dim, source);
  c.qkv_bias = json_bool_or(hf, "attention_bias", false, source);
  c.rope_scaling = parse_rope_scaling(hf, source);
}};

}  // namespace lowbit::model
