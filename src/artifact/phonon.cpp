// Phonon packed-decoder directories (seed 000). The seed's loader builds mlx_audio's Qwen3-ASR model from
// config.json, replaces the linears packed_manifest.json names by two-plane linears (and, for "hybrid" artifacts,
// the embedding and selected linears by MLX affine ones), then loads the safetensors weights strictly. This reader
// makes the same checks in the same order and derives the expected parameter set from the config the same way, so
// a directory it accepts is one the seed loads; docs/FORMAT.md ("Foreign formats") lists every rule.
#include "lowbit/artifact/phonon.h"

#include <fmt/format.h>

#include <map>
#include <set>

#include "lowbit/codec/affine.h"
#include "lowbit/codec/two_plane.h"
#include "lowbit/core/error.h"
#include "lowbit/core/sha256.h"
#include "lowbit/io/json.h"
#include "lowbit/io/safetensors.h"

namespace lowbit::artifact::phonon {

namespace {

namespace fs = std::filesystem;
namespace two_plane = codec::two_plane;
using nlohmann::json;

constexpr uint64_t kMaxJsonBytes = 16 << 20;
constexpr int64_t kMaxDim = int64_t{1} << 24;
constexpr int64_t kMaxLayers = 1024;  // bounds the expected-parameter list a config can ask for
constexpr int64_t kLinearsPerLayer = 7;  // q, k, v, o, gate, up, down: the seed's 196 = 7 x 28 layers
constexpr std::string_view kEmbedding = "model.embed_tokens";

// mlx_audio's TextConfig defaults (qwen3_asr/config.py), used for keys text_config does not set.
const std::pair<const char*, json> kTextDefaults[] = {
    {"vocab_size", 151936},       {"hidden_size", 2048},          {"intermediate_size", 6144},
    {"num_hidden_layers", 28},    {"num_attention_heads", 16},    {"num_key_value_heads", 8},
    {"head_dim", 128},            {"hidden_act", "silu"},         {"max_position_embeddings", 65536},
    {"rms_norm_eps", 1e-6},       {"tie_word_embeddings", true},  {"rope_theta", 1000000.0},
};

// mlx_audio's AudioEncoderConfig defaults for the keys that fix the audio tower's parameter shapes.
const std::pair<const char*, int64_t> kAudioDefaults[] = {
    {"num_mel_bins", 128}, {"encoder_layers", 24},   {"encoder_attention_heads", 16},         {"encoder_ffn_dim", 4096},
    {"d_model", 1024},     {"output_dim", 2048},     {"downsample_hidden_size", 480},
};

// A JSON value in a message: one line, cut after 60 bytes.
std::string shown(const json& v) {
  const std::string text = v.dump();
  return text.size() > 60 ? text.substr(0, 60) + "..." : text;
}

bool is_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

std::string_view float_param(DType t) { return t == DType::BF16 ? "bf16" : t == DType::F16 ? "f16" : "f32"; }

// An integer field in [lo, hi]; `where` prefixes the key in messages ("modules[3].").
int64_t int_field(const json& obj, std::string_view key, std::string_view where, const std::string& source,
                  int64_t lo = 1, int64_t hi = kMaxDim) {
  const auto it = obj.find(key);
  if (it == obj.end()) fail(Errc::format, "[phonon] {}: {}{} is missing", source, where, key);
  if (!it->is_number_integer() || it->get<int64_t>() < lo || it->get<int64_t>() > hi)
    fail(Errc::format, "[phonon] {}: {}{} must be an integer in [{}, {}], got {}", source, where, key, lo, hi,
         shown(*it));
  return it->get<int64_t>();
}

std::string string_field(const json& obj, std::string_view key, std::string_view where, const std::string& source) {
  const auto it = obj.find(key);
  if (it == obj.end() || !it->is_string())
    fail(Errc::format, "[phonon] {}: {}{} must be a string", source, where, key);
  return it->get<std::string>();
}

// An optional block: absent or null is "not declared" (the seed's manifest.get(...) is None), else an object.
const json* optional_object(const json& obj, std::string_view key, const std::string& source) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  if (!it->is_object()) fail(Errc::format, "[phonon] {}: {} must be an object", source, key);
  return &*it;
}

// The format name a declared block gives; an unknown one is rejected as the seed rejects it.
void expect_format(const json& block, std::string_view key, std::initializer_list<std::string_view> known,
                   const std::string& source) {
  const auto it = block.find("format");
  const std::string name = it != block.end() && it->is_string() ? it->get<std::string>() : "";
  for (std::string_view k : known)
    if (name == k) return;
  fail(Errc::unsupported, "[phonon] {}: {}.format {} is not supported (known: {})", source, key,
       it == block.end() ? "(missing)" : shown(*it), fmt::join(known, ", "));
}

// ---- The model config ------------------------------------------------------------------------------------

// config.json's `key` section: thinker_config's when it has one (as mlx_audio's ModelConfig.from_dict), else the
// top level's; absent is an empty object (every default).
json config_section(const json& config, std::string_view key, const std::string& source) {
  const json* where = &config;
  if (const auto t = config.find("thinker_config"); t != config.end() && t->is_object() && t->contains(key))
    where = &*t;
  const auto it = where->find(key);
  if (it == where->end()) return json::object();
  if (!it->is_object()) fail(Errc::format, "[phonon] {}: {} must be an object", source, key);
  return *it;
}

// The HF Qwen3 config of the text decoder: text_config with mlx_audio's defaults filled in. mlx_audio's decoder
// has no q/k/v biases whatever attention_bias says, so the derived config says false.
json hf_text_config(const json& config, const std::string& source) {
  json hf = config_section(config, "text_config", source);
  for (const auto& [key, value] : kTextDefaults)
    if (!hf.contains(key)) hf[key] = value;
  hf["model_type"] = "qwen3";
  hf["architectures"] = json::array({"Qwen3ForCausalLM"});
  hf["attention_bias"] = false;
  if (!hf["tie_word_embeddings"].is_boolean())
    fail(Errc::format, "[phonon] {}: text_config.tie_word_embeddings must be a boolean", source);
  return hf;
}

// ---- What the model expects --------------------------------------------------------------------------------

enum class SlotKind { param, linear, embedding };

// One parameter group of the model: a plain float array (name = the tensor), a linear (name = the module,
// shape = [out, in]) or the token embedding (name = the module, shape = [num_embeddings, dims]).
struct Slot {
  SlotKind kind;
  std::string name;
  Shape shape;
  bool bias = false;
};

struct Dims {
  int64_t vocab, hidden, intermediate, layers, heads, kv_heads, head_dim;
  bool tied;
};

Dims text_dims(const json& hf, const std::string& source) {
  const auto get = [&](const char* key) { return int_field(hf, key, "text_config.", source); };
  return {get("vocab_size"),          get("hidden_size"), get("intermediate_size"),
          int_field(hf, "num_hidden_layers", "text_config.", source, 1, kMaxLayers),
          get("num_attention_heads"), get("num_key_value_heads"), get("head_dim"), hf["tie_word_embeddings"].get<bool>()};
}

void text_slots(const Dims& d, std::vector<Slot>& out) {
  const int64_t q = d.heads * d.head_dim, kv = d.kv_heads * d.head_dim;
  out.push_back({SlotKind::embedding, std::string(kEmbedding), {d.vocab, d.hidden}});
  for (int64_t l = 0; l < d.layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    out.push_back({SlotKind::param, p + "input_layernorm.weight", {d.hidden}});
    out.push_back({SlotKind::param, p + "post_attention_layernorm.weight", {d.hidden}});
    out.push_back({SlotKind::param, p + "self_attn.q_norm.weight", {d.head_dim}});
    out.push_back({SlotKind::param, p + "self_attn.k_norm.weight", {d.head_dim}});
    out.push_back({SlotKind::linear, p + "self_attn.q_proj", {q, d.hidden}});
    out.push_back({SlotKind::linear, p + "self_attn.k_proj", {kv, d.hidden}});
    out.push_back({SlotKind::linear, p + "self_attn.v_proj", {kv, d.hidden}});
    out.push_back({SlotKind::linear, p + "self_attn.o_proj", {d.hidden, q}});
    out.push_back({SlotKind::linear, p + "mlp.gate_proj", {d.intermediate, d.hidden}});
    out.push_back({SlotKind::linear, p + "mlp.up_proj", {d.intermediate, d.hidden}});
    out.push_back({SlotKind::linear, p + "mlp.down_proj", {d.hidden, d.intermediate}});
  }
  out.push_back({SlotKind::param, "model.norm.weight", {d.hidden}});
  if (!d.tied) out.push_back({SlotKind::linear, "lm_head", {d.vocab, d.hidden}});
}

// mlx_audio's AudioEncoder: three stride-2 Conv2d (MLX weight layout [out, kh, kw, in]), conv_out, encoder layers
// (attention with biases, LayerNorms, fc1/fc2), ln_post, proj1, proj2.
void audio_slots(const json& audio, const std::string& source, std::vector<Slot>& out) {
  std::map<std::string, int64_t> a;
  for (const auto& [key, fallback] : kAudioDefaults)
    a[key] = audio.contains(key) ? int_field(audio, key, "audio_config.", source, 1,
                                             std::string_view(key) == "encoder_layers" ? kMaxLayers : kMaxDim)
                                 : fallback;
  const int64_t d = a["d_model"], ds = a["downsample_hidden_size"], ffn = a["encoder_ffn_dim"];
  if (d % a["encoder_attention_heads"])
    fail(Errc::format, "[phonon] {}: audio_config.d_model {} is not divisible by encoder_attention_heads {}", source,
         d, a["encoder_attention_heads"]);
  const int64_t freq = ((((a["num_mel_bins"] + 1) / 2) + 1) / 2 + 1) / 2;
  const auto param = [&](std::string name, Shape shape) { out.push_back({SlotKind::param, "audio_tower." + name, shape}); };
  const auto linear = [&](std::string name, int64_t in, int64_t o, bool bias) {
    out.push_back({SlotKind::linear, "audio_tower." + name, {o, in}, bias});
  };
  const auto norm = [&](const std::string& name) {
    param(name + ".weight", {d});
    param(name + ".bias", {d});
  };
  for (int i = 1; i <= 3; ++i) {
    param(fmt::format("conv2d{}.weight", i), {ds, 3, 3, i == 1 ? 1 : ds});
    param(fmt::format("conv2d{}.bias", i), {ds});
  }
  linear("conv_out", ds * freq, d, false);
  for (int64_t l = 0; l < a["encoder_layers"]; ++l) {
    const std::string p = fmt::format("layers.{}.", l);
    for (const char* proj : {"q_proj", "k_proj", "v_proj", "out_proj"}) linear(p + "self_attn." + proj, d, d, true);
    norm(p + "self_attn_layer_norm");
    linear(p + "fc1", d, ffn, true);
    linear(p + "fc2", ffn, d, true);
    norm(p + "final_layer_norm");
  }
  norm("ln_post");
  linear("proj1", d, d, true);
  linear("proj2", d, a["output_dim"], true);
}

// ---- What packed_manifest.json declares ---------------------------------------------------------------------

struct Affine {
  int64_t bits, group_size;
  bool bias;
};

struct Declared {
  two_plane::Storage storage = two_plane::Storage::planes;
  bool slim = false;
  std::set<std::string> packed;          // modules stored as two-plane linears
  std::map<std::string, Affine> affine;  // hybrid: module -> its affine layout
  json recipe = json::object();           // what was declared, for the provenance
};

const Slot* find_slot(const std::vector<Slot>& slots, const std::string& name, SlotKind kind) {
  for (const Slot& s : slots)
    if (s.kind == kind && s.name == name) return &s;
  return nullptr;
}

// status, module count, group size, bits and the three format names, in the seed's order.
void check_header(const json& m, int64_t layers, const std::string& source, Declared& out) {
  if (!m.is_object()) fail(Errc::format, "[phonon] {}: not a JSON object", source);
  const auto status = m.find("status");
  if (status == m.end() || *status != "PASS")
    fail(Errc::format, "[phonon] {}: status is {}, expected \"PASS\"", source,
         status == m.end() ? "(missing)" : shown(*status));
  const auto modules = m.find("modules");
  if (modules == m.end() || !modules->is_array()) fail(Errc::format, "[phonon] {}: modules must be an array", source);
  const auto n = static_cast<int64_t>(modules->size());
  if (m.contains("module_count")) {
    const int64_t declared = int_field(m, "module_count", "", source, 0);
    if (n != declared)
      fail(Errc::format, "[phonon] {}: modules has {} entries, module_count declares {}", source, n, declared);
  } else if (n != kLinearsPerLayer * layers) {
    fail(Errc::format, "[phonon] {}: modules has {} entries, the config's {} decoder layers have {} linears", source,
         n, layers, kLinearsPerLayer * layers);
  }
  if (m.value("group_size", json()) != 128)
    fail(Errc::unsupported, "[phonon] {}: group_size must be 128, got {}", source, shown(m.value("group_size", json())));
  if (m.value("bits", json()) != 2)
    fail(Errc::unsupported, "[phonon] {}: bits must be 2, got {}", source, shown(m.value("bits", json())));
  if (const json* meta = optional_object(m, "decoder_metadata", source)) {
    expect_format(*meta, "decoder_metadata", {"broadcast-scales-v1"}, source);
    out.slim = true;
  }
  if (const json* codes = optional_object(m, "decoder_codes", source)) {
    expect_format(*codes, "decoder_codes", {"ten-base5-per-24bit-v1", "five-value-3bit-v1"}, source);
    out.storage = codes->at("format") == "ten-base5-per-24bit-v1" ? two_plane::Storage::quint5 : two_plane::Storage::trit3;
  }
  const json* hybrid = optional_object(m, "hybrid_quantization", source);
  if (hybrid) expect_format(*hybrid, "hybrid_quantization", {"mlx-native-affine-v1"}, source);
  out.recipe = {{"modules", n},
                {"decoder_codes", m.value("decoder_codes", json())},
                {"decoder_metadata", m.value("decoder_metadata", json())},
                {"hybrid_quantization", hybrid ? hybrid->at("format") : json()}};
}

// Each module row names a linear of the model once, with its features; in_features a multiple of 128.
void check_modules(const json& modules, const std::vector<Slot>& slots, const std::string& source, Declared& out) {
  for (size_t i = 0; i < modules.size(); ++i) {
    const std::string where = fmt::format("modules[{}].", i);
    if (!modules[i].is_object()) fail(Errc::format, "[phonon] {}: modules[{}] must be an object", source, i);
    const std::string name = string_field(modules[i], "name", where, source);
    const int64_t in = int_field(modules[i], "in_features", where, source);
    const int64_t o = int_field(modules[i], "out_features", where, source);
    if (in % two_plane::kGroupSize)
      fail(Errc::format, "[phonon] {}: {}in_features={} of '{}' is not divisible by {}", source, where, in, name,
           two_plane::kGroupSize);
    const Slot* slot = find_slot(slots, name, SlotKind::linear);
    if (!slot) fail(Errc::format, "[phonon] {}: {}name '{}' names no linear of the model", source, where, name);
    if (!out.packed.insert(name).second)
      fail(Errc::duplicate, "[phonon] {}: {}name '{}' is packed twice", source, where, name);
    if (slot->shape != Shape{o, in})
      fail(Errc::shape, "[phonon] {}: {}'{}' declares [out, in] = {}, the model's linear is {}", source, where, name,
           shape_str({o, in}), shape_str(slot->shape));
    if (slot->bias)
      fail(Errc::format, "[phonon] {}: {}'{}' has a bias, which a packed linear cannot hold", source, where, name);
  }
}

Affine affine_layout(const json& row, const std::string& where, const std::string& source, int64_t in) {
  const std::string mode = string_field(row, "mode", where, source);
  if (mode != "affine")
    fail(Errc::unsupported, "[phonon] {}: {}mode '{}' is not supported (affine only)", source, where, mode);
  const int64_t bits = int_field(row, "bits", where, source);
  const int64_t group = int_field(row, "group_size", where, source);
  if (bits != 2 && bits != 3 && bits != 4 && bits != 5 && bits != 6 && bits != 8)
    fail(Errc::unsupported, "[phonon] {}: {}bits {} is not supported (2, 3, 4, 5, 6 or 8)", source, where, bits);
  if (group != 32 && group != 64 && group != 128)
    fail(Errc::unsupported, "[phonon] {}: {}group_size {} is not supported (32, 64 or 128)", source, where, group);
  if (in % group)
    fail(Errc::format, "[phonon] {}: {}input width {} is not divisible by group_size {}", source, where, in, group);
  return {bits, group, false};
}

// hybrid_quantization: the embedding and linears stored as MLX affine instead.
void check_hybrid(const json& manifest, const std::vector<Slot>& slots, const std::string& source, Declared& out) {
  const json* hybrid = optional_object(manifest, "hybrid_quantization", source);
  if (!hybrid) return;
  if (const auto e = hybrid->find("embedding"); e != hybrid->end() && !e->is_null() && !(e->is_object() && e->empty())) {
    const std::string where = "hybrid_quantization.embedding.";
    if (!e->is_object()) fail(Errc::format, "[phonon] {}: hybrid_quantization.embedding must be an object", source);
    const std::string name = string_field(*e, "name", where, source);
    const Slot* slot = find_slot(slots, name, SlotKind::embedding);
    if (!slot) fail(Errc::format, "[phonon] {}: {}name '{}' names no embedding of the model", source, where, name);
    const Shape declared{int_field(*e, "num_embeddings", where, source), int_field(*e, "dims", where, source)};
    if (declared != slot->shape)
      fail(Errc::shape, "[phonon] {}: {}[num_embeddings, dims] = {}, the model's embedding is {}", source, where,
           shape_str(declared), shape_str(slot->shape));
    out.affine[name] = affine_layout(*e, where, source, declared[1]);
  }
  const auto rows = hybrid->find("audio_linears");
  if (rows == hybrid->end() || rows->is_null()) return;
  if (!rows->is_array()) fail(Errc::format, "[phonon] {}: hybrid_quantization.audio_linears must be an array", source);
  for (size_t i = 0; i < rows->size(); ++i) {
    const std::string where = fmt::format("hybrid_quantization.audio_linears[{}].", i);
    const json& row = (*rows)[i];
    if (!row.is_object()) fail(Errc::format, "[phonon] {}: {} must be an object", source, where);
    const std::string name = string_field(row, "name", where, source);
    const Slot* slot = find_slot(slots, name, SlotKind::linear);
    if (!slot) fail(Errc::format, "[phonon] {}: {}name '{}' names no linear of the model", source, where, name);
    const Shape declared{int_field(row, "out_features", where, source), int_field(row, "in_features", where, source)};
    if (declared != slot->shape)
      fail(Errc::shape, "[phonon] {}: {}'{}' declares [out, in] = {}, the model's linear is {}", source, where, name,
           shape_str(declared), shape_str(slot->shape));
    const auto bias = row.find("bias");
    if (bias == row.end() || !bias->is_boolean() || bias->get<bool>() != slot->bias)
      fail(Errc::format, "[phonon] {}: {}bias must be {} for '{}'", source, where, slot->bias, name);
    if (out.packed.contains(name) || out.affine.contains(name))
      fail(Errc::duplicate, "[phonon] {}: {}'{}' is already quantized", source, where, name);
    Affine a = affine_layout(row, where, source, declared[1]);
    a.bias = slot->bias;
    out.affine[name] = a;
  }
}

// ---- Strict loading -----------------------------------------------------------------------------------------

// A tensor read from the checkpoint and the stored name of its first array (whose file messages name).
struct Loaded {
  codec::TensorRef ref;
  std::string stored;
};

class Loader {
 public:
  Loader(const fs::path& dir, const Declared& declared)
      : dir_(dir), declared_(declared),
        ckpt_(std::make_shared<io::SafetensorsCheckpoint>(io::SafetensorsCheckpoint::open(dir))) {
    std::set<std::string> shards;
    for (const auto& shard : ckpt_->shards()) {
      shards.insert(shard->file().path().filename().string());
      for (const std::string& name : shard->names()) file_of_[name] = shard->file().path().filename().string();
    }
    for (const std::string& name : ckpt_->names()) remaining_.insert(name);
    // The seed loads every *.safetensors file of the directory, so one the checkpoint leaves out is not ignored.
    for (const auto& entry : fs::directory_iterator(dir))
      if (entry.path().extension() == ".safetensors" && !shards.contains(entry.path().filename().string()))
        fail(Errc::format, "[phonon] {}: a weights file outside the checkpoint ({}); every *.safetensors file is loaded",
             entry.path().string(), ckpt_->shards().size() == 1 ? "model.safetensors" : "model.safetensors.index.json");
  }

