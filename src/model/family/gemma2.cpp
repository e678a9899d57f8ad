// Gemma 2 (HF Gemma2ForCausalLM; GGUF "gemma2"): the Gemma layer (gemma.h) without q/k norms, sliding-window and
// full-attention layers alternating (window first), one RoPE table, and tanh soft-caps on the attention scores
// (attn_logit_softcapping) and on the logits (final_logit_softcapping).
#include "lowbit/core/error.h"
#include "lowbit/io/gguf.h"
#include "family/gemma.h"
#include "json_fields.h"

namespace lowbit::model {

namespace {

constexpr int64_t kSlidingPattern = 2;  // layer l is full when (l + 1) % 2 == 0 (HF's layer_types default)
// The defaults of HF's Gemma2Config and llama.cpp's hparams: an absent key means these, a null one none.
constexpr double kAttnSoftcap = 50.0, kFinalSoftcap = 30.0;
constexpr int64_t kWindow = 4096;

float softcap(const nlohmann::json& hf, std::string_view key, double absent, std::string_view source) {
  const auto it = hf.find(key);
  if (it == hf.end()) return static_cast<float>(absent);
  return static_cast<float>(json_number_or(hf, key, 0.0, source));
}

void parse_hf(const nlohmann::json& hf, ModelConfig& c, std::string_view source) {
  c.rope_scaling = parse_rope_scaling(hf, source);
  gemma::parse_hf(hf, c, source, kSlidingPattern);
  c.attn_softcap = softcap(hf, "attn_logit_softcapping", kAttnSoftcap, source);
  c.final_softcap = softcap(hf, "final_logit_softcapping", kFinalSoftcap, source);
}

// llama.cpp's src/models/gemma2.cpp: the keys are optional and default as in HF.
void parse_gguf(const io::GgufFile& f, const std::string& arch, ModelConfig& c) {
  gemma::parse_gguf(f, arch, c, kSlidingPattern, kWindow);
  c.attn_softcap = static_cast<float>(f.get_float(arch + ".attn_logit_softcapping").value_or(kAttnSoftcap));
  c.final_softcap = static_cast<float>(f.get_float(arch + ".final_logit_softcapping").value_or(kFinalSoftcap));
  if (const auto local = f.get_float(arch + ".rope.freq_base_swa"); local && *local != c.rope_theta)
    fail(Errc::unsupported, "[gguf] {}: {}.rope.freq_base_swa {} differs from rope.freq_base {}", f.source(), arch,
         *local, c.rope_theta);
}

void write_hf(const ModelConfig& c, nlohmann::json& hf) { gemma::write_hf(c, hf); }

ModelDesc describe(const ModelConfig& c, std::string_view) { return gemma::describe(c, false, 0); }

constexpr std::string_view kGgufArchs[] = {"gemma2"};

}  // namespace

extern const Family kGemma2Family{
    .name = "gemma2",
    .hf_class = "Gemma2ForCausalLM",
    .hf_aliases = {},
    .gguf_archs = kGgufArchs,
    .gguf_rope_style = RopeStyle::half,  // llama.cpp runs gemma2 with NEOX (half) RoPE: rows as in HF
    .chat_template = "gemma",
    .parse_hf = parse_hf,
    .parse_gguf = parse_gguf,
    .write_hf = write_hf,
    .describe = describe,
};

}  // namespace lowbit::model
