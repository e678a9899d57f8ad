// The architecture table and the config.json fields every Llama-family model shares.
#include "lowbit/model/architecture.h"

#include <array>
#include <string>

#include "lowbit/core/error.h"
#include "model/json_fields.h"

namespace lowbit::model {

namespace {
constexpr std::array<const Architecture*, 4> kArchitectures{&kLlamaArch, &kMistralArch, &kQwen2Arch, &kQwen3Arch};
}  // namespace

std::span<const Architecture* const> architectures() { return kArchitectures; }

const Architecture& find_architecture(const nlohmann::json& hf, std::string_view source) {
  const std::string model_type = json_string_or(hf, "model_type", "", source);
  for (const Architecture* a : kArchitectures)
    if (a->name == model_type) return *a;
  if (const auto it = hf.find("architectures"); it != hf.end() && it->is_array())
    for (const auto& cls : *it)
      for (const Architecture* a : kArchitectures)
        if (cls.is_string() && cls.get<std::string>() == a->hf_class) return *a;
  std::string known;
  for (const Architecture* a : kArchitectures) known += (known.empty() ? "" : ", ") + std::string(a->name);
  fail(Errc::unsupported, "[load_model] {}: model_type '{}' is not supported (known: {})", source, model_type, known);
}

RopeScaling parse_rope_scaling(const nlohmann::json& hf, std::string_view source) {
  RopeScaling s;
  const auto it = hf.find("rope_scaling");
  if (it == hf.end() || it->is_null()) return s;
  if (!it->is_object()) fail(Errc::format, "[load_model] {}: rope_scaling is not an object", source);
  std::string type = json_string_or(*it, "rope_type", "", source);
  if (type.empty()) type = json_string_or(*it, "type", "default", source);
  if (type == "default") return s;
  s.factor = json_number(*it, "factor", source);
  if (type == "linear") {
    s.kind = RopeScaling::Kind::linear;
  } else if (type == "llama3") {
    s.kind = RopeScaling::Kind::llama3;
    s.low_freq_factor = json_number(*it, "low_freq_factor", source);
    s.high_freq_factor = json_number(*it, "high_freq_factor", source);
    s.original_max_position = json_int(*it, "original_max_position_embeddings", source);
  } else {
    fail(Errc::unsupported, "[load_model] {}: rope_scaling type '{}' is not supported", source, type);
  }
  return s;
}

ModelConfig parse_hf_config(const nlohmann::json& hf, std::string_view source) {
  if (!hf.is_object()) fail(Errc::format, "[load_model] {}: config is not a JSON object", source);
  const Architecture& arch = find_architecture(hf, source);
  ModelConfig c;
  c.arch = std::string(arch.name);
  c.dim = json_int(hf, "hidden_size", source);
  c.n_layers = json_int(hf, "num_hidden_layers", source);
  c.n_heads = json_int(hf, "num_attention_heads", source);
  c.n_kv_heads = json_int_or(hf, "num_key_value_heads", c.n_heads, source);
  c.head_dim = c.n_heads > 0 ? c.dim / c.n_heads : 0;
  c.hidden_dim = json_int(hf, "intermediate_size", source);
  c.vocab = json_int(hf, "vocab_size", source);
  c.max_seq = json_int_or(hf, "max_position_embeddings", 2048, source);
  c.rope_theta = json_number_or(hf, "rope_theta", 10000.0, source);
  c.norm_eps = static_cast<float>(json_number_or(hf, "rms_norm_eps", 1e-6, source));
  c.tied_embeddings = json_bool_or(hf, "tie_word_embeddings", false, source);
  c.rope_style = RopeStyle::half;
  if (const auto it = hf.find("hidden_act"); it != hf.end() && *it != "silu")
    fail(Errc::unsupported, "[load_model] {}: hidden_act {} is not supported (silu only)", source, it->dump());
  if (const auto it = hf.find("bos_token_id"); it != hf.end() && it->is_number_integer())
    c.bos_id = it->get<int32_t>();
  c.eos_ids = json_ids(hf, "eos_token_id", source);
  arch.parse_hf(hf, c, source);
  validate_config(c, source);
  return c;
}

}  // namespace lowbit::model