  void load(const Slot& s, ForeignModel& out) {
    switch (s.kind) {
      case SlotKind::param: return add(out, s.name, dense(s.name, s.shape));
      case SlotKind::embedding:
      case SlotKind::linear:
        if (declared_.packed.contains(s.name)) {
          add(out, s.name + ".weight", packed(s));
        } else if (const auto a = declared_.affine.find(s.name); a != declared_.affine.end()) {
          add(out, s.name + ".weight", affine(s, a->second));
        } else {
          add(out, s.name + ".weight", dense(s.name + ".weight", s.shape));
        }
        if (s.bias) add(out, s.name + ".bias", dense(s.name + ".bias", {s.shape[0]}));
        return;
    }
  }

  // Nothing may be left over (the seed's load_weights(strict=True)).
  void finish() const {
    if (remaining_.empty()) return;
    const std::string& name = *remaining_.begin();
    fail(Errc::format, "[phonon] {}: tensor '{}' is not a parameter of the model (strict loading)", file(name), name);
  }

  const std::shared_ptr<io::SafetensorsCheckpoint>& checkpoint() const { return ckpt_; }

 private:
  std::string file(const std::string& name) const {
    const auto it = file_of_.find(name);
    return (dir_ / (it != file_of_.end() ? it->second : "")).string();
  }

