#include "lowbit/model/gguf_model.h"

#include <algorithm>
#include <cmath>
#include <fstream>

#include <fmt/format.h>

#include "lowbit/core/error.h"
#include "lowbit/model/tokenizers.h"

namespace lowbit::model {
namespace {

struct ArchKeys {
  std::string_view gguf;  // general.architecture
  RopeStyle rope_style;
  bool qkv_bias;
  bool qk_norm;
};

constexpr ArchKeys kArchs[] = {
    {"llama", RopeStyle::interleaved, false, false},
    {"mistral", RopeStyle::interleaved, false, false},
    {"qwen2", RopeStyle::half, true, false},
    {"qwen3", RopeStyle::half, false, true},
};

int64_t required(const io::GgufFile& f, const std::string& key) {
  const auto v = f.get_uint(key);
  if (!v) fail(Errc::format, "[gguf] {}: metadata '{}' is missing", f.source(), key);
  if (*v > (1ull << 40)) fail(Errc::limit, "[gguf] {}: metadata '{}' is {}", f.source(), key, *v);
  return static_cast<int64_t>(*v);
}

// llama.cpp stores Llama-3.1-style RoPE scaling not as parameters but as a tensor of per-frequency divisors
// (rope_freqs.weight, [head_dim / 2]). The parameters are recovered by checking every divisor against HF's
// "llama3" rule with the factor read off the lowest frequency and the usual band (low 1, high 4).
RopeScaling llama3_from_rope_freqs(const io::GgufFile& f, const io::GgufTensorInfo& t, const ModelConfig& c,
                                   const std::string& arch) {
  const std::vector<float> divisors = f.dequantize(t);
  if (static_cast<int64_t>(divisors.size()) * 2 != c.head_dim)
    fail(Errc::shape, "[gguf] {}: rope_freqs.weight has {} values for head_dim {}", f.source(), divisors.size(), c.head_dim);
  RopeScaling s;
  s.kind = RopeScaling::Kind::llama3;
  s.factor = divisors.back();
  s.low_freq_factor = 1.0;
  s.high_freq_factor = 4.0;
  s.original_max_position = static_cast<int64_t>(
      f.get_uint(arch + ".rope.scaling.original_context_length").value_or(static_cast<uint64_t>(s.original_max_position)));
  const double low_wavelen = s.original_max_position / s.low_freq_factor;
  const double high_wavelen = s.original_max_position / s.high_freq_factor;
  for (size_t i = 0; i < divisors.size(); ++i) {
    const double freq = 1.0 / std::pow(c.rope_theta, 2.0 * static_cast<double>(i) / static_cast<double>(c.head_dim));
    const double wavelen = 2 * M_PI / freq;
    double expected = 1.0;
    if (wavelen > low_wavelen) {
      expected = s.factor;
    } else if (wavelen >= high_wavelen) {
      const double smooth = (s.original_max_position / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      expected = 1.0 / ((1 - smooth) / s.factor + smooth);
    }
    if (std::abs(divisors[i] - expected) > 1e-3 * expected)
      fail(Errc::unsupported, "[gguf] {}: rope_freqs.weight[{}] = {} does not follow the llama3 RoPE scaling rule ({})",
           f.source(), i, divisors[i], expected);
  }
  return s;
}

RopeScaling rope_scaling(const io::GgufFile& f, const std::string& arch, const ModelConfig& c) {
  if (const auto* freqs = f.tensor("rope_freqs.weight")) return llama3_from_rope_freqs(f, *freqs, c, arch);
  RopeScaling s;
  const auto type = f.get_string(arch + ".rope.scaling.type");
  if (!type || *type == "none") return s;
  if (*type != "linear") fail(Errc::unsupported, "[gguf] {}: RoPE scaling '{}' is not supported", f.source(), *type);
  s.kind = RopeScaling::Kind::linear;
  s.factor = f.get_float(arch + ".rope.scaling.factor").value_or(1.0);
  return s;
}

std::string hf_layer_name(std::string_view gguf_suffix) {
  static const std::pair<std::string_view, std::string_view> kNames[] = {
      {"attn_norm.weight", "input_layernorm.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"attn_q.weight", "self_attn.q_proj.weight"},
      {"attn_k.weight", "self_attn.k_proj.weight"},
      {"attn_v.weight", "self_attn.v_proj.weight"},
      {"attn_q.bias", "self_attn.q_proj.bias"},
      {"attn_k.bias", "self_attn.k_proj.bias"},
      {"attn_v.bias", "self_attn.v_proj.bias"},
      {"attn_output.weight", "self_attn.o_proj.weight"},
      {"attn_q_norm.weight", "self_attn.q_norm.weight"},
      {"attn_k_norm.weight", "self_attn.k_norm.weight"},
      {"ffn_gate.weight", "mlp.gate_proj.weight"},
      {"ffn_up.weight", "mlp.up_proj.weight"},
      {"ffn_down.weight", "mlp.down_proj.weight"},
  };
  for (const auto& [gguf, hf] : kNames)
    if (gguf == gguf_suffix) return std::string(hf);
  return {};
}

// "blk.N.attn_q.weight" -> "model.layers.N.self_attn.q_proj.weight"; empty for names the model does not use.
std::string hf_name(const std::string& name) {
  if (name == "token_embd.weight") return "model.embed_tokens.weight";
  if (name == "output_norm.weight") return "model.norm.weight";
  if (name == "output.weight") return "lm_head.weight";
  if (name.rfind("blk.", 0) != 0) return {};
  const size_t dot = name.find('.', 4);
  if (dot == std::string::npos) return {};
  const std::string layer = name.substr(4, dot - 4);
  if (layer.empty() || !std::all_of(layer.begin(), layer.end(), ::isdigit)) return {};
  const std::string suffix = hf_layer_name(std::string_view(name).substr(dot + 1));
  return suffix.empty() ? std::string() : fmt::format("model.layers.{}.{}", layer, suffix);
}

std::optional<int32_t> token_id_key(const io::GgufFile& f, const std::string& key, size_t n_tokens) {
  const auto v = f.get_uint(key);
  if (!v) return std::nullopt;
  if (*v >= n_tokens) fail(Errc::format, "[gguf] {}: {} = {} is outside the vocabulary of {}", f.source(), key, *v, n_tokens);
  return static_cast<int32_t>(*v);
}

constexpr int32_t kTokenControl = 3, kTokenUserDefined = 4;
constexpr std::string_view kEndTokens[] = {"<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<|end_of_text|>",
                                           "<|eom_id|>"};

// eos, eot and eom ids, and the control tokens that end a turn in the vocabularies we know.
std::vector<int32_t> end_ids(const io::GgufFile& f, const std::vector<std::string>& tokens,
                             const std::vector<double>& types) {
  std::vector<int32_t> ids;
  auto add = [&](std::optional<int32_t> id) {
    if (id && std::find(ids.begin(), ids.end(), *id) == ids.end()) ids.push_back(*id);
  };
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"})
    add(token_id_key(f, key, tokens.size()));
  for (size_t id = 0; id < tokens.size(); ++id)
    if (id < types.size() && types[id] == kTokenControl)
      for (auto end : kEndTokens)
        if (tokens[id] == end) add(static_cast<int32_t>(id));
  return ids;
}

std::unique_ptr<Tokenizer> gpt2_tokenizer(const io::GgufFile& f, const std::vector<std::string>& tokens,
                                          const std::vector<double>& types) {
  BpeSpec spec;
  spec.vocab.reserve(tokens.size());
  for (size_t id = 0; id < tokens.size(); ++id) {
    spec.vocab.emplace_back(tokens[id], static_cast<int32_t>(id));
    const int32_t type = id < types.size() ? static_cast<int32_t>(types[id]) : 1;
    if (type == kTokenControl || type == kTokenUserDefined)
      spec.added.push_back({static_cast<int32_t>(id), tokens[id], type == kTokenControl});
  }
  for (const auto& merge : f.get_strings("tokenizer.ggml.merges").value_or(std::vector<std::string>{})) {
    const size_t space = merge.find(' ', 1);
    if (space == std::string::npos) fail(Errc::format, "[gguf] {}: merge '{}' has no space", f.source(), merge);
    spec.merges.emplace_back(merge.substr(0, space), merge.substr(space + 1));
  }
  const std::string pre = f.get_string("tokenizer.ggml.pre").value_or("default");
  spec.split_patterns = split_patterns_for_pre(pre);
  spec.nfc = pre == "qwen2";
  spec.bos = token_id_key(f, "tokenizer.ggml.bos_token_id", tokens.size());
  spec.add_bos = f.get_bool("tokenizer.ggml.add_bos_token").value_or(false) && spec.bos;
  spec.eos = end_ids(f, tokens, types);
  return make_bpe_tokenizer(std::move(spec), f.source());
}

std::unique_ptr<Tokenizer> llama_tokenizer(const io::GgufFile& f, const std::vector<std::string>& tokens,
                                           const std::vector<double>& types) {
  const auto scores = f.get_floats("tokenizer.ggml.scores").value_or(std::vector<double>{});
  if (scores.size() != tokens.size() || types.size() != tokens.size())
    fail(Errc::format, "[gguf] {}: {} tokens but {} scores and {} types", f.source(), tokens.size(), scores.size(),
         types.size());
  std::vector<SpmPiece> pieces;
  pieces.reserve(tokens.size());
  for (size_t id = 0; id < tokens.size(); ++id)
    pieces.push_back({tokens[id], static_cast<float>(scores[id]), static_cast<int32_t>(types[id])});
  const auto bos = token_id_key(f, "tokenizer.ggml.bos_token_id", tokens.size());
  const bool add_bos = f.get_bool("tokenizer.ggml.add_bos_token").value_or(true);
  return make_sentencepiece(pieces, bos, end_ids(f, tokens, types), add_bos, f.source());
}

}  // namespace

bool is_gguf_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::string_view(magic, 4) == "GGUF";
}

ModelConfig gguf_config(const io::GgufFile& f) {
  const std::string arch = f.get_string("general.architecture").value_or("");
  const auto* row = std::find_if(std::begin(kArchs), std::end(kArchs), [&](const auto& r) { return r.gguf == arch; });
  if (row == std::end(kArchs))
    fail(Errc::unsupported, "[gguf] {}: architecture '{}' is not supported (llama, mistral, qwen2, qwen3)", f.source(), arch);
  ModelConfig c;
  c.arch = arch;
  c.dim = required(f, arch + ".embedding_length");
  c.n_layers = required(f, arch + ".block_count");
  c.n_heads = required(f, arch + ".attention.head_count");
  c.n_kv_heads = f.get_uint(arch + ".attention.head_count_kv") ? required(f, arch + ".attention.head_count_kv") : c.n_heads;
  c.hidden_dim = required(f, arch + ".feed_forward_length");
  c.max_seq = f.get_uint(arch + ".context_length") ? required(f, arch + ".context_length") : 2048;
  c.head_dim = f.get_uint(arch + ".attention.key_length") ? required(f, arch + ".attention.key_length")
                                                          : (c.n_heads > 0 ? c.dim / c.n_heads : 0);
  c.rope_theta = f.get_float(arch + ".rope.freq_base").value_or(10000.0);
  c.norm_eps = static_cast<float>(f.get_float(arch + ".attention.layer_norm_rms_epsilon").value_or(1e-5));
  c.rope_scaling = rope_scaling(f, arch, c);
  c.rope_style = row->rope_style;
  c.qkv_bias = row->qkv_bias;
  c.qk_norm = row->qk_norm;
  const auto* embed = f.tensor("token_embd.weight");
  if (!embed || embed->ne.size() != 2) fail(Errc::format, "[gguf] {}: no 2-D token_embd.weight", f.source());
  c.vocab = static_cast<int64_t>(embed->ne[1]);
  c.tied_embeddings = f.tensor("output.weight") == nullptr;
  const auto n_tokens = f.get_strings("tokenizer.ggml.tokens").value_or(std::vector<std::string>{}).size();
  if (n_tokens > 0) {
    c.bos_id = token_id_key(f, "tokenizer.ggml.bos_token_id", n_tokens);
    if (auto eos = token_id_key(f, "tokenizer.ggml.eos_token_id", n_tokens)) c.eos_ids = {*eos};
  }
  validate_config(c, f.source());
  return c;
}

std::unique_ptr<Model> load_gguf_model(const std::filesystem::path& path, const LoadOptions& options) {
  const auto file = io::GgufFile::open(path);
  ModelConfig c = gguf_config(file);
  if (options.max_seq) c.max_seq = std::min(c.max_seq, *options.max_seq);
  ModelBuilder b;
  for (const auto& t : file.header().tensors) {
    if (t.name == "rope_freqs.weight") continue;  // read into config.rope_scaling
    const std::string name = hf_name(t.name);
    if (name.empty()) fail(Errc::format, "[gguf] {}: tensor '{}' has no place in a {} model", file.source(), t.name, c.arch);
    b.add_f32(name, t.shape(), file.dequantize(t));
  }
  return b.finish(c, file.source());
}

std::unique_ptr<Tokenizer> gguf_tokenizer(const io::GgufFile& f) {
  const auto model = f.get_string("tokenizer.ggml.model");
  const auto tokens = f.get_strings("tokenizer.ggml.tokens");
  if (!model || !tokens || tokens->empty()) fail(Errc::format, "[gguf] {}: no embedded tokenizer", f.source());
  const auto types = f.get_floats("tokenizer.ggml.token_type").value_or(std::vector<double>{});
  if (*model == "gpt2") return gpt2_tokenizer(f, *tokens, types);
  if (*model == "llama") return llama_tokenizer(f, *tokens, types);
  fail(Errc::unsupported, "[gguf] {}: tokenizer model '{}' is not supported (gpt2, llama)", f.source(), *model);
}

std::unique_ptr<Tokenizer> load_gguf_tokenizer(const std::filesystem::path& path) {
  return gguf_tokenizer(io::GgufFile::open(path));
}

std::optional<std::string> gguf_chat_template(const io::GgufFile& file) {
  return file.get_string("tokenizer.chat_template");
}

}  // namespace lowbit::model
