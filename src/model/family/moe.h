// What the Mixture-of-Experts families (qwen3_moe, mixtral) share: the MoE block that replaces a Llama layer's
// MLP, its config checks and GGUF metadata.
#pragma once

#include <string>
#include <string_view>

#include "lowbit/model/family.h"

namespace lowbit::io {
class GgufFile;
}

namespace lowbit::model {

// The HF names of an MoE block's tensors, each expert's with "{}" for the expert index.
struct MoeNames {
  std::string_view router, expert_gate, expert_up, expert_down;
};

// Replaces the MLP of every layer of `d` not in c.dense_layers by an MoE block: the router and n_experts
// gate/up/down experts as tensors, the moe op in place of the mlp op, routing as c says.
void make_moe_layers(ModelDesc& d, const ModelConfig& c, const MoeNames& names);

// Checks the MoE numbers of c (exit 3 naming `source` and the field).
void check_moe_config(const ModelConfig& c, std::string_view source);

// Reads <arch>.expert_count and <arch>.expert_used_count; a layer without blk.N.ffn_gate_inp.weight is dense.
void read_gguf_moe(const io::GgufFile& f, const std::string& arch, ModelConfig& c);

// The mixtral family's GGUF reader (mixtral.cpp), which the llama family's calls for files with an expert_count.
void parse_mixtral_gguf(const io::GgufFile& f, const std::string& arch, ModelConfig& c);

}  // namespace lowbit::model
