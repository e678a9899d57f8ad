// A model family as data: how its config is read and written, what its tensors are called in each format, and its
// layer as a list of tensors with roles and a sequence of ops. The CPU forward pass (forward.cpp), the CUDA
// runtime (cuda_model.cpp) and the quantizer (calibration, fold, pipeline) all walk the description; none of them
// names a family or a tensor. Adding a family is one file src/model/family/<name>.cpp with its `Family` row, plus
// that row in the table (family.cpp), plus new ops if it needs them (docs/ARCHITECTURE.md, "Adding a model family").
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "lowbit/model/config.h"

namespace lowbit::io {
class GgufFile;
}

namespace lowbit::model {

// What a tensor of a layer is for. Interpreters and the quantizer find tensors by role, never by name.
enum class Role : uint8_t {
  attn_norm,
  attn_norm_bias,  // the norm before attention (gain; bias for LayerNorm)
  q,
  k,
  v,    // [q_dim, dim], [kv_dim, dim] x2
  qkv,  // fused [q | k | v] rows, [q_dim + 2 kv_dim, dim] (phi3)
  q_bias,
  k_bias,
  v_bias,  // [q_dim], [kv_dim] x2
  q_norm,
  k_norm,  // [head_dim]: a norm over each head of q and k before RoPE (qwen3, gemma3)
  o,
  o_bias,          // [dim, q_dim], [dim]
  post_attn_norm,  // [dim]: a norm of the attention output before the residual add (gemma2/3)
  ffn_norm,
  ffn_norm_bias,  // the norm before the MLP
  gate,
  up,       // [hidden, dim] x2
  gate_up,  // fused [gate | up] rows, [2 hidden, dim] (phi3)
  down,
  down_bias,      // [dim, hidden], [dim]
  up_bias,        // [hidden] (plain GELU MLPs)
  post_ffn_norm,  // [dim]: a norm of the MLP output before the residual add (gemma2/3)
  router,         // [n_experts, dim]: the MoE router's logits
  expert_gate,
  expert_up,    // [expert_hidden, dim] x2, one tensor per expert (TensorSpec::expert)
  expert_down,  // [dim, expert_hidden], one per expert
  count
};
inline constexpr size_t kRoleCount = static_cast<size_t>(Role::count);
std::string_view role_name(Role r);

// Which activation a linear reads. Linears reading the same one (q, k, v; gate, up) share a calibration Hessian,
// and the norm in front of attn_in / ffn_in folds into them. nullopt for roles that are not linears.
// Experts read only the rows routed to them: expert_in (gate, up) and expert_mid (down) are per expert, and no
// norm folds into them (the ffn norm folds into the router and every expert alike; see quant/fold.cpp).
enum class LinearInput : uint8_t { attn_in, attn_out, ffn_in, ffn_mid, expert_in, expert_mid };
std::optional<LinearInput> linear_input(Role r);

// The sizes a tensor shape is written in (resolved against a ModelConfig by dim_size).
enum class Dim : uint8_t { none, dim, q_dim, kv_dim, qkv_dim, head_dim, hidden, gate_up_dim, n_experts, expert_hidden };
int64_t dim_size(Dim d, const ModelConfig& c);

// One tensor of a layer: its role, its name in each format (relative to the layer's prefix: "model.layers.N." in
// HF, MLX and lowbit artifacts, "blk.N." in GGUF) and its shape. cols == Dim::none: a vector [rows].
// Expert tensors (expert >= 0) are one tensor per expert, as HF checkpoints store them, so that each expert is
// its own linear for the kernels, the recipe and the allocator: `hf` holds "{}" where the expert index goes
// ("mlp.experts.{}.gate_proj.weight"), and `gguf` names the merged [n_experts, rows, cols] tensor GGUF files
// store ("ffn_gate_exps.weight"), which the GGUF loader slices into the experts.
struct TensorSpec {
  Role role;
  std::string_view hf;    // e.g. "self_attn.q_proj.weight"
  std::string_view gguf;  // e.g. "attn_q.weight"
  Dim rows;
  Dim cols = Dim::none;
  int32_t expert = -1;
  bool linear() const { return cols != Dim::none; }
};

// How a norm op normalises. rms: w * x / rms(x). rms_unit_offset: (1 + w) * x / rms(x), computed in f32 as
// Gemma does (the stored gain is HF's w; GGUF files store 1 + w and their loader subtracts 1). layer: LayerNorm,
// (x - mean) / sqrt(var + eps) * w + b.
enum class NormKind : uint8_t { rms, rms_unit_offset, layer };

// The MLP's activation. swiglu: silu(gate) * up. geglu_tanh: gelu_tanh(gate) * up (Gemma). gelu_erf: gelu(up)
// with no gate (plain two-layer MLP; up_bias / down_bias optional).
enum class Activation : uint8_t { swiglu, geglu_tanh, gelu_erf };

// The two registers a layer's ops work on: the residual stream x [m, dim] and the branch h [m, dim].
enum class Reg : uint8_t { x, h };

// One step of a layer.
//   norm:      h = norm(in)               with gain `weight` (and `bias` for NormKind::layer)
//   attention: h = attention(h)           the layer's AttentionSpec; q/k/v/o (or qkv) and their biases/norms
//   mlp:       h = mlp(h)                 the layer's Activation; gate/up/down (or gate_up)
//   moe:       h = sum over the top-k experts e of weight_e * mlp_e(h), per row: the layer's MoeSpec routes
//              (router logits h @ Wrouter^T), each expert a gated MLP of the layer's Activation
//   add:       x = x + h
//   all_reduce: h = the sum of h over the ranks of a sharded model (only in shard_desc's description, after the
//              ops that end in a row-parallel linear; shard.h)
// A Llama layer is {norm x attn_norm, attention, add, norm x ffn_norm, mlp, add}; a Gemma layer adds
// {norm h post_attn_norm} before the first add and {norm h post_ffn_norm} before the second.
struct Op {
  enum class Kind : uint8_t { norm, attention, mlp, add, moe, all_reduce } kind;
  Reg in = Reg::x;            // norm only
  Role weight = Role::count;  // norm only: the gain
  Role bias = Role::count;    // norm only, NormKind::layer: the bias (Role::count: none)
};

// Attention of one layer. Scores are (q . k) * scale; with softcap > 0 they become softcap * tanh(score /
// softcap) before the causal mask; a query at position p sees keys at max(0, p - window + 1) .. p (window 0:
// every earlier key). RoPE uses the model's table `rope` (ModelDesc::rope_inv_freq) on the first rope_dims
// dimensions of each head (rope_dims == head_dim unless partial rotary). causal false: a query sees every key
// of its cache up to the last position of the pass (an encoder's bidirectional attention over a sequence that
// one pass holds whole; the window does not apply); CPU only.
struct AttentionSpec {
  float scale = 1.0f;  // typically 1 / sqrt(head_dim)
  float softcap = 0.0f;
  int64_t window = 0;
  int rope = 0;
  int64_t rope_dims = 0;
  bool causal = true;
};

// The router of an MoE layer: p = softmax(router logits) over all n_experts (f32), the top_k largest p are the
// token's experts (ties: the lower index), and their weights are those p, divided by their sum when renormalise
// (qwen3_moe's norm_topk_prob; mixtral always, which equals a softmax over the top-k logits).
struct MoeSpec {
  int64_t n_experts = 0;
  int64_t top_k = 0;
  bool renormalise = true;
};

struct LayerDesc {
  std::vector<TensorSpec> tensors;  // exactly the tensors this layer holds; loaders refuse any other
  std::vector<Op> ops;
  AttentionSpec attention;
  MoeSpec moe;  // layers with a moe op
  Activation activation = Activation::swiglu;
  NormKind norm = NormKind::rms;  // every norm op of the layer, q_norm and k_norm included

