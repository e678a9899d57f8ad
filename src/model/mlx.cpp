#include "lowbit/model/mlx.h"

#include <limits>
#include <map>
#include <set>

#include "lowbit/core/checked.h"
#include "lowbit/core/error.h"
#include "lowbit/io/json.h"
#include "lowbit/io/safetensors.h"
#include "lowbit/model/family.h"
#include "lowbit/model/hf.h"

namespace lowbit::model {

namespace {

constexpr uint64_t kMaxConfigBytes = 16 << 20;

// The module's quantization: its override when the block has one, else the block's defaults.
std::pair<int64_t, int64_t> bits_and_group(const nlohmann::json& q, const std::string& module, std::string_view source) {
  const nlohmann::json* spec = &q;
  if (const auto it = q.find(module); it != q.end()) {
    if (!it->is_object())
      fail(Errc::format, "[load_mlx] {}: quantization override for '{}' is not an object", source, module);
    spec = &*it;
  }
  const auto get = [&](const char* key) {
    const auto it = spec->find(key);
    const auto fallback = q.find(key);
    const auto& v = it != spec->end() ? *it : (fallback != q.end() ? *fallback : nlohmann::json());
    if (!v.is_number_integer()) fail(Errc::format, "[load_mlx] {}: quantization '{}' missing for '{}'", source, key, module);
    return v.get<int64_t>();
  };
  const std::string mode = spec->value("mode", q.value("mode", std::string("affine")));
  if (mode != "affine")
    fail(Errc::unsupported, "[load_mlx] {}: quantization mode '{}' of '{}' is not supported (affine only)", source,
         mode, module);
  return {get("bits"), get("group_size")};
}

// mlx-lm stores an MoE layer's experts stacked, [n_experts, rows, cols], as one SwitchGLU module
// "<block>.switch_mlp.{gate,up,down}_proj" beside the router "<block>.gate" (qwen3_moe "mlp.", mixtral
// "block_sparse_moe."). Maps each such module to its experts' HF names, in expert order, by the description.
std::map<std::string, std::vector<std::string>> stacked_experts(const ModelDesc& d) {
  std::map<std::string, std::vector<std::string>> out;
  for (size_t l = 0; l < d.layers.size(); ++l) {
    const LayerDesc& layer = d.layers[l];
    const TensorSpec* router = layer.find(Role::router);
    if (!router) continue;
    const std::string_view block = router->hf.substr(0, router->hf.find("gate.weight"));
    for (const TensorSpec& t : layer.tensors) {
      if (t.expert < 0) continue;
      const char* proj = t.role == Role::expert_gate ? "gate_proj" : t.role == Role::expert_up ? "up_proj" : "down_proj";
      out[fmt::format("model.layers.{}.{}switch_mlp.{}", l, block, proj)].push_back(
          hf_tensor_name(static_cast<int64_t>(l), t));
    }
  }
  return out;
}

// Expert `e`'s [rows, cols] of a stacked [experts, rows, cols] view (each expert's rows are contiguous).
TensorView expert_slice(const TensorView& v, size_t e, size_t experts, std::string_view name, std::string_view source) {
  if (v.shape.size() != 3 || v.shape[0] != static_cast<int64_t>(experts))
    fail(Errc::shape, "[load_mlx] {}: '{}' has shape {}, expected [{}, rows, cols]", source, name, shape_str(v.shape),
         experts);
  const size_t bytes = v.bytes.size() / experts;
  return {v.dtype, {v.shape[1], v.shape[2]}, v.bytes.subspan(e * bytes, bytes)};
}

}  // namespace

bool is_mlx_quantized(const nlohmann::json& config) {
  return config.is_object() && config.contains("quantization") && config["quantization"].is_object();
}

std::unique_ptr<Model> load_mlx(const std::filesystem::path& dir, const LoadOptions& options) {
  const auto config_path = dir / "config.json";
  const std::string source = config_path.string();
  const nlohmann::json config = io::read_json_file(config_path, "load_mlx", kMaxConfigBytes);
  ModelConfig c = parse_hf_config(config, source);
  if (options.max_seq) c.max_seq = std::min(c.max_seq, *options.max_seq);
  // load_model() comes here only for a config with a "quantization" object, but the function is public.
  const auto quantization = config.find("quantization");
  if (quantization == config.end() || !quantization->is_object())
    fail(Errc::format, "[load_mlx] {}: 'quantization' is missing or not an object", source);
  const nlohmann::json& q = *quantization;

  auto ckpt = std::make_shared<io::SafetensorsCheckpoint>(io::SafetensorsCheckpoint::open(dir));
  ModelBuilder b;
  b.keep_alive(ckpt, ckpt->files());
  const codec::Codec& affine = codec::codec_or_throw("affine", "load_mlx");
  std::set<std::string> consumed;
  const auto stacked = stacked_experts(describe_model(c, source));
  // The affine tensor `target` of codes, scales and biases of one module (or one expert of a stacked module).
  const auto add_affine = [&](const std::string& module, const std::string& target, const TensorView& codes,
                              const TensorView& scales, const TensorView& biases) {
    const auto [bits, group] = bits_and_group(q, module, source);
    if (codes.dtype != DType::U32 || codes.shape.size() != 2)
      fail(Errc::dtype, "[load_mlx] {}: '{}.weight' must be a U32 matrix", source, module);
    if (bits < 1 || bits > 8) fail(Errc::codec_params, "[load_mlx] {}: '{}' has {} bits", source, module, bits);
    codec::TensorRef ref;
    ref.codec = &affine;
    // 32 / bits codes per U32 word; the column count must still fit the signed shape it goes into.
    const std::string what = fmt::format("[load_mlx] {}: '{}.weight' columns", source, module);
    const uint64_t cols = checked_mul(static_cast<uint64_t>(codes.shape[1]), 32, what) / static_cast<uint64_t>(bits);
    if (cols > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail(Errc::overflow, "{}: {} do not fit 63 bits", what, cols);
    ref.shape = {codes.shape[0], static_cast<int64_t>(cols)};
    ref.params = {{"bits", bits}, {"group_size", group}, {"scale_dtype", float_dtype_param(scales.dtype, target, source)}};
    ref.arrays.items = {{"codes", codes}, {"scales", scales}, {"biases", biases}};
    codec::validate_tensor(ref, fmt::format("[load_mlx] {}: '{}'", source, target));
    b.add(target, std::move(ref));
  };
  for (const std::string& name : ckpt->names()) {
    if (!name.ends_with(".scales")) continue;
    const std::string module = name.substr(0, name.size() - 7);
    for (const char* part : {".weight", ".biases"})
      if (!ckpt->contains(module + part))
        fail(Errc::format, "[load_mlx] {}: '{}' has scales but no '{}{}'", source, module, module, part);
    const TensorView codes = ckpt->tensor(module + ".weight");
    const TensorView scales = ckpt->tensor(name);
    const TensorView biases = ckpt->tensor(module + ".biases");
    if (const auto it = stacked.find(module); it != stacked.end()) {
      const size_t n = it->second.size();
      for (size_t e = 0; e < n; ++e)
        add_affine(module, it->second[e], expert_slice(codes, e, n, module + ".weight", source),
                   expert_slice(scales, e, n, name, source), expert_slice(biases, e, n, module + ".biases", source));
    } else {
      add_affine(module, module + ".weight", codes, scales, biases);
    }
    consumed.insert({module + ".weight", name, module + ".biases"});
  }
  for (const std::string& name : ckpt->names()) {
    if (consumed.contains(name) || name.ends_with("rotary_emb.inv_freq")) continue;
    if (name == kLmHeadTensor && c.tied_embeddings) continue;
    // A stacked expert module left unquantized (mlx-lm keeps widths that are no multiple of the group dense).
    if (const auto it = name.ends_with(".weight") ? stacked.find(name.substr(0, name.size() - 7)) : stacked.end();
        it != stacked.end()) {
      for (size_t e = 0; e < it->second.size(); ++e)
        b.add(it->second[e], dense_view_ref(expert_slice(ckpt->tensor(name), e, it->second.size(), name, source),
                                            it->second[e], source));
      continue;
    }
    b.add(name, dense_view_ref(ckpt->tensor(name), name, source));
  }
  return b.finish(c, dir.string(), options);
}

}  // namespace lowbit::model
