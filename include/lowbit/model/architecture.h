// The architecture table: one row per supported HF model family, mapping config.json's model_type (and
// "architectures") to a config parser. Everything architecture-specific the forward pass needs is a flag in
// ModelConfig (qkv_bias, qk_norm, rope scaling), so adding an architecture is one file src/model/arch_<name>.cpp
// defining its row plus that row's line in src/model/architecture.cpp.
#pragma once

#include <span>
#include <string_view>

#include <nlohmann/json.hpp>

#include "lowbit/model/config.h"

namespace lowbit::model {

struct Architecture {
  std::string_view name;        // ModelConfig::arch, and HF's model_type
  std::string_view hf_class;    // HF "architectures" entry, e.g. "LlamaForCausalLM"
  // Reads the family's own fields after the common Llama fields were read into `c`.
  void (*parse_hf)(const nlohmann::json& hf, ModelConfig& c, std::string_view source);
};

extern const Architecture kLlamaArch;
extern const Architecture kMistralArch;
extern const Architecture kQwen2Arch;
extern const Architecture kQwen3Arch;

std::span<const Architecture* const> architectures();

// By model_type, else by an "architectures" class name; Errc::unsupported listing the known ones.
const Architecture& find_architecture(const nlohmann::json& hf, std::string_view source);

// Parses an HF config.json object (common Llama fields, then the architecture's row).
ModelConfig parse_hf_config(const nlohmann::json& hf, std::string_view source);

// Reads the "rope_scaling" object (null or absent: none). Shared by the rows that support it.
RopeScaling parse_rope_scaling(const nlohmann::json& hf, std::string_view source);

}  // namespace lowbit::model
