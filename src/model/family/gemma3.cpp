// Gemma 3 (text; HF Gemma3ForCausalLM, model_type gemma3_text; GGUF "gemma3", e.g. Gemma-3-270M): Gemma 2's layer
// with an RMSNorm over each head of q and k before RoPE, five sliding-window layers to one full-attention layer,
// and two RoPE tables: rope_theta (with rope_scaling) on the full layers, rope_local_base_freq on the window.
// Gemma 3 drops Gemma 2's attention soft-cap: HF's Gemma3Attention never passes attn_logit_softcapping to the
// attention (modeling_gemma3.py) and llama.cpp's graph has none, so a config's value is ignored here as there.
#include "lowbit/core/error.h"
#include "lowbit/io/gguf.h"
#include "family/gemma.h"
#include "json_fields.h"

namespace lowbit::model {

namespace {

constexpr int64_t kSlidingPattern = 6;  // HF's and llama.cpp's default: layer l is full when (l + 1) % 6 == 0
constexpr int kLocalRope = 1;           // the sliding layers' RoPE table

// transformers >= 5 writes the RoPE of each layer type into rope_parameters; older configs have rope_theta,
// rope_local_base_freq and rope_scaling (for the full layers).
void parse_rope(const nlohmann::json& hf, ModelConfig& c, std::string_view source) {
  const auto params = hf.find("rope_parameters");
  if (params == hf.end() || params->is_null() || !params->contains("full_attention")) {
    c.rope_theta = json_number_or(hf, "rope_theta", 1e6, source);
    c.rope_local_theta = json_number_or(hf, "rope_local_base_freq", 1e4, source);
    c.rope_scaling = parse_rope_scaling(hf, source);
    return;
  }
  const nlohmann::json& full = (*params)["full_attention"];
  const nlohmann::json& local =
      params->contains("sliding_attention") ? (*params)["sliding_attention"] : nlohmann::json();
  if (!full.is_object() || !(local.is_object() || local.is_null()))
    fail(Errc::format, "[load_model] {}: rope_parameters.full_attention / sliding_attention are not objects", source);
  c.rope_theta = json_number_or(full, "rope_theta", 1e6, source);
  c.rope_scaling = parse_rope_scaling(nlohmann::json{{"rope_scaling", full}}, source);
  c.rope_local_theta = local.is_null() ? 1e4 : json_number_or(local, "rope_theta", 1e4, source);
  if (!local.is_null() &&
      parse_rope_scaling(nlohmann::json{{"rope_scaling", local}}, source).kind != RopeScaling::Kind::none)
    fail(Errc::unsupported,
         "[load_model] {}: rope_parameters.sliding_attention: RoPE scaling on the sliding layers is "
         "not supported",
         source);
}

void parse_hf(const nlohmann::json& hf, ModelConfig& c, std::string_view source) {
  parse_rope(hf, c, source);
  // Configs on the Hub still carry the period as sliding_window_pattern (HF's __post_init__ reads it).
  const int64_t pattern = json_int_or(hf, "sliding_window_pattern", kSlidingPattern, source);
  gemma::parse_hf(hf, c, source, pattern);
  c.final_softcap = static_cast<float>(json_number_or(hf, "final_logit_softcapping", 0.0, source));
  c.attn_softcap = 0.0f;
}

// llama.cpp's src/models/gemma3.cpp: no window key means no sliding layers at all; the local base defaults to
// 10000 (llama-hparams.h rope_freq_base_train_swa); a final soft-cap only when the file has one.
void parse_gguf(const io::GgufFile& f, const std::string& arch, ModelConfig& c) {
  gemma::parse_gguf(f, arch, c, kSlidingPattern, 0);
  c.rope_local_theta = f.get_float(arch + ".rope.freq_base_swa").value_or(1e4);
  c.final_softcap = static_cast<float>(f.get_float(arch + ".final_logit_softcapping").value_or(0.0));
  c.attn_softcap = 0.0f;
}

void write_hf(const ModelConfig& c, nlohmann::json& hf) {
  gemma::write_hf(c, hf);
  hf["model_type"] = "gemma3_text";  // HF's "gemma3" is the multimodal wrapper
  hf["rope_local_base_freq"] = c.rope_local_theta > 0 ? c.rope_local_theta : c.rope_theta;
  hf["attn_logit_softcapping"] = nullptr;
}

ModelDesc describe(const ModelConfig& c, std::string_view) { return gemma::describe(c, true, kLocalRope); }

constexpr std::string_view kAliases[] = {"gemma3_text"};
constexpr std::string_view kGgufArchs[] = {"gemma3"};

}  // namespace

extern const Family kGemma3Family{
    .name = "gemma3",
    .hf_class = "Gemma3ForCausalLM",
    .hf_aliases = kAliases,
    .gguf_archs = kGgufArchs,
    .gguf_rope_style = RopeStyle::half,  // llama.cpp runs gemma3 with NEOX (half) RoPE: rows as in HF
    .chat_template = "gemma",
    .parse_hf = parse_hf,
    .parse_gguf = parse_gguf,
    .write_hf = write_hf,
    .describe = describe,
};

}  // namespace lowbit::model
