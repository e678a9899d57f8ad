#include "family/moe.h"

#include <algorithm>

#include <fmt/format.h>

#include "lowbit/core/error.h"
#include "lowbit/io/gguf.h"

namespace lowbit::model {

namespace {
constexpr int64_t kMaxExperts = 1 << 12;
}

void make_moe_layers(ModelDesc& d, const ModelConfig& c, const MoeNames& names) {
  for (size_t l = 0; l < d.layers.size(); ++l) {
    if (std::binary_search(c.dense_layers.begin(), c.dense_layers.end(), static_cast<int64_t>(l))) continue;
    LayerDesc& layer = d.layers[l];
    std::erase_if(layer.tensors, [](const TensorSpec& t) {
      return t.role == Role::gate || t.role == Role::up || t.role == Role::down;
    });
    layer.tensors.push_back({Role::router, names.router, "ffn_gate_inp.weight", Dim::n_experts, Dim::dim});
    for (int32_t e = 0; e < static_cast<int32_t>(c.n_experts); ++e) {
      layer.tensors.push_back({Role::expert_gate, names.expert_gate, "ffn_gate_exps.weight", Dim::expert_hidden,
                               Dim::dim, e});
      layer.tensors.push_back({Role::expert_up, names.expert_up, "ffn_up_exps.weight", Dim::expert_hidden, Dim::dim, e});
      layer.tensors.push_back({Role::expert_down, names.expert_down, "ffn_down_exps.weight", Dim::dim,
                               Dim::expert_hidden, e});
    }
    for (Op& op : layer.ops)
      if (op.kind == Op::Kind::mlp) op.kind = Op::Kind::moe;
    layer.moe = {.n_experts = c.n_experts, .top_k = c.n_experts_used, .renormalise = c.norm_topk_prob};
  }
}

void check_moe_config(const ModelConfig& c, std::string_view source) {
  if (c.n_experts < 1 || c.n_experts > kMaxExperts)
    fail(Errc::format, "[load_model] {}: the number of experts {} is outside [1, {}]", source, c.n_experts, kMaxExperts);
  if (c.n_experts_used < 1 || c.n_experts_used > c.n_experts)
    fail(Errc::format, "[load_model] {}: num_experts_per_tok {} is outside [1, {}] (the number of experts)", source,
         c.n_experts_used, c.n_experts);
  if (c.expert_hidden_dim < 1 || c.expert_hidden_dim > (int64_t{1} << 20))
    fail(Errc::format, "[load_model] {}: the experts' intermediate size {} is outside [1, {}]", source,
         c.expert_hidden_dim, int64_t{1} << 20);
  for (size_t i = 0; i < c.dense_layers.size(); ++i)
    if (c.dense_layers[i] < 0 || c.dense_layers[i] >= c.n_layers || (i > 0 && c.dense_layers[i] <= c.dense_layers[i - 1]))
      fail(Errc::format, "[load_model] {}: mlp_only_layers entry {} is not a distinct layer in [0, {})", source,
           c.dense_layers[i], c.n_layers);
}

void read_gguf_moe(const io::GgufFile& f, const std::string& arch, ModelConfig& c) {
  const auto count = [&](const std::string& key) {
    const auto v = f.get_uint(key);
    if (!v) fail(Errc::format, "[gguf] {}: metadata '{}' is missing", f.source(), key);
    return static_cast<int64_t>(std::min<uint64_t>(*v, uint64_t{1} << 40));
  };
  c.n_experts = count(arch + ".expert_count");
  c.n_experts_used = count(arch + ".expert_used_count");
  for (int64_t l = 0; l < c.n_layers; ++l)
    if (!f.tensor(fmt::format("blk.{}.ffn_gate_inp.weight", l))) c.dense_layers.push_back(l);
}

}  // namespace lowbit::model
