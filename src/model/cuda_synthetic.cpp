// Synthetic Llama-3-8B- and Qwen3-30B-A3B-shaped weights for GPU decode benchmarks (cuda_model.h): random stored
// arrays generated directly in each codec's layout, so that no encoder ever runs on 8B or 30B weights. Speed does not
// depend on the values; the arrays are still random (not zeros, which can run faster than real data).

#include <cstring>
#include <deque>
#include <map>

#include "lowbit/core/checked.h"
#include "lowbit/core/dtype.h"
#include "lowbit/core/error.h"
#include "lowbit/core/thread_pool.h"
#include "lowbit/model/cuda_model.h"
#include "lowbit/model/family.h"

namespace lowbit::model {

namespace {

uint64_t splitmix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

bool is_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

// Random code words for integer arrays; floats uniform in [-0.02, 0.02) (weights, scales and biases alike).
TensorBuffer random_array(const codec::ArraySpec& spec, uint64_t seed) {
  TensorBuffer b = make_buffer(spec.dtype, spec.shape);
  const size_t elem = dtype_size(spec.dtype), n = b.bytes.size() / elem;
  default_pool().parallel_for(n, size_t{1} << 16, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      const uint64_t r = splitmix(seed ^ (i * 0xD1B54A32D192ED03ull));
      if (is_float(spec.dtype)) {
        store_float(spec.dtype, b.bytes.data(), i, 0.02f * (static_cast<float>(r >> 40) * 0x1p-23f - 1.0f));
      } else {
        std::memcpy(b.bytes.data() + i * elem, &r, elem);
      }
    }
  });
  return b;
}

struct Storage {
  std::deque<codec::EncodedTensor> tensors;
  std::deque<std::vector<float>> vectors;
  std::map<std::string, codec::TensorRef, std::less<>> refs;
};

codec::TensorRef random_tensor(Storage& s, const codec::Codec& c, const codec::Params& params, const Shape& shape,
                               uint64_t seed) {
  c.validate(params, shape);
  codec::EncodedTensor& e = s.tensors.emplace_back();
  e.params = params;
  for (const codec::ArraySpec& spec : c.arrays(params, shape))
    e.arrays.emplace_back(spec.role, random_array(spec, splitmix(seed++)));
  return {&c, params, shape, e.views()};
}

// (codec id, params) of a synthetic codec name.
std::pair<std::string, codec::Params> codec_of(std::string_view name) {
  if (name == "bf16") return {"dense", {{"dtype", "bf16"}}};
  if (name == "affine4") return {"affine", {{"bits", 4}, {"group_size", 64}, {"scale_dtype", "bf16"}}};
  if (name == "trellis2" || name == "trellis3")
    return {"trellis", {{"L", 16}, {"k", name.back() - '0'}, {"code", "1mad"}, {"rotate", "none"}}};
  fail(Errc::usage, "[synthetic] codec '{}': expected bf16, affine4, trellis2 or trellis3", name);
}

ModelConfig llama3_8b(int64_t layers) {
  ModelConfig c;
  c.arch = "llama";
  c.dim = 4096;
  c.n_layers = layers > 0 ? layers : 32;
  c.n_heads = 32;
  c.n_kv_heads = 8;
  c.head_dim = 128;
  c.hidden_dim = 14336;
  c.vocab = 128256;
  c.max_seq = 8192;
  c.rope_theta = 500000.0;
  validate_config(c, "synthetic llama3-8b");
  return c;
}

// Qwen3-30B-A3B's config.json: 48 layers of 128 experts of 768, top 8 renormalised, 32 / 4 heads of 128, q/k norms.
ModelConfig qwen3_30b_a3b(int64_t layers) {
  ModelConfig c;
  c.arch = "qwen3_moe";
  c.dim = 2048;
  c.n_layers = layers > 0 ? layers : 48;
  c.n_heads = 32;
  c.n_kv_heads = 4;
  c.head_dim = 128;
  c.hidden_dim = 6144;  // intermediate_size: dense MLP layers only (this model has none)
  c.n_experts = 128;
  c.n_experts_used = 8;
  c.expert_hidden_dim = 768;
  c.norm_topk_prob = true;
  c.vocab = 151936;
  c.max_seq = 40960;
  c.rope_theta = 1000000.0;
  c.norm_eps = 1e-6f;
  validate_config(c, "synthetic qwen3-30b-a3b");
  return c;
}

}  // namespace

SyntheticModel synthetic_model(std::string_view shape, std::string_view codec_name, uint64_t seed, int64_t layers) {
  if (shape != "llama3-8b" && shape != "qwen3-30b-a3b")
    fail(Errc::usage, "[synthetic] shape '{}': expected llama3-8b or qwen3-30b-a3b", shape);
  SyntheticModel out;
  out.config = shape == "llama3-8b" ? llama3_8b(layers) : qwen3_30b_a3b(layers);
  const ModelConfig& c = out.config;
  auto s = std::make_shared<Storage>();
  const auto [id, params] = codec_of(codec_name);
  const codec::Codec& linear = codec::codec_or_throw(id, "synthetic");
  const codec::Codec& dense = codec::codec_or_throw("dense", "synthetic");
  const auto ones = [&](int64_t n) {
    return dense_f32_ref({n}, s->vectors.emplace_back(static_cast<size_t>(n), 1.0f));
  };

  s->refs[std::string(kEmbedTensor)] = random_tensor(*s, dense, {{"dtype", "bf16"}}, {c.vocab, c.dim}, seed);
  s->refs[std::string(kLmHeadTensor)] = random_tensor(*s, linear, params, {c.vocab, c.dim}, seed + 100);
  s->refs[std::string(kFinalNormTensor)] = ones(c.dim);
  // The family's layer with q/k/v and gate/up stored fused, as a checkpoint with fused projections describes it
  // (experts keep their own gate and up, which the GPU runtime stacks per expert at load).
  out.desc = describe_model(c, "synthetic");
  for (LayerDesc& d : out.desc.layers) {
    const bool dense_mlp = d.has(Role::gate);  // MoE layers have experts instead
    std::erase_if(d.tensors, [](const TensorSpec& t) {
      return t.role == Role::q || t.role == Role::k || t.role == Role::v || t.role == Role::gate || t.role == Role::up;
    });
    d.tensors.push_back({Role::qkv, "self_attn.qkv_proj.weight", "attn_qkv.weight", Dim::qkv_dim, Dim::dim});
    if (dense_mlp)
      d.tensors.push_back({Role::gate_up, "mlp.gate_up_proj.weight", "ffn_up.weight", Dim::gate_up_dim, Dim::dim});
  }
  // One layer's random tensors (each expert its own), viewed by every layer.
  std::map<std::pair<Role, int32_t>, codec::TensorRef> layer;
  uint64_t tensor_seed = seed + 200;
  for (const TensorSpec& t : out.desc.layers.front().tensors) {
    const int64_t rows = dim_size(t.rows, c);
    layer[{t.role, t.expert}] =
        t.linear() ? random_tensor(*s, linear, params, {rows, dim_size(t.cols, c)}, tensor_seed += 100) : ones(rows);
  }
  for (int64_t l = 0; l < c.n_layers; ++l)
    for (const TensorSpec& t : out.desc.layers[static_cast<size_t>(l)].tensors)
      s->refs[hf_tensor_name(l, t)] = layer.at({t.role, t.expert});
  out.lookup = [s = s.get()](const std::string& name) -> const codec::TensorRef* {
    const auto it = s->refs.find(name);
    return it == s->refs.end() ? nullptr : &it->second;
  };
  out.storage = s;
  return out;
}

}  // namespace lowbit::model