  void require(const std::string& name) const {
    if (!ckpt_->contains(name))
      fail(Errc::format, "[phonon] {}: tensor '{}' is missing (strict loading)", dir_.string(), name);
  }

  TensorView take(const std::string& name, DType dtype, const Shape& shape) {
    require(name);
    remaining_.erase(name);
    const TensorView v = ckpt_->tensor(name);
    if (v.dtype != dtype)
      fail(Errc::dtype, "[phonon] {}: tensor '{}' has dtype {}, expected {}", file(name), name, dtype_name(v.dtype),
           dtype_name(dtype));
    if (v.shape != shape)
      fail(Errc::shape, "[phonon] {}: tensor '{}' has shape {}, expected {}", file(name), name, shape_str(v.shape),
           shape_str(shape));
    return v;
  }

  // The dtype of a float array, checked before its layout is derived from it.
  DType float_dtype(const std::string& name) const {
    require(name);
    const DType t = ckpt_->tensor(name).dtype;
    if (!is_float(t))
      fail(Errc::dtype, "[phonon] {}: tensor '{}' has dtype {}, expected F32, F16 or BF16", file(name), name,
           dtype_name(t));
    return t;
  }

  Loaded dense(const std::string& name, const Shape& shape) {
    const DType t = float_dtype(name);
    codec::TensorRef ref;
    ref.codec = &codec::codec_or_throw("dense", "phonon");
    ref.params = {{"dtype", float_param(t)}};
    ref.shape = shape;
    ref.arrays.items.emplace_back("data", take(name, t, shape));
    return {std::move(ref), name};
  }

