// Phonon packed-decoder directories (seed 000): a fixture writer builds tiny Qwen3-ASR directories (a Qwen3-shaped
// text decoder whose linears are two_plane-encoded in each storage variant, an audio tower, hybrid affine parts);
// every rule of the loader is violated once and rejected with its own error; import copies every array unchanged;
// the CLI verifies, inspects, imports and generates the same tokens from the directory and from its import.
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>

#include "artifact/artifact_fixture.h"
#include "lowbit/artifact/foreign.h"
#include "lowbit/artifact/phonon.h"
#include "lowbit/codec/two_plane.h"
#include "lowbit/core/dtype.h"
#include "lowbit/io/safetensors.h"

namespace lowbit::artifact::testing {
namespace {

using codec::two_plane::Storage;

// Text decoder: hidden 128, 2 layers, 2 heads of 64, 1 KV head, MLP 128, vocabulary 96 (the fixture tokenizer's).
// Audio tower: 8 mel bins, d_model 32, 1 layer, FFN 64, downsample 4, output 128 (the decoder's width).
constexpr int64_t kVocab = 96, kHidden = 128, kLayers = 2, kHeads = 2, kKvHeads = 1, kHeadDim = 64, kMlp = 128;
constexpr int64_t kAudioD = 32, kAudioFfn = 64, kDownsample = 4, kMel = 8;

struct Variant {
  Storage storage = Storage::planes;
  bool slim = false;
  bool hybrid = false;       // affine embedding (4 bits, group 64) and audio_tower.proj2 (4 bits, group 32)
  bool packed_head = false;  // untied, lm_head packed too (module_count 15 declared)
  std::string label() const {
    return fmt::format("{}{}{}{}", storage == Storage::planes ? "planes" : storage == Storage::quint5 ? "quint5" : "trit3",
                       slim ? "-slim" : "-full", hybrid ? "-hybrid" : "", packed_head ? "-head" : "");
  }
};

// A Phonon directory in memory; the corruption matrix edits it before writing.
struct Fixture {
  json config, manifest;
  std::map<std::string, TensorBuffer> tensors;  // MLX names
  std::string extra_file;                       // a further safetensors file (holding model.norm.weight) if set

  // Text decoder in one shard, audio tower in another, with the index; tokenizer.json beside them.
  void write(const fs::path& dir) const {
    fs::create_directories(dir);
    write_text(dir / "config.json", config.dump(1));
    write_text(dir / "packed_manifest.json", manifest.dump(1));
    std::vector<std::pair<std::string, TensorView>> shards[2];
    json weight_map = json::object();
    for (const auto& [name, t] : tensors) {
      const int shard = name.starts_with("audio_tower.") ? 1 : 0;
      shards[shard].emplace_back(name, t.view());
      weight_map[name] = fmt::format("model-0000{}-of-00002.safetensors", shard + 1);
    }
    for (int s = 0; s < 2; ++s)
      io::write_safetensors(dir / fmt::format("model-0000{}-of-00002.safetensors", s + 1), shards[s]);
    write_text(dir / "model.safetensors.index.json", json{{"metadata", json::object()}, {"weight_map", weight_map}}.dump());
    write_text(dir / "tokenizer.json", tokenizer_json().dump());
    if (!extra_file.empty()) io::write_safetensors(dir / extra_file, {{"model.norm.weight", tensors.at("model.norm.weight").view()}});
  }

  // A byte-level BPE over the 94 printable ASCII characters, space and newline (ids 0..95), no merges.
  static json tokenizer_json() {
    json vocab = json::object();
    int id = 0;
    for (char c = '!'; c <= '~'; ++c) vocab[std::string(1, c)] = id++;
    vocab["\xC4\xA0"] = id++;  // U+0120: byte-level space
    vocab["\xC4\x8A"] = id++;  // U+010A: byte-level newline
    return {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}},
            {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
            {"decoder", {{"type", "ByteLevel"}}},
            {"added_tokens", json::array()}};
  }
};

TensorBuffer float_buffer(DType dtype, Shape shape, const std::vector<float>& values) {
  TensorBuffer b = make_buffer(dtype, std::move(shape));
  for (size_t i = 0; i < values.size(); ++i) store_float(dtype, b.bytes.data(), i, values[i]);
  return b;
}

class Builder {
 public:
  Builder(const Variant& v, uint64_t seed) : v_(v), rng_(seed) {}

