// ModelBuilder: checks every weight against the config and prepares the CPU kernels.
#include "lowbit/model/model.h"

#include <fmt/format.h>

#include "lowbit/core/checked.h"
#include "lowbit/core/error.h"

namespace lowbit::model {

namespace {

std::string layer_name(int64_t layer, std::string_view suffix) {
  return fmt::format("model.layers.{}.{}", layer, suffix);
}

class Preparer {
 public:
  Preparer(Model& m, std::string_view source) : model_(m), source_(source) {}

  const NamedTensor& get(const std::string& name, const Shape& shape) const {
    const NamedTensor* t = model_.find(name);
    if (!t) fail(Errc::format, "[load_model] {}: tensor '{}' is missing", source_, name);
    if (t->ref.shape != shape)
      fail(Errc::shape, "[load_model] {}: tensor '{}' has shape {}, expected {}", source_, name,
           shape_str(t->ref.shape), shape_str(shape));
    return *t;
  }
  std::unique_ptr<kernels::CpuLinear> linear(const std::string& name, int64_t rows, int64_t cols) const {
    return kernels::prepare_cpu(get(name, {rows, cols}).ref);
  }
  std::vector<float> vec(const std::string& name, int64_t n) const { return codec::decode_all(get(name, {n}).ref); }
  std::vector<float> optional_vec(const std::string& name, int64_t n, bool wanted) const {
    if (!wanted) {
      if (model_.find(name)) fail(Errc::format, "[load_model] {}: unexpected tensor '{}'", source_, name);
      return {};
    }
    return vec(name, n);
  }

 private:
  Model& model_;
  std::string_view source_;
};

void prepare_layer(const Preparer& p, const ModelConfig& c, int64_t l, LayerWeights& w) {
  const auto name = [&](std::string_view suffix) { return layer_name(l, suffix); };
  w.attn_norm = p.vec(name("input_layernorm.weight"), c.dim);
  w.ffn_norm = p.vec(name("post_attention_layernorm.weight"), c.dim);
  w.wq = p.linear(name("self_attn.q_proj.weight"), c.q_dim(), c.dim);
  w.wk = p.linear(name("self_attn.k_proj.weight"), c.kv_dim(), c.dim);
  w.wv = p.linear(name("self_attn.v_proj.weight"), c.kv_dim(), c.dim);
  w.wo = p.linear(name("self_attn.o_proj.weight"), c.dim, c.q_dim());
  w.q_bias = p.optional_vec(name("self_attn.q_proj.bias"), c.q_dim(), c.qkv_bias);
  w.k_bias = p.optional_vec(name("self_attn.k_proj.bias"), c.kv_dim(), c.qkv_bias);
  w.v_bias = p.optional_vec(name("self_attn.v_proj.bias"), c.kv_dim(), c.qkv_bias);
  w.q_norm = p.optional_vec(name("self_attn.q_norm.weight"), c.head_dim, c.qk_norm);
  w.k_norm = p.optional_vec(name("self_attn.k_norm.weight"), c.head_dim, c.qk_norm);
  w.gate = p.linear(name("mlp.gate_proj.weight"), c.hidden_dim, c.dim);
  w.up = p.linear(name("mlp.up_proj.weight"), c.hidden_dim, c.dim);
  w.down = p.linear(name("mlp.down_proj.weight"), c.dim, c.hidden_dim);
}

}  // namespace

const NamedTensor* Model::find(std::string_view name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

codec::TensorRef dense_f32_ref(Shape shape, std::span<const float> values) {
  codec::TensorRef ref;
  ref.codec = &codec::codec_or_throw("dense", "dense_f32_ref");
  ref.params = {{"dtype", "f32"}};
  ref.arrays.items.emplace_back(
      "data", TensorView{DType::F32, shape, std::as_bytes(values)});
  ref.shape = std::move(shape);
  return ref;
}

void ModelBuilder::add_f32(std::string name, Shape shape, std::vector<float> values) {
  if (checked_numel(shape, name) != values.size())
    fail(Errc::internal, "[load_model] {}: {} values for shape {}", name, values.size(), shape_str(shape));
  const std::vector<float>& stored = owned_->emplace_back(std::move(values));
  add(std::move(name), dense_f32_ref(std::move(shape), stored));
}

void ModelBuilder::add(std::string name, codec::TensorRef ref) {
  if (contains(name)) fail(Errc::duplicate, "[load_model] tensor '{}' appears twice", name);
  model_->tensors.push_back({std::move(name), std::move(ref)});
}

void ModelBuilder::keep_alive(std::shared_ptr<const void> owner) { model_->keep_alive.push_back(std::move(owner)); }

bool ModelBuilder::contains(std::string_view name) const { return model_->find(name) != nullptr; }

std::unique_ptr<Model> ModelBuilder::finish(const ModelConfig& config, std::string_view source) {
  validate_config(config, source);
  Model& m = *model_;
  m.config = config;
  m.keep_alive.push_back(owned_);
  for (const auto& t : m.tensors) codec::validate_tensor(t.ref, fmt::format("{}: {}", source, t.name));
  const Preparer p(m, source);
  const auto& c = config;
  m.embed = p.linear("model.embed_tokens.weight", c.vocab, c.dim);
  m.lm_head = c.tied_embeddings ? kernels::prepare_cpu(m.find("model.embed_tokens.weight")->ref)
                                : p.linear("lm_head.weight", c.vocab, c.dim);
  if (c.tied_embeddings && m.find("lm_head.weight"))
    fail(Errc::format, "[load_model] {}: tied embeddings but an lm_head.weight tensor is present", source);
  m.final_norm = p.vec("model.norm.weight", c.dim);
  m.layers.resize(static_cast<size_t>(c.n_layers));
  for (int64_t l = 0; l < c.n_layers; ++l) prepare_layer(p, c, l, m.layers[l]);
  m.rope_inv_freq = rope_inv_freq(c);
  return std::move(model_);
}

std::vector<float> permute_rope_rows(std::span<const float> w, int64_t n_heads, int64_t head_dim, int64_t cols,
                                     RopeStyle from, RopeStyle to) {
  if (static_cast<uint64_t>(n_heads * head_dim * cols) != w.size() || head_dim % 2 != 0)
    fail(Errc::shape, "[permute_rope_rows] {} values do not form {} heads of {} rows of {}", w.size(), n_heads,
         head_dim, cols);
  if (from == to) return {w.begin(), w.end()};
  std::vector<float> out(w.size());
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < n_heads; ++h)
    for (int64_t i = 0; i < half; ++i)
      for (int64_t j = 0; j < 2; ++j) {
        const int64_t interleaved = h * head_dim + 2 * i + j;
        const int64_t halves = h * head_dim + j * half + i;
        const int64_t src = from == RopeStyle::interleaved ? interleaved : halves;
        const int64_t dst = from == RopeStyle::interleaved ? halves : interleaved;
        std::copy_n(w.begin() + src * cols, cols, out.begin() + dst * cols);
      }
  return out;
}

KvCache::KvCache(const ModelConfig& config, int64_t capacity) : capacity_(capacity), kv_dim_(config.kv_dim()) {
  if (capacity < 1 || capacity > config.max_seq)
    fail(Errc::limit, "[kv_cache] capacity {} outside [1, {}]", capacity, config.max_seq);
  const uint64_t n = checked_mul(checked_mul(static_cast<uint64_t>(config.n_layers), static_cast<uint64_t>(capacity), "kv cache"),
                                 static_cast<uint64_t>(kv_dim_), "kv cache");
  keys_.resize(n);
  values_.resize(n);
}

}  // namespace lowbit::model
