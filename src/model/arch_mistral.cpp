// Mistral: Llama's layout. Its sliding window (4096 in v0.1, none later) only matters beyond that many
// positions; lowbit attends to the full context, which is exact for sequences up to the window.
#include "lowbit/model/architecture.h"
#include "model/json_fields.h"

namespace lowbit::model {

const Architecture kMistralArch{"mistral", "MistralForCausalLM", [](const nlohmann::json& hf, ModelConfig& c, std::string_view source) {
  c.head_dim = json_int_or(hf, "head_dim", c.head_dim, source);
}};

}  // namespace lowbit::model