  const TensorSpec* find(Role r) const;
  bool has(Role r) const { return find(r) != nullptr; }
};

// The tensors outside the layers, named alike in every family (HF names; the GGUF names are in family.cpp).
// final_norm_bias exists only when ModelDesc::final_norm is NormKind::layer; lm_head only when not tied.
inline constexpr std::string_view kEmbedTensor = "model.embed_tokens.weight";
inline constexpr std::string_view kFinalNormTensor = "model.norm.weight";
inline constexpr std::string_view kFinalNormBiasTensor = "model.norm.bias";
inline constexpr std::string_view kLmHeadTensor = "lm_head.weight";
// Whether an HF name belongs to the text decoder ("model.*", "lm_head.*"; not model.audio_tower.* or
// model.multi_modal_projector.*) rather than another part of a checkpoint, which loaders of multi-part formats
// leave out.
bool is_decoder_tensor_name(std::string_view hf_name);

// Everything a backend needs to run a model, derived once from its config by the family.
struct ModelDesc {
  std::vector<LayerDesc> layers;
  std::vector<std::vector<float>> rope_inv_freq;  // per table, [rope_dims / 2]
  RopeStyle rope_style = RopeStyle::half;
  float embed_scale = 1.0f;  // x = embed[token] * embed_scale (Gemma: sqrt(dim) rounded as HF rounds it)
  NormKind final_norm = NormKind::rms;
  float final_softcap = 0.0f;  // logits = final_softcap * tanh(logits / final_softcap) when > 0
  float norm_eps = 1e-5f;
};

// A row of the family table.
struct Family {
  std::string_view name;                         // ModelConfig::arch and HF's model_type
  std::string_view hf_class;                     // HF "architectures" entry written on export, e.g. "LlamaForCausalLM"
  std::span<const std::string_view> hf_aliases;  // other model_type / class names read as this family
  std::span<const std::string_view> gguf_archs;  // GGUF general.architecture values
  RopeStyle gguf_rope_style;                     // how a GGUF file orders q/k rows (llama.cpp permutes llama's)
  std::string_view chat_template;                // default template family when the model carries none
  // Reads the family's fields after the common ones (read_common_hf / read_common_gguf) were read into c.
  void (*parse_hf)(const nlohmann::json& hf, ModelConfig& c, std::string_view source);
  void (*parse_gguf)(const io::GgufFile& f, const std::string& arch, ModelConfig& c);
  // Writes the family's fields into an HF config.json object (after the common ones).
  void (*write_hf)(const ModelConfig& c, nlohmann::json& hf);
  // Checks the family's own constraints (exit 3 naming the field), then describes the model.
  ModelDesc (*describe)(const ModelConfig& c, std::string_view source);
};

std::span<const Family* const> families();
// "llama, mistral, ..." for error messages.
std::string known_families();
// By model_type / class name; Errc::unsupported naming the file, the field and the families known.
const Family& find_family_hf(const nlohmann::json& hf, std::string_view source);
const Family& find_family_gguf(std::string_view arch, std::string_view source);
const Family& family_of(const ModelConfig& c);

// The family's description of `c` (its checks first: exit 3 naming `source` and the field).
ModelDesc describe_model(const ModelConfig& c, std::string_view source);

// Reads an HF config.json object: the fields every family shares, then the family's own, then checks the
// numbers (validate_config and the family's describe). Used for HF and MLX directories, lowbit artifacts and
// foreign formats alike.
ModelConfig parse_hf_config(const nlohmann::json& hf, std::string_view source);
// The same from GGUF "<arch>.*" metadata. GGUF files of families whose gguf_rope_style is interleaved store q/k
// rows in interleaved-pair order (llama.cpp's converter permutes them); the config says so in rope_style.
ModelConfig parse_gguf_config(const io::GgufFile& f);
// HF config.json for `c` (common fields, then the family's write_hf); parse_hf_config reads it back.
nlohmann::json config_to_hf_json(const ModelConfig& c);

// Reads HF's "rope_scaling" object (null or absent: none); for the families that support it.
RopeScaling parse_rope_scaling(const nlohmann::json& hf, std::string_view source);

// The full names of a layer tensor (the layer prefix joined with the spec's name).
std::string hf_tensor_name(int64_t layer, const TensorSpec& t);
std::string gguf_tensor_name(int64_t layer, const TensorSpec& t);

// The layer tensor an HF name denotes ("model.layers.3.self_attn.q_proj.weight" -> layer 3, the q spec);
// nullopt for names outside the layers or not in the description.
struct LayerTensor {
  int64_t layer;
  const TensorSpec* spec;
};
std::optional<LayerTensor> find_layer_tensor(const ModelDesc& d, std::string_view hf_name);

}  // namespace lowbit::model
