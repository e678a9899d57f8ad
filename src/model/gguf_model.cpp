#include "lowbit/model/gguf_model.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include <fmt/format.h>

#include "lowbit/core/error.h"
#include "lowbit/core/mapped_file.h"
#include "lowbit/model/family.h"
#include "lowbit/model/gguf_tensors.h"
#include "lowbit/model/tokenizers.h"

namespace lowbit::model {
namespace {

// Where a GGUF tensor goes: its HF name, and whether it is a (1 + w) norm gain, which llama.cpp's converter
// stores as 1 + w (conversion/gemma.py, norm_shift) and the description's NormKind::rms_unit_offset takes as w.
// A merged expert tensor ([n_experts, rows, cols]) goes to its experts' HF names, in expert order.
struct GgufTarget {
  std::vector<std::string> hf;
  bool unit_offset_gain = false;
};

bool is_norm_gain(const LayerDesc& layer, Role r) {
  if (r == Role::q_norm || r == Role::k_norm) return true;
  return std::any_of(layer.ops.begin(), layer.ops.end(),
                     [&](const Op& op) { return op.kind == Op::Kind::norm && op.weight == r; });
}

// GGUF tensor names -> where they go: the tensors outside the layers, then every layer tensor of the description
// under its spec's GGUF name.
std::unordered_map<std::string, GgufTarget> targets(const ModelDesc& d) {
  const bool unit_final = d.final_norm == NormKind::rms_unit_offset;
  std::unordered_map<std::string, GgufTarget> names{
      {"token_embd.weight", {{std::string(kEmbedTensor)}}},
      {"output_norm.weight", {{std::string(kFinalNormTensor)}, unit_final}},
      {"output_norm.bias", {{std::string(kFinalNormBiasTensor)}}},
      {"output.weight", {{std::string(kLmHeadTensor)}}}};
  for (size_t l = 0; l < d.layers.size(); ++l) {
    const LayerDesc& layer = d.layers[l];
    for (const TensorSpec& t : layer.tensors) {
      GgufTarget& target = names[gguf_tensor_name(static_cast<int64_t>(l), t)];
      target.hf.push_back(hf_tensor_name(static_cast<int64_t>(l), t));
      target.unit_offset_gain = layer.norm == NormKind::rms_unit_offset && is_norm_gain(layer, t.role);
    }
  }
  return names;
}

// Tensors the config was read from (config.rope_scaling): llama3's rope_freqs, phi3's LongRoPE factors.
constexpr std::string_view kRopeTensors[] = {"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"};

std::optional<int32_t> token_id_key(const io::GgufFile& f, const std::string& key, size_t n_tokens) {
  const auto v = f.get_uint(key);
  if (!v) return std::nullopt;
  if (*v >= n_tokens)
    fail(Errc::format, "[gguf] {}: {} = {} is outside the vocabulary of {}", f.source(), key, *v, n_tokens);
  return static_cast<int32_t>(*v);
}

constexpr int32_t kTokenUnknown = 2, kTokenControl = 3, kTokenUserDefined = 4;
constexpr std::string_view kEndTokens[] = {"<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<|end_of_text|>",
                                           "<|eom_id|>", "<end_of_turn>", "<|end|>"};

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
  // Gemma's vocabulary types its <unk> as a control token and names it in unknown_token_id (llama.cpp goes by the
  // id); SentencePiece needs the piece typed unknown.
  if (const auto unk = token_id_key(f, "tokenizer.ggml.unknown_token_id", tokens.size());
      unk && pieces[*unk].type == kTokenControl)
    pieces[*unk].type = kTokenUnknown;
  const auto bos = token_id_key(f, "tokenizer.ggml.bos_token_id", tokens.size());
  const bool add_bos = f.get_bool("tokenizer.ggml.add_bos_token").value_or(true);
  const bool add_space_prefix = f.get_bool("tokenizer.ggml.add_space_prefix").value_or(true);
  return make_sentencepiece(pieces, bos, end_ids(f, tokens, types), add_bos, f.source(), add_space_prefix);
}

// Adds a packed tensor under its Hugging Face name, validated like any stored tensor.
void add_packed(ModelBuilder& b, const std::string& name, const Shape& shape, PackedGgufTensor packed,
                const std::string& context) {
  auto owned = std::make_shared<codec::EncodedTensor>(std::move(packed.tensor));
  codec::TensorRef ref{packed.codec, owned->params, shape, owned->views()};
  codec::validate_tensor(ref, context);
  b.add(name, std::move(ref), std::move(owned));
}

}  // namespace

bool is_gguf_file(const std::filesystem::path& path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(std::filesystem::symlink_status(path, ec)) && file_starts_with(path, "GGUF");
}