  // Arrays by codec role, each read from "<module>.<MLX name>" with the dtype and shape the codec derives.
  Loaded from_specs(const std::string& codec_id, codec::Params params, const Slot& s,
                    const std::map<std::string, std::string>& mlx_names) {
    Loaded out;
    out.ref.codec = &codec::codec_or_throw(codec_id, "phonon");
    out.ref.shape = s.shape;
    for (const codec::ArraySpec& spec : out.ref.codec->arrays(params, s.shape)) {
      const auto it = mlx_names.find(spec.role);
      const std::string name = s.name + "." + (it != mlx_names.end() ? it->second : spec.role);
      out.ref.arrays.items.emplace_back(spec.role, take(name, spec.dtype, spec.shape));
      if (out.stored.empty()) out.stored = name;
    }
    out.ref.params = std::move(params);
    return out;
  }

  // A two-plane linear: planes (base_q, residual_q), quint5_q or trit3_q codes; full or slim metadata.
  Loaded packed(const Slot& s) {
    std::vector<std::string> stored;
    if (ckpt_->contains(s.name + ".base_q") || ckpt_->contains(s.name + ".residual_q")) stored.push_back("planes");
    if (ckpt_->contains(s.name + ".quint5_q")) stored.push_back("quint5_q");
    if (ckpt_->contains(s.name + ".trit3_q")) stored.push_back("trit3_q");
    if (stored.size() > 1)
      fail(Errc::format, "[phonon] {}: module '{}' stores codes as {}: the decoder code formats are mutually exclusive",
           dir_.string(), s.name, fmt::join(stored, " and "));
    const auto storage = declared_.storage;
    const DType scale = float_dtype(s.name + (declared_.slim ? ".base_alpha" : ".base_scales"));
    const codec::Params params{
        {"storage", storage == two_plane::Storage::planes ? "planes" : storage == two_plane::Storage::quint5 ? "quint5" : "trit3"},
        {"metadata", declared_.slim ? "slim" : "full"},
        {"scale_dtype", float_param(scale)},
        {"group_size", two_plane::kGroupSize}};
    return from_specs("two_plane", params, s,
                      {{"base_codes", "base_q"},
                       {"residual_codes", "residual_q"},
                       {"codes", storage == two_plane::Storage::quint5 ? "quint5_q" : "trit3_q"}});
  }

