// Qwen2 / Qwen2.5: Llama's layer with a bias on the q, k and v projections. Their sliding_window applies only
// with use_sliding_window, which the released models leave off; it is not read.
#include "family/llama.h"

namespace lowbit::model {

namespace {

void parse_hf(const nlohmann::json& hf, ModelConfig& c, std::string_view source) {
  require_silu(hf, source);
  c.qkv_bias = true;
  c.rope_scaling = parse_rope_scaling(hf, source);
}

void parse_gguf(const io::GgufFile&, const std::string&, ModelConfig& c) { c.qkv_bias = true; }

void write_hf(const ModelConfig&, nlohmann::json& hf) { hf["hidden_act"] = "silu"; }

ModelDesc describe(const ModelConfig& c, std::string_view) { return llama_model(c, {.qkv_bias = true}); }

constexpr std::string_view kGgufArchs[] = {"qwen2"};

}  // namespace

extern const Family kQwen2Family{
    .name = "qwen2",
    .hf_class = "Qwen2ForCausalLM",
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
