// Mistral: Llama's layer with sliding-window attention when config.json sets sliding_window (4096 in v0.1,
// null from v0.2 on). A window at least as long as the context is every earlier key, as in transformers.
#include "lowbit/core/error.h"
#include "lowbit/io/gguf.h"
#include "family/llama.h"
#include "json_fields.h"

namespace lowbit::model {

namespace {

void parse_hf(const nlohmann::json& hf, ModelConfig& c, std::string_view source) {
  require_silu(hf, source);
  c.head_dim = json_int_or(hf, "head_dim", c.head_dim, source);
  c.sliding_window = json_int_or(hf, "sliding_window", 0, source);
  if (hf.contains("sliding_window") && !hf["sliding_window"].is_null() && c.sliding_window < 1)
    fail(Errc::format, "[load_model] {}: sliding_window {} is not positive (null: no window)", source,
         c.sliding_window);
}

void parse_gguf(const io::GgufFile& f, const std::string& arch, ModelConfig& c) {
  const std::string key = arch + ".attention.sliding_window";
  if (const auto w = f.get_uint(key)) {
    if (*w < 1 || *w > (uint64_t{1} << 40))
      fail(Errc::format, "[gguf] {}: {} = {} is not a window", f.source(), key, *w);
    c.sliding_window = static_cast<int64_t>(*w);
  }
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
