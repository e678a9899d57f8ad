// Qwen3-MoE (Qwen3-30B-A3B, 235B-A22B): qwen3's attention (q/k norms, explicit head_dim) with an MoE block of
// num_experts SwiGLU experts of moe_intermediate_size, top num_experts_per_tok by softmax, renormalised when
// norm_topk_prob; no shared expert. Layers in mlp_only_layers, or not a multiple of decoder_sparse_step
// (1-based), keep a dense MLP of intermediate_size.
#include <algorithm>

#include "lowbit/core/error.h"
#include "lowbit/io/gguf.h"
#include "family/llama.h"
#include "family/moe.h"
#include "json_fields.h"

namespace lowbit::model {

namespace {

void parse_hf(const nlohmann::json& hf, ModelConfig& c, std::string_view source) {
  require_silu(hf, source);
  c.head_dim = json_int_or(hf, "head_dim", c.head_dim, source);
  c.qkv_bias = json_bool_or(hf, "attention_bias", false, source);
  c.rope_scaling = parse_rope_scaling(hf, source);
  c.n_experts = json_int(hf, "num_experts", source);
  c.n_experts_used = json_int(hf, "num_experts_per_tok", source);
  c.expert_hidden_dim = json_int(hf, "moe_intermediate_size", source);
  c.norm_topk_prob = json_bool_or(hf, "norm_topk_prob", false, source);  // Qwen3MoeConfig's default
  const int64_t step = json_int_or(hf, "decoder_sparse_step", 1, source);
  if (step < 1) fail(Errc::format, "[load_model] {}: decoder_sparse_step {} is not positive", source, step);
  std::vector<int64_t> mlp_only;
  if (const auto it = hf.find("mlp_only_layers"); it != hf.end() && !it->is_null()) {
    if (!it->is_array()) fail(Errc::format, "[load_model] {}: mlp_only_layers is not an array", source);
    for (const auto& v : *it) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= c.n_layers)
        fail(Errc::format, "[load_model] {}: mlp_only_layers holds {}, not a layer in [0, {})", source, v.dump(),
             c.n_layers);
      mlp_only.push_back(v.get<int64_t>());
    }
  }
  for (int64_t l = 0; l < c.n_layers && l < (int64_t{1} << 20); ++l)
    if (std::find(mlp_only.begin(), mlp_only.end(), l) != mlp_only.end() || (l + 1) % step != 0)
      c.dense_layers.push_back(l);
}

void parse_gguf(const io::GgufFile& f, const std::string& arch, ModelConfig& c) {
  read_gguf_moe(f, arch, c);
  c.expert_hidden_dim = static_cast<int64_t>(
      std::min<uint64_t>(f.get_uint(arch + ".expert_feed_forward_length").value_or(0), uint64_t{1} << 40));
  // llama.cpp's qwen3moe graph always renormalises the top-k weights (Qwen3-MoE's released configs say true).
  c.norm_topk_prob = f.get_bool(arch + ".expert_weights_norm").value_or(true);
}

void write_hf(const ModelConfig& c, nlohmann::json& hf) {
  hf["hidden_act"] = "silu";
  hf["num_experts"] = c.n_experts;
  hf["num_experts_per_tok"] = c.n_experts_used;
  hf["moe_intermediate_size"] = c.expert_hidden_dim;
  hf["norm_topk_prob"] = c.norm_topk_prob;
  hf["decoder_sparse_step"] = 1;
  hf["mlp_only_layers"] = c.dense_layers;
}

ModelDesc describe(const ModelConfig& c, std::string_view source) {
  check_moe_config(c, source);
  ModelDesc d = llama_model(c, {.qkv_bias = c.qkv_bias, .qk_norm = true});
  make_moe_layers(d, c, {"mlp.gate.weight", "mlp.experts.{}.gate_proj.weight", "mlp.experts.{}.up_proj.weight",
                         "mlp.experts.{}.down_proj.weight"});
  return d;
}

constexpr std::string_view kGgufArchs[] = {"qwen3moe"};

}  // namespace

extern const Family kQwen3MoeFamily{
    .name = "qwen3_moe",
    .hf_class = "Qwen3MoeForCausalLM",
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