  Fixture build() {
    f_.config = {{"model_type", "qwen3_asr"},
                 {"thinker_config",
                  {{"text_config",
                    {{"vocab_size", kVocab}, {"hidden_size", kHidden}, {"intermediate_size", kMlp},
                     {"num_hidden_layers", kLayers}, {"num_attention_heads", kHeads}, {"num_key_value_heads", kKvHeads},
                     {"head_dim", kHeadDim}, {"max_position_embeddings", 256}, {"rope_theta", 1000000.0},
                     {"rms_norm_eps", 1e-6}, {"tie_word_embeddings", !v_.packed_head}}},
                   {"audio_config",
                    {{"num_mel_bins", kMel}, {"encoder_layers", 1}, {"encoder_attention_heads", 2},
                     {"encoder_ffn_dim", kAudioFfn}, {"d_model", kAudioD}, {"output_dim", kHidden},
                     {"downsample_hidden_size", kDownsample}}}}}};
    f_.manifest = {{"status", "PASS"}, {"group_size", 128}, {"bits", 2}, {"modules", json::array()}};
    if (v_.slim) f_.manifest["decoder_metadata"] = {{"format", "broadcast-scales-v1"}};
    if (v_.storage != Storage::planes)
      f_.manifest["decoder_codes"] = {
          {"format", v_.storage == Storage::quint5 ? "ten-base5-per-24bit-v1" : "five-value-3bit-v1"}};
    text();
    audio();
    return std::move(f_);
  }

 private:
  std::vector<float> normal(int64_t n, float sigma, float mean = 0.0f) {
    std::normal_distribution<float> d(mean, sigma);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = d(rng_);
    return v;
  }
  void dense(const std::string& name, Shape shape, float mean = 0.0f) {
    const auto v = normal(checked_numel(shape, name), 0.05f, mean);
    f_.tensors[name] = float_buffer(DType::BF16, std::move(shape), v);
  }
  void add_encoded(const std::string& module, codec::EncodedTensor e, const std::map<std::string, std::string>& names) {
    for (auto& [role, buffer] : e.arrays) {
      const auto it = names.find(role);
      f_.tensors[module + "." + (it != names.end() ? it->second : role)] = std::move(buffer);
    }
  }
  void packed(const std::string& module, int64_t out, int64_t in) {
    const std::string storage = v_.storage == Storage::planes ? "planes" : v_.storage == Storage::quint5 ? "quint5" : "trit3";
    const codec::Params params{{"storage", storage}, {"metadata", v_.slim ? "slim" : "full"}, {"scale_dtype", "bf16"}};
    add_encoded(module, encode("two_plane", params, {out, in}, normal(out * in, 0.05f)),
                {{"base_codes", "base_q"}, {"residual_codes", "residual_q"}, {"codes", storage + "_q"}});
    f_.manifest["modules"].push_back({{"name", module}, {"in_features", in}, {"out_features", out}});
  }
  void affine(const std::string& module, int64_t out, int64_t in, int64_t group) {
    const codec::Params params{{"bits", 4}, {"group_size", group}, {"scale_dtype", "bf16"}};
    add_encoded(module, encode("affine", params, {out, in}, normal(out * in, 0.5f)), {{"codes", "weight"}});
  }
  void text() {
    if (v_.hybrid) {
      affine("model.embed_tokens", kVocab, kHidden, 64);
      f_.manifest["hybrid_quantization"] = {
          {"format", "mlx-native-affine-v1"},
          {"embedding",
           {{"name", "model.embed_tokens"}, {"num_embeddings", kVocab}, {"dims", kHidden}, {"group_size", 64}, {"bits", 4},
            {"mode", "affine"}}},
          {"audio_linears",
           {{{"name", "audio_tower.proj2"}, {"in_features", kAudioD}, {"out_features", kHidden}, {"bias", true},
             {"group_size", 32}, {"bits", 4}, {"mode", "affine"}}}}};
    } else {
      f_.tensors["model.embed_tokens.weight"] = float_buffer(DType::BF16, {kVocab, kHidden}, normal(kVocab * kHidden, 0.5f));
    }
    const int64_t q = kHeads * kHeadDim, kv = kKvHeads * kHeadDim;
    for (int64_t l = 0; l < kLayers; ++l) {
      const std::string p = fmt::format("model.layers.{}.", l);
      dense(p + "input_layernorm.weight", {kHidden}, 1.0f);
      dense(p + "post_attention_layernorm.weight", {kHidden}, 1.0f);
      dense(p + "self_attn.q_norm.weight", {kHeadDim}, 1.0f);
      dense(p + "self_attn.k_norm.weight", {kHeadDim}, 1.0f);
      packed(p + "self_attn.q_proj", q, kHidden);
      packed(p + "self_attn.k_proj", kv, kHidden);
      packed(p + "self_attn.v_proj", kv, kHidden);
      packed(p + "self_attn.o_proj", kHidden, q);
      packed(p + "mlp.gate_proj", kMlp, kHidden);
      packed(p + "mlp.up_proj", kMlp, kHidden);
      packed(p + "mlp.down_proj", kHidden, kMlp);
    }
    dense("model.norm.weight", {kHidden}, 1.0f);
    if (v_.packed_head) {
      packed("lm_head", kVocab, kHidden);
      f_.manifest["module_count"] = 15;
    }
  }
  void audio() {
    const std::string a = "audio_tower.";
    for (int i = 1; i <= 3; ++i) {
      dense(fmt::format("{}conv2d{}.weight", a, i), {kDownsample, 3, 3, i == 1 ? 1 : kDownsample});
      dense(fmt::format("{}conv2d{}.bias", a, i), {kDownsample});
    }
    dense(a + "conv_out.weight", {kAudioD, kDownsample * 1});  // 8 mel bins -> 1 frequency after three convs
    const auto linear = [&](const std::string& name, int64_t out, int64_t in) {
      dense(a + name + ".weight", {out, in});
      dense(a + name + ".bias", {out});
    };
    const auto norm = [&](const std::string& name) {
      dense(a + name + ".weight", {kAudioD}, 1.0f);
      dense(a + name + ".bias", {kAudioD});
    };
    for (const char* proj : {"q_proj", "k_proj", "v_proj", "out_proj"})
      linear(std::string("layers.0.self_attn.") + proj, kAudioD, kAudioD);
    norm("layers.0.self_attn_layer_norm");
    linear("layers.0.fc1", kAudioFfn, kAudioD);
    linear("layers.0.fc2", kAudioD, kAudioFfn);
    norm("layers.0.final_layer_norm");
    norm("ln_post");
    linear("proj1", kAudioD, kAudioD);
    if (v_.hybrid) {
      affine(a + "proj2", kHidden, kAudioD, 32);
      dense(a + "proj2.bias", {kHidden});
    } else {
      linear("proj2", kHidden, kAudioD);
    }
  }

