// Qwen2 / Qwen2.5: Llama's layout with a bias on the q, k and v projections.
#include "lowbit/model/architecture.h"
#include "model/json_fields.h"

namespace lowbit::model {

const Architecture kQwen2Arch{"qwen2", "Qwen2ForCausalLM", [](const nlohmann::json& hf, ModelConfig& c, std::string_view source) {
  c.qkv_bias = true;
  c.rope_scaling = parse_rope_scaling(hf, source);
}};

}  // namespace lowbit::model
