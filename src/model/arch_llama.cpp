// Llama (1, 2, 3.x) and the many models that reuse its layout (SmolLM, TinyLlama): the common fields plus
// RoPE scaling, and optional attention bias.
#include "lowbit/model/architecture.h"
#include "model/json_fields.h"

namespace lowbit::model {

const Architecture kLlamaArch{"llama", "LlamaForCausalLM", [](const nlohmann::json& hf, ModelConfig& c, std::string_view source) {
  c.rope_scaling = parse_rope_scaling(hf, source);
  c.qkv_bias = json_bool_or(hf, "attention_bias", false, source);
  c.head_dim = json_int_or(hf, "head_dim", c.head_dim, source);
}};

}  // namespace lowbit::model