  Variant v_;
  std::mt19937_64 rng_;
  Fixture f_;
};

const Fixture& fixture(const Variant& v) {
  static std::map<std::string, Fixture> cache;
  auto it = cache.find(v.label());
  if (it == cache.end()) it = cache.emplace(v.label(), Builder(v, 7).build()).first;
  return it->second;
}

const Variant kVariants[] = {
    {Storage::planes, false, false}, {Storage::planes, true, false}, {Storage::quint5, false, false},
    {Storage::quint5, true, true},   {Storage::trit3, false, true},  {Storage::trit3, true, false, true},
};

// ---- Opening every variant -----------------------------------------------------------------------------------

TEST(Phonon, EveryVariantOpensWithHfNamesAndTheAudioTowerReported) {
  for (const Variant& v : kVariants) {
    SCOPED_TRACE(v.label());
    TempDir tmp;
    fixture(v).write(tmp / "p");
    const ForeignFormat* format = find_foreign_format(tmp / "p");
    ASSERT_NE(format, nullptr);
    EXPECT_EQ(format->name, phonon::kFormatName);
    const ForeignModel m = format->open(tmp / "p", {});
    EXPECT_EQ(m.format, phonon::kFormatName);
    EXPECT_EQ(m.unsupported, std::vector<std::string>{"audio_tower"});
    EXPECT_EQ(m.config["model_type"], "qwen3");
    EXPECT_EQ(m.config["hidden_size"], kHidden);
    EXPECT_EQ(m.config["hidden_act"], "silu");  // an mlx_audio default the config left out
    ASSERT_EQ(m.aliases.size(), v.packed_head ? 0u : 1u);
    if (!v.packed_head) {
      EXPECT_EQ(m.aliases[0].first, "lm_head.weight");
    }
    std::map<std::string, const codec::TensorRef*> by_name;
    for (const auto& [name, ref] : m.tensors) by_name[name] = &ref;
    const auto* q = by_name.at("model.layers.1.self_attn.q_proj.weight");
    EXPECT_EQ(q->codec->id, "two_plane");
    EXPECT_EQ(q->params["metadata"], v.slim ? "slim" : "full");
    EXPECT_EQ(by_name.at("model.embed_tokens.weight")->codec->id, v.hybrid ? "affine" : "dense");
    EXPECT_EQ(by_name.at("audio_tower.proj2.weight")->codec->id, v.hybrid ? "affine" : "dense");
    EXPECT_TRUE(by_name.contains("audio_tower.conv2d2.weight"));
    // One tensor per stored array, except that a packed module's code and metadata arrays (2 + 4, 1 + 4, 2 + 2
    // or 1 + 2) and an affine module's three arrays are one tensor each.
    const size_t per_packed = (v.storage == Storage::planes ? 2u : 1u) + (v.slim ? 2u : 4u);
    const size_t packed = v.packed_head ? 15u : 14u;
    EXPECT_EQ(m.tensors.size(), fixture(v).tensors.size() - packed * (per_packed - 1) - (v.hybrid ? 4u : 0u));
  }
}

// Zero-copy: every two_plane array is the stored MLX array, byte for byte, and decodes as the codec says.
TEST(Phonon, PackedArraysAreTheStoredBytes) {
  for (const Variant& v : kVariants) {
    SCOPED_TRACE(v.label());
    TempDir tmp;
    const Fixture& f = fixture(v);
    f.write(tmp / "p");
    const ForeignModel m = phonon::open(tmp / "p", {});
    for (const auto& [name, ref] : m.tensors) {
      if (ref.codec->id != "two_plane") continue;
      const std::string module = name.substr(0, name.size() - 7);
      for (const auto& [role, view] : ref.arrays.items) {
        const std::string stored = role == "base_codes" ? "base_q" : role == "residual_codes" ? "residual_q"
                                   : role == "codes" ? (v.storage == Storage::quint5 ? "quint5_q" : "trit3_q")
                                                     : role;
        const TensorBuffer& src = f.tensors.at(module + "." + stored);
        ASSERT_EQ(view.bytes.size(), src.bytes.size()) << name << " " << role;
        EXPECT_EQ(std::memcmp(view.bytes.data(), src.bytes.data(), src.bytes.size()), 0) << name << " " << role;
      }
    }
  }
}

// ---- The corruption matrix -------------------------------------------------------------------------------------

struct Rule {
  std::string name;
  Variant variant;
  std::function<void(Fixture&)> corrupt;
  Errc code;
  std::string message;  // a part of the one-line message
  std::string file;     // the file the message names
};

const std::string kQ = "model.layers.0.self_attn.q_proj";

std::vector<Rule> rules() {
  const Variant planes{}, quint5{Storage::quint5, true, true}, trit3{Storage::trit3, false, false};
  const auto manifest = [](std::function<void(json&)> edit) { return [edit](Fixture& f) { edit(f.manifest); }; };
  const auto text_config = [](std::string key, json value) {
    return [key, value](Fixture& f) { f.config["thinker_config"]["text_config"][key] = value; };
  };
  const std::string m = "packed_manifest.json", s1 = "model-00001-of-00002.safetensors",
                    s2 = "model-00002-of-00002.safetensors";
  return {
      {"status", planes, manifest([](json& j) { j["status"] = "FAIL"; }), Errc::format, "status is \"FAIL\"", m},
      {"modules_not_array", planes, manifest([](json& j) { j["modules"] = json::object(); }), Errc::format,
       "modules must be an array", m},
      {"module_count_implied", planes, manifest([](json& j) { j["modules"].erase(j["modules"].size() - 1); }),
       Errc::format, "modules has 13 entries, the config's 2 decoder layers have 14", m},
      {"module_count_declared", planes, manifest([](json& j) { j["module_count"] = 13; }), Errc::format,
       "module_count declares 13", m},
      {"group_size", planes, manifest([](json& j) { j["group_size"] = 64; }), Errc::unsupported,
       "group_size must be 128", m},
      {"bits", planes, manifest([](json& j) { j["bits"] = 3; }), Errc::unsupported, "bits must be 2", m},
      {"metadata_format", quint5, manifest([](json& j) { j["decoder_metadata"]["format"] = "per-row-v2"; }),
       Errc::unsupported, "decoder_metadata.format \"per-row-v2\" is not supported", m},
      {"metadata_not_object", planes, manifest([](json& j) { j["decoder_metadata"] = "slim"; }), Errc::format,
       "decoder_metadata must be an object", m},
      {"codes_format", quint5, manifest([](json& j) { j["decoder_codes"]["format"] = "ten-base5-per-32bit-v1"; }),
       Errc::unsupported, "decoder_codes.format \"ten-base5-per-32bit-v1\" is not supported", m},
      {"codes_format_missing", trit3, manifest([](json& j) { j["decoder_codes"].erase("format"); }), Errc::unsupported,
       "decoder_codes.format (missing)", m},
      {"hybrid_format", quint5, manifest([](json& j) { j["hybrid_quantization"]["format"] = "gguf-q4"; }),
       Errc::unsupported, "hybrid_quantization.format \"gguf-q4\"", m},
      {"module_name_missing", planes, manifest([](json& j) { j["modules"][3].erase("name"); }), Errc::format,
       "modules[3].name must be a string", m},
      {"module_features_not_integer", planes, manifest([](json& j) { j["modules"][3]["out_features"] = "64"; }),
       Errc::format, "modules[3].out_features must be an integer", m},
      {"in_features_not_multiple_of_128", planes, manifest([](json& j) { j["modules"][0]["in_features"] = 192; }),
       Errc::format, "in_features=192 of '" + kQ + "' is not divisible by 128", m},
      {"module_unknown", planes, manifest([](json& j) { j["modules"][0]["name"] = "model.layers.0.self_attn.qkv_proj"; }),
       Errc::format, "names no linear of the model", m},
      {"module_twice", planes, manifest([](json& j) { j["modules"][1] = j["modules"][0]; }), Errc::duplicate,
       "'" + kQ + "' is packed twice", m},
      {"module_features", planes, manifest([](json& j) { j["modules"][0]["out_features"] = 64; }), Errc::shape,
       "declares [out, in] = [64, 128], the model's linear is [128, 128]", m},
      {"hybrid_mode", quint5, manifest([](json& j) { j["hybrid_quantization"]["embedding"]["mode"] = "mxfp4"; }),
       Errc::unsupported, "mode 'mxfp4' is not supported", m},
      {"hybrid_embedding_dims", quint5, manifest([](json& j) { j["hybrid_quantization"]["embedding"]["dims"] = 256; }),
       Errc::shape, "[num_embeddings, dims] = [96, 256]", m},
      {"hybrid_bits", quint5, manifest([](json& j) { j["hybrid_quantization"]["embedding"]["bits"] = 7; }),
       Errc::unsupported, "bits 7 is not supported", m},
      {"hybrid_linear_bias", quint5,
       manifest([](json& j) { j["hybrid_quantization"]["audio_linears"][0]["bias"] = false; }), Errc::format,
       "audio_linears[0].bias must be true", m},
      {"hybrid_linear_packed_too", quint5,
       manifest([](json& j) { j["hybrid_quantization"]["audio_linears"][0] = {{"name", kQ}, {"in_features", 128}, {"out_features", 128}, {"bias", false}, {"group_size", 64}, {"bits", 4}, {"mode", "affine"}}; }),
       Errc::duplicate, "'" + kQ + "' is already quantized", m},
      {"config_field", planes, text_config("hidden_size", "128"), Errc::format,
       "text_config.hidden_size must be an integer", "config.json"},
      {"audio_config_heads", planes,
       [](Fixture& f) { f.config["thinker_config"]["audio_config"]["encoder_attention_heads"] = 3; }, Errc::format,
       "audio_config.d_model 32 is not divisible by encoder_attention_heads 3", "config.json"},
      {"config_layers_bound", planes, text_config("num_hidden_layers", 5000), Errc::format,
       "text_config.num_hidden_layers must be an integer in [1, 1024]", "config.json"},
      {"config_tie_not_bool", planes, text_config("tie_word_embeddings", 1), Errc::format,
       "tie_word_embeddings must be a boolean", "config.json"},
      {"code_formats_exclusive", planes,
       [](Fixture& f) { f.tensors[kQ + ".trit3_q"] = make_buffer(DType::U8, {128, 48}); }, Errc::format,
       "stores codes as planes and trit3_q: the decoder code formats are mutually exclusive", ""},
      {"packed_array_missing", planes, [](Fixture& f) { f.tensors.erase(kQ + ".residual_q"); }, Errc::format,
       "tensor '" + kQ + ".residual_q' is missing", ""},
      {"slim_array_missing", quint5, [](Fixture& f) { f.tensors.erase(kQ + ".residual_scale"); }, Errc::format,
       "tensor '" + kQ + ".residual_scale' is missing", ""},
      {"dense_param_missing", planes, [](Fixture& f) { f.tensors.erase("model.norm.weight"); }, Errc::format,
       "tensor 'model.norm.weight' is missing", ""},
      {"audio_param_missing", planes, [](Fixture& f) { f.tensors.erase("audio_tower.ln_post.bias"); }, Errc::format,
       "tensor 'audio_tower.ln_post.bias' is missing", ""},
      {"lm_head_missing_when_untied", planes, text_config("tie_word_embeddings", false), Errc::format,
       "tensor 'lm_head.weight' is missing", ""},
      {"left_over", planes,
       [](Fixture& f) { f.tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = make_buffer(DType::F32, {32}); },
       Errc::format, "tensor 'model.layers.0.self_attn.rotary_emb.inv_freq' is not a parameter of the model", s1},
      {"left_over_full_metadata_in_slim", quint5,
       [](Fixture& f) { f.tensors[kQ + ".base_scales"] = make_buffer(DType::BF16, {128, 1}); }, Errc::format,
       "tensor '" + kQ + ".base_scales' is not a parameter", s1},
      {"stray_weights_file", planes,
       [](Fixture& f) { f.extra_file = "extra.safetensors"; }, Errc::format,
       "a weights file outside the checkpoint (model.safetensors.index.json)", "extra.safetensors"},
      {"code_dtype", planes,
       [](Fixture& f) { f.tensors[kQ + ".base_q"].dtype = DType::I32; }, Errc::dtype,
       "tensor '" + kQ + ".base_q' has dtype I32, expected U32", s1},
      {"code_shape", trit3, [](Fixture& f) { f.tensors[kQ + ".trit3_q"] = make_buffer(DType::U8, {128, 40}); },
       Errc::shape, "tensor '" + kQ + ".trit3_q' has shape [128, 40], expected [128, 48]", s1},
      {"metadata_dtype_not_float", planes, [](Fixture& f) { f.tensors[kQ + ".base_scales"].dtype = DType::I16; },
       Errc::dtype, "expected F32, F16 or BF16", s1},
      {"metadata_dtypes_differ", planes, [](Fixture& f) { f.tensors[kQ + ".residual_biases"].dtype = DType::F16; },
       Errc::dtype, "tensor '" + kQ + ".residual_biases' has dtype F16, expected BF16", s1},
      {"audio_shape", planes,
       [](Fixture& f) { f.tensors["audio_tower.conv2d1.weight"] = make_buffer(DType::BF16, {4, 3, 1, 3}); },
       Errc::shape, "'audio_tower.conv2d1.weight' has shape [4, 3, 1, 3], expected [4, 3, 3, 1]", s2},
      {"dense_dtype", planes, [](Fixture& f) { f.tensors["model.norm.weight"].dtype = DType::I16; }, Errc::dtype,
       "'model.norm.weight' has dtype I16", s1},
      {"quint5_reserved_chunk", quint5,
       [](Fixture& f) { std::fill_n(f.tensors[kQ + ".quint5_q"].bytes.begin(), 3, std::byte{0xFF}); },
       Errc::reserved_code, "quint5 chunk 0 is not below 5^10", s1},
      {"trit3_reserved_digit", trit3, [](Fixture& f) { f.tensors[kQ + ".trit3_q"].bytes[0] = std::byte{0x07}; },
       Errc::reserved_code, "digit 7 is reserved", s1},
      {"metadata_not_finite", planes,
       [](Fixture& f) { store_float(DType::BF16, f.tensors[kQ + ".base_scales"].bytes.data(), 0, NAN); },
       Errc::non_finite, "base_scales element 0 is not finite", s1},
  };
}

void expect_error(const fs::path& dir, Errc code, const std::string& message) {
  try {
    phonon::open(dir, {});
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
  }
}

TEST(Phonon, EveryRuleIsRejectedWithItsOwnError) {
  std::set<std::string> messages;
  const auto all = rules();
  for (const Rule& r : all) {
    SCOPED_TRACE(r.name);
    TempDir tmp;
    Fixture f = fixture(r.variant);
    r.corrupt(f);
    f.write(tmp / "p");
    try {
      phonon::open(tmp / "p", {});
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_EQ(e.code(), r.code) << what;
      EXPECT_TRUE(is_invalid_input(e.code())) << what;
      EXPECT_NE(what.find(r.message), std::string::npos) << what;
      EXPECT_EQ(what.rfind("[phonon] ", 0), 0u) << what;
      EXPECT_NE(what.find(((r.file.empty() ? tmp / "p" : tmp / "p" / r.file)).string()), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
      EXPECT_TRUE(messages.insert(what.substr(what.find(": "))).second) << "same error as another rule: " << what;
    }
  }
  RecordProperty("rules", static_cast<int>(all.size()));
}

// A packed linear has no bias, so a manifest row naming a biased linear (the audio tower's) is rejected.
TEST(Phonon, PackedLinearCannotHoldABias) {
  TempDir tmp;
  Fixture f = fixture({});
  f.manifest["module_count"] = 15;
  f.manifest["modules"].push_back({{"name", "audio_tower.layers.0.fc2"}, {"in_features", 128}, {"out_features", 32}});
  f.config["thinker_config"]["audio_config"]["encoder_ffn_dim"] = 128;
  f.write(tmp / "p");
  expect_error(tmp / "p", Errc::format, "'audio_tower.layers.0.fc2' has a bias, which a packed linear cannot hold");
}

// The declared module_count replaces the seed's hard-coded 196 when present; fewer packed linears then load
// (the others dense), as the seed's loader would load them.
TEST(Phonon, DeclaredModuleCountAllowsDenseLinears) {
  TempDir tmp;
  Fixture f = fixture({});
  f.manifest["modules"].erase(0);
  f.manifest["module_count"] = 13;
  for (const char* part : {"base_q", "residual_q", "base_scales", "base_biases", "residual_scales", "residual_biases"})
    f.tensors.erase(kQ + "." + part);
  f.tensors[kQ + ".weight"] = make_buffer(DType::BF16, {128, 128});
  f.write(tmp / "p");
  const ForeignModel m = phonon::open(tmp / "p", {});
  const auto it = std::find_if(m.tensors.begin(), m.tensors.end(), [](const auto& t) { return t.first == kQ + ".weight"; });
  ASSERT_NE(it, m.tensors.end());
  EXPECT_EQ(it->second.codec->id, "dense");
}

// A null block is an absent one (the seed's manifest.get(...) is None): planes with full metadata, no hybrid.
TEST(Phonon, NullBlocksAreNotDeclared) {
  TempDir tmp;
  Fixture f = fixture({});
  for (const char* block : {"decoder_metadata", "decoder_codes", "hybrid_quantization"}) f.manifest[block] = nullptr;
  f.write(tmp / "p");
  const ForeignModel m = phonon::open(tmp / "p", {});
  EXPECT_TRUE(m.recipe["packed_manifest"]["hybrid_quantization"].is_null());
}

// ---- Import ----------------------------------------------------------------------------------------------------

// import_foreign copies every array unchanged (no variant is re-laid out: the two_plane codec stores the planes,
// quint5 and trit3 codes and both metadata forms as the seed does), so the artifact's arrays are the source's.
TEST(Phonon, ImportIsBitExact) {
  for (const Variant& v : kVariants) {
    SCOPED_TRACE(v.label());
    TempDir tmp;
    fixture(v).write(tmp / "p");
    const ForeignModel m = phonon::open(tmp / "p", {});
    {
      ArtifactWriter w(tmp / "a");
      import_foreign(m, w);
      w.commit();
    }
    const Artifact a = Artifact::open(tmp / "a");
    EXPECT_EQ(a.tensor_names().size(), m.tensors.size());
    for (const auto& [name, ref] : m.tensors) {
      const codec::TensorRef& t = a.tensor(name);
      EXPECT_EQ(t.codec->id, ref.codec->id) << name;
      EXPECT_EQ(t.shape, ref.shape) << name;
      ASSERT_EQ(t.arrays.items.size(), ref.arrays.items.size()) << name;
      for (size_t i = 0; i < t.arrays.items.size(); ++i) {
        const TensorView &got = t.arrays.items[i].second, &want = ref.arrays.items[i].second;
        EXPECT_EQ(t.arrays.items[i].first, ref.arrays.items[i].first) << name;
        EXPECT_EQ(got.dtype, want.dtype) << name;
        ASSERT_EQ(got.bytes.size(), want.bytes.size()) << name;
        EXPECT_EQ(std::memcmp(got.bytes.data(), want.bytes.data(), want.bytes.size()), 0) << name;
      }
    }
    EXPECT_EQ(a.contains("lm_head.weight"), v.packed_head);
    EXPECT_EQ(a.config()["tie_word_embeddings"], !v.packed_head);
    EXPECT_EQ(a.recipe()["import"]["format"], phonon::kFormatName);
    EXPECT_EQ(a.provenance().sources.size(), 5u);  // config, manifest, index, two shards
    EXPECT_TRUE(fs::exists(a.file_path("tokenizer.json")));
    EXPECT_TRUE(fs::exists(a.file_path("packed_manifest.json")));
  }
}

// ---- The lowbit binary ---------------------------------------------------------------------------------------

TEST(PhononCli, VerifyInspectAndImport) {
  TempDir tmp;
  const std::string dir = (tmp / "p").string(), art = (tmp / "a").string();
  fixture({Storage::quint5, true, true}).write(dir);
  const CliResult v = run_cli({"verify", dir});
  ASSERT_EQ(v.status, 0) << v.err;
  EXPECT_EQ(v.out.rfind("OK: phonon-packed-decoder, ", 0), 0u) << v.out;
  EXPECT_NE(v.out.find("not run by lowbit: audio_tower"), std::string::npos) << v.out;
  const CliResult j = run_cli({"inspect", dir, "--json"});
  ASSERT_EQ(j.status, 0) << j.err;
  const json doc = json::parse(j.out);
  EXPECT_EQ(doc["format"], phonon::kFormatName);
  EXPECT_EQ(doc["unsupported"], json::array({"audio_tower"}));
  EXPECT_EQ(doc["config"]["model_type"], "qwen3");
  const CliResult table = run_cli({"inspect", dir});
  ASSERT_EQ(table.status, 0) << table.err;
  EXPECT_NE(table.out.find("two_plane"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("not run by lowbit: audio_tower"), std::string::npos) << table.out;
  const CliResult imported = run_cli({"import", dir, art});
  ASSERT_EQ(imported.status, 0) << imported.err;
  EXPECT_NE(imported.err.find("'audio_tower' is copied but not run"), std::string::npos) << imported.err;
  EXPECT_EQ(run_cli({"verify", art}).status, 0);
  write_text(tmp / "p" / "packed_manifest.json", "{\"status\": \"FAIL\"}");
  const CliResult bad = run_cli({"verify", dir});
  EXPECT_EQ(bad.status, 3);
  EXPECT_NE(bad.err.find("status is \"FAIL\""), std::string::npos) << bad.err;
}

// A Qwen3-shaped decoder in Phonon layout generates the same greedy tokens as its lowbit import.
TEST(PhononCli, GeneratesTheSameTokensAsItsImport) {
  // Dense tied embedding; affine embedding as the tied head; untied packed head with an affine embedding.
  for (const Variant& v : {Variant{}, Variant{Storage::quint5, true, true}, Variant{Storage::trit3, true, true, true}}) {
    SCOPED_TRACE(v.label());
    TempDir tmp;
    const std::string dir = (tmp / "p").string(), art = (tmp / "a").string();
    fixture(v).write(dir);
    ASSERT_EQ(run_cli({"import", dir, art}).status, 0);
    const std::vector<std::string> gen{"-p", "Hello", "-n", "12", "--temp", "0", "--threads", "1"};
    std::vector<std::string> from_dir{"generate", dir}, from_art{"generate", art};
    from_dir.insert(from_dir.end(), gen.begin(), gen.end());
    from_art.insert(from_art.end(), gen.begin(), gen.end());
    const CliResult a = run_cli(from_dir), b = run_cli(from_art);
    ASSERT_EQ(a.status, 0) << a.err;
    ASSERT_EQ(b.status, 0) << b.err;
    EXPECT_NE(a.err.find("'audio_tower' is not supported by lowbit and is not run"), std::string::npos) << a.err;
    EXPECT_GT(a.out.size(), 5u) << a.out;
    EXPECT_EQ(a.out, b.out);
  }
}

}  // namespace
}  // namespace lowbit::artifact::testing
