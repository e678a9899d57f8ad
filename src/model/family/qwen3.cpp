// Qwen3 (dense): Llama's layer with an RMSNorm over each head of q and k, applied before RoPE; an explicit
// head_dim (not dim / n_heads); no q/k/v bias unless attention_bias says so.
#include "family/llama.h"
#include "json_fields.h"

namespace lowbit::model {

namespace {

void parse_hf(const nlohmann::json& hf, ModelConfig& c, std::string_view source) {
  require_silu(hf, source);
  c.head_dim = json_int_or(hf, "head_dim", c.head_dim, source);
  c.qkv_bias = json_bool_or(hf, "attention_bias", false, source);
  c.rope_scaling = parse_rope_scaling(hf, source);
}

void parse_gguf(const io::GgufFile&, const std::string&, ModelConfig&) {}

void write_hf(const ModelConfig&, nlohmann::json& hf) { hf["hidden_act"] = "silu"; }

ModelDesc describe(const ModelConfig& c, std::string_view) {
  return llama_model(c, {.qkv_bias = c.qkv_bias, .qk_norm = true});
}

constexpr std::string_view kGgufArchs[] = {"qwen3"};

}  // namespace

extern const Family kQwen3Family{
    .name = "qwen3",
    .hf_class = "Qwen3ForCausalLM",
    .hf_aliases = {},
    .gguf_archs = kGgufArchs,
    .gguf_rope_style = RopeStyle::half,
    .chat_template = "chatml",
    .parse_hf = parse_hf,
    .parse_gguf = parse_gguf,
    .write_hf = write_hf,
    .describe = describe,
};

}  // namespace lowbit::model
