// Mistral: Llama's layer with sliding-window attention when config.json sets sliding_window (4096 in v0.1,
// null from v0.2 on).
#include <algorithm>

#include "lowbit/io/gguf.h"
#include "model/family/llama.h"
#include "model/json_fields.h"

namespace lowbit::model {

namespace {

void parse_hf(const nlohmann::json& hf, ModelConfig& c, std::string_view source) {
  require_silu(hf, source);
  c.head_dim = json_int_or(hf, "head_dim", c.head_dim, source);
  c.sliding_window = json_int_or(hf, "sliding_window", 0, source);
}

void parse_gguf(const io::GgufFile& f, const std::string& arch, ModelConfig& c) {
  if (const auto w = f.get_uint(arch + ".attention.sliding_window"))
    c.sliding_window = static_cast<int64_t>(std::min<uint64_t>(*w, uint64_t{1} << 40));
}

void write_hf(const ModelConfig& c, nlohmann::json& hf) {
  hf["hidden_act"] = "silu";
  hf["sliding_window"] = c.sliding_window > 0 ? nlohmann::json(c.sliding_window) : nlohmann::json();
}

ModelDesc describe(const ModelConfig& c, std::string_view) { return llama_model(c, {.window = c.sliding_window}); }

constexpr std::string_view kGgufArchs[] = {"mistral"};

}  // namespace

extern const Family kMistralFamily{
    .name = "mistral",
    .hf_class = "MistralForCausalLM",
    .hf_aliases = {},
    .gguf_archs = kGgufArchs,
    .gguf_rope_style = RopeStyle::interleaved,
    .chat_template = "",
    .parse_hf = parse_hf,
    .parse_gguf = parse_gguf,
    .write_hf = write_hf,
    .describe = describe,
};

}  // namespace lowbit::model