  // MLX's QuantizedLinear / QuantizedEmbedding: "weight" (U32 codes), "scales", "biases".
  Loaded affine(const Slot& s, const Affine& a) {
    const codec::Params params{
        {"bits", a.bits}, {"group_size", a.group_size}, {"scale_dtype", float_param(float_dtype(s.name + ".scales"))}};
    return from_specs("affine", params, s, {{"codes", "weight"}});
  }

  void add(ForeignModel& out, const std::string& name, Loaded loaded) const {
    codec::validate_tensor(loaded.ref, fmt::format("[phonon] {}: '{}'", file(loaded.stored), name));
    out.tensors.emplace_back(name, std::move(loaded.ref));
  }

  fs::path dir_;
  const Declared& declared_;
  std::shared_ptr<io::SafetensorsCheckpoint> ckpt_;
  std::map<std::string, std::string> file_of_;  // tensor -> its shard's file name
  std::set<std::string> remaining_;             // stored tensors not yet claimed by the model
};

// Every file the reader trusted, hashed, for the provenance of an import.
void add_sources(const fs::path& dir, const io::SafetensorsCheckpoint& ckpt, Provenance& p) {
  std::vector<fs::path> paths{dir / "config.json", dir / kManifestFile};
  if (fs::exists(dir / "model.safetensors.index.json")) paths.push_back(dir / "model.safetensors.index.json");
  for (const auto& shard : ckpt.shards()) paths.push_back(shard->file().path());
  for (const fs::path& path : paths)
    p.sources.push_back({path.filename().string(), fs::file_size(path), sha256_file(path)});
}

// Files an import carries over: the original configs (the audio tower's is only there) and the tokenizer.
void add_files(const fs::path& dir, ForeignModel& out) {
  const std::pair<const char*, FileRole> known[] = {
      {"config.json", FileRole::config},        {"packed_manifest.json", FileRole::other},
      {"tokenizer.json", FileRole::tokenizer},  {"tokenizer_config.json", FileRole::tokenizer},
      {"vocab.json", FileRole::tokenizer},      {"merges.txt", FileRole::tokenizer},
      {"special_tokens_map.json", FileRole::tokenizer}, {"generation_config.json", FileRole::other},
      {"preprocessor_config.json", FileRole::other},   {"chat_template.json", FileRole::other}};
  std::error_code ec;
  for (const auto& [name, role] : known)
    if (fs::is_regular_file(dir / name, ec)) out.files.push_back({dir / name, role});
}

}  // namespace