std::unique_ptr<Model> load_gguf_model(const std::filesystem::path& path, const LoadOptions& options,
                                       GgufWeights weights) {
  // Every tensor is copied out of the file (re-packed or dequantized), so each tensor's pages leave the resident
  // set once copied and the file is unmapped before the kernels are prepared: its pages would only add to the peak.
  std::optional<io::GgufFile> mapped(io::GgufFile::open(path));
  const io::GgufFile& file = *mapped;
  const std::string source = file.source();
  ModelConfig c = parse_gguf_config(file);
  const ModelDesc desc = describe_model(c, file.source());
  const auto names = targets(desc);
  // Every layer tensor of the description, for each of block_count layers, must be in the file; a missing one
  // means a layer short of block_count (the file's other tensors are checked as they are added below).
  for (size_t l = 0; l < desc.layers.size(); ++l)
    for (const TensorSpec& t : desc.layers[l].tensors)
      if (const std::string name = gguf_tensor_name(static_cast<int64_t>(l), t); !file.tensor(name))
        fail(Errc::format, "[gguf] {}: tensor '{}' is missing ({}.block_count is {})", file.source(), name,
             file.get_string("general.architecture").value_or(""), c.n_layers);
  if (options.max_seq) c.max_seq = std::min(c.max_seq, *options.max_seq);
  ModelBuilder b;
  for (const auto& t : file.header().tensors) {
    if (std::find(std::begin(kRopeTensors), std::end(kRopeTensors), t.name) != std::end(kRopeTensors)) continue;
    const auto it = names.find(t.name);
    if (it == names.end())
      fail(Errc::format, "[gguf] {}: tensor '{}' has no place in a {} model of {} layers (block_count)", file.source(),
           t.name, c.arch, c.n_layers);
    // Gains stored as 1 + w (unit_offset_gain) are shifted back in f32; everything else keeps its packed form
    // where its type has one (gguf_tensors.h), merged expert tensors one matrix per expert.
    const bool single = it->second.hf.size() == 1;
    auto packed = weights == GgufWeights::packed && !it->second.unit_offset_gain && single
                      ? gguf_packed_tensor(file, t)
                      : std::nullopt;
    if (packed) {
      file.release_pages(t);
      add_packed(b, it->second.hf[0], t.shape(), std::move(*packed),
                 fmt::format("[gguf] {}: tensor '{}'", file.source(), t.name));
      continue;
    }
    if (single) {
      std::vector<float> values = file.dequantize(t);
      file.release_pages(t);
      if (it->second.unit_offset_gain)
        for (float& v : values) v -= 1.0f;
      b.add_f32(it->second.hf[0], t.shape(), std::move(values));
      continue;
    }
    // A merged expert tensor: one [rows, cols] matrix per expert, each expert's blocks contiguous (every GGUF
    // type's rows are independent), packed like a single matrix where its type allows.
    const Shape shape = t.shape();
    const std::vector<std::string>& experts = it->second.hf;
    if (shape.size() != 3 || shape[0] != static_cast<int64_t>(experts.size()))
      fail(Errc::shape, "[gguf] {}: tensor '{}' has shape {}, expected [{}, rows, cols]", file.source(), t.name,
           shape_str(shape), experts.size());
    if (weights == GgufWeights::packed) {
      const auto all = file.tensor_bytes(t);
      const size_t expert_bytes = all.size() / experts.size();
      std::vector<PackedGgufTensor> parts;
      for (size_t e = 0; e < experts.size(); ++e) {
        auto part = gguf_packed_matrix(t.type, all.subspan(e * expert_bytes, expert_bytes), {shape[1], shape[2]});
        if (!part) break;  // the type has no packed form: none of the experts has
        parts.push_back(std::move(*part));
      }
      if (parts.size() == experts.size()) {
        file.release_pages(t);
        for (size_t e = 0; e < experts.size(); ++e)
          add_packed(b, experts[e], {shape[1], shape[2]}, std::move(parts[e]),
                     fmt::format("[gguf] {}: tensor '{}' expert {}", file.source(), t.name, e));
        continue;
      }
    }
    std::vector<float> values = file.dequantize(t);
    file.release_pages(t);
    const auto per_expert = static_cast<size_t>(shape[1] * shape[2]);
    for (size_t e = 0; e < experts.size(); ++e)
      b.add_f32(experts[e], {shape[1], shape[2]},
                std::vector<float>(values.begin() + e * per_expert, values.begin() + (e + 1) * per_expert));
  }
  mapped.reset();
  return b.finish(c, source, options);
}

std::unique_ptr<Tokenizer> gguf_tokenizer(const io::GgufFile& f) {
  const auto model = f.get_string("tokenizer.ggml.model");
  const auto tokens = f.get_strings("tokenizer.ggml.tokens");
  if (!model || !tokens || tokens->empty()) fail(Errc::format, "[gguf] {}: no embedded tokenizer", f.source());
  // llama.cpp builds token_embd as [n_embd, n_tokens] and refuses any other shape, so a vocabulary padded to a
  // multiple (gemma-style) lists its padding tokens; lowbit asks for the same exact match. A vocabulary-only file
  // (no token_embd) has nothing to match.
  if (const auto* embed = f.tensor("token_embd.weight");
      embed && (embed->ne.size() != 2 || embed->ne[1] != tokens->size()))
    fail(Errc::shape, "[gguf] {}: tokenizer.ggml.tokens lists {} tokens, but token_embd.weight has {} rows", f.source(),
         tokens->size(), embed->ne.size() == 2 ? embed->ne[1] : 0);
  const auto types = f.get_floats("tokenizer.ggml.token_type").value_or(std::vector<double>{});
  // llama.cpp's token types are 0 (undefined) to 6 (byte); a float such as 1e27 cast to int32 was undefined
  // behaviour (UBSan, found by fuzz_gguf).
  for (size_t id = 0; id < types.size(); ++id)
    if (!(types[id] >= 0 && types[id] <= 6 && types[id] == std::floor(types[id])))
      fail(Errc::format, "[gguf] {}: tokenizer.ggml.token_type[{}] = {} is not a token type (0 to 6)", f.source(), id,
           types[id]);
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
