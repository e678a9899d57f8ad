// Mixtral (8x7B, 8x22B): Mistral's attention with every MLP an MoE block of num_local_experts SwiGLU experts of
// intermediate_size (w1 gate, w3 up, w2 down), top num_experts_per_tok (2) by softmax, always renormalised.
// llama.cpp's converter writes Mixtral as GGUF architecture "llama" with expert_count set; the llama family
// hands such files to this one (llama.cpp: parse_gguf).
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
  c.rope_scaling = parse_rope_scaling(hf, source);
  c.sliding_window = json_int_or(hf, "sliding_window", 0, source);
  c.n_experts = json_int(hf, "num_local_experts", source);
  c.n_experts_used = json_int(hf, "num_experts_per_tok", source);
  c.expert_hidden_dim = c.hidden_dim;
  c.norm_topk_prob = true;
}

void write_hf(const ModelConfig& c, nlohmann::json& hf) {
  hf["hidden_act"] = "silu";
  hf["sliding_window"] = c.sliding_window > 0 ? nlohmann::json(c.sliding_window) : nlohmann::json();
  hf["num_local_experts"] = c.n_experts;
  hf["num_experts_per_tok"] = c.n_experts_used;
}

ModelDesc describe(const ModelConfig& c, std::string_view source) {
  check_moe_config(c, source);
  if (!c.dense_layers.empty() || c.expert_hidden_dim != c.hidden_dim || !c.norm_topk_prob)
    fail(Errc::format, "[load_model] {}: a mixtral model has only MoE layers of intermediate_size experts, "
         "renormalised", source);
  ModelDesc d = llama_model(c, {.window = c.sliding_window});
  make_moe_layers(d, c, {"block_sparse_moe.gate.weight", "block_sparse_moe.experts.{}.w1.weight",
                         "block_sparse_moe.experts.{}.w3.weight", "block_sparse_moe.experts.{}.w2.weight"});
  return d;
}

constexpr std::string_view kGgufArchs[] = {"mixtral"};

}  // namespace

void parse_mixtral_gguf(const io::GgufFile& f, const std::string& arch, ModelConfig& c) {
  read_gguf_moe(f, arch, c);
  c.expert_hidden_dim = c.hidden_dim;
  c.norm_topk_prob = true;
  if (const auto w = f.get_uint(arch + ".attention.sliding_window"))
    c.sliding_window = static_cast<int64_t>(std::min<uint64_t>(*w, uint64_t{1} << 40));
}

extern const Family kMixtralFamily{
    .name = "mixtral",
    .hf_class = "MixtralForCausalLM",
    .hf_aliases = {},
    .gguf_archs = kGgufArchs,
    .gguf_rope_style = RopeStyle::interleaved,
    .chat_template = "",
    .parse_hf = parse_hf,
    .parse_gguf = parse_mixtral_gguf,
    .write_hf = write_hf,
    .describe = describe,
};

}  // namespace lowbit::model