bool recognizes(const fs::path& dir) {
  std::error_code ec;
  // A lowbit artifact imported from a Phonon directory carries its packed_manifest.json and config.json too; its
  // manifest.json says what it is.
  return fs::is_regular_file(dir / kManifestFile, ec) && fs::is_regular_file(dir / "config.json", ec) &&
         !fs::exists(dir / "manifest.json", ec);
}

ForeignModel open(const fs::path& dir, const ForeignOpenOptions&) {
  const std::string config_source = (dir / "config.json").string();
  const std::string manifest_source = (dir / kManifestFile).string();
  const json config = io::read_json_file(dir / "config.json", "phonon", kMaxJsonBytes);
  if (!config.is_object()) fail(Errc::format, "[phonon] {}: not a JSON object", config_source);
  ForeignModel out;
  out.format = std::string(kFormatName);
  out.config = hf_text_config(config, config_source);
  const Dims dims = text_dims(out.config, config_source);
  std::vector<Slot> slots;
  text_slots(dims, slots);
  audio_slots(config_section(config, "audio_config", config_source), config_source, slots);

  const json manifest = io::read_json_file(dir / kManifestFile, "phonon", kMaxJsonBytes);
  Declared declared;
  check_header(manifest, dims.layers, manifest_source, declared);
  check_modules(manifest.at("modules"), slots, manifest_source, declared);
  check_hybrid(manifest, slots, manifest_source, declared);

  Loader loader(dir, declared);
  for (const Slot& s : slots) loader.load(s, out);
  loader.finish();

  if (dims.tied) out.aliases.emplace_back("lm_head.weight", "model.embed_tokens.weight");
  out.unsupported.push_back("audio_tower");
  add_files(dir, out);
  add_sources(dir, *loader.checkpoint(), out.provenance);
  out.recipe = {{"format", kFormatName}, {"packed_manifest", declared.recipe}};
  out.keep_alive.push_back(loader.checkpoint());
  return out;
}

}  // namespace lowbit::artifact::phonon
