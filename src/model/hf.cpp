// HF directories in and out.
#include "lowbit/model/hf.h"

#include <system_error>

#include "lowbit/core/checked.h"
#include "lowbit/core/error.h"
#include "lowbit/io/json.h"
#include "lowbit/io/safetensors.h"
#include "lowbit/model/family.h"
#include "json_fields.h"

namespace lowbit::model {

namespace {

constexpr uint64_t kMaxConfigBytes = 16 << 20;

bool wanted(const std::string& name, const ModelConfig& c) {
  if (name.ends_with("rotary_emb.inv_freq")) return false;
  if (name == kLmHeadTensor && c.tied_embeddings) return false;  // some exports store the tied copy too
  return true;
}

// The eos ids of generation_config.json, which override config.json's when present.
void read_generation_config(const std::filesystem::path& dir, ModelConfig& c) {
  const auto path = dir / "generation_config.json";
  if (!std::filesystem::is_regular_file(path)) return;
  const auto j = io::read_json_file(path, "load_hf", kMaxConfigBytes);
  if (auto ids = json_ids(j, "eos_token_id", path.string()); !ids.empty()) c.eos_ids = std::move(ids);
}

}  // namespace

std::string_view float_dtype_param(DType t, std::string_view name, std::string_view source) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    default:
      fail(Errc::unsupported, "[load_model] {}: tensor '{}' has dtype {} (F32, F16 or BF16 expected)", source, name,
           dtype_name(t));
  }
}

codec::TensorRef dense_view_ref(const TensorView& view, std::string_view name, std::string_view source) {
  codec::TensorRef ref;
  ref.codec = &codec::codec_or_throw("dense", "load_model");
  ref.params = {{"dtype", float_dtype_param(view.dtype, name, source)}};
  ref.shape = view.shape;
  ref.arrays.items.emplace_back("data", view);
  return ref;
}

std::unique_ptr<Model> load_hf(const std::filesystem::path& dir, const LoadOptions& options) {
  const auto config_path = dir / "config.json";
  const std::string source = config_path.string();
  ModelConfig c = parse_hf_config(io::read_json_file(config_path, "load_hf", kMaxConfigBytes), source);
  read_generation_config(dir, c);
  if (options.max_seq) c.max_seq = std::min(c.max_seq, *options.max_seq);

  auto ckpt = std::make_shared<io::SafetensorsCheckpoint>(io::SafetensorsCheckpoint::open(dir));
  ModelBuilder b;
  b.keep_alive(ckpt, ckpt->files());
  for (const std::string& name : ckpt->names())
    if (wanted(name, c)) b.add(name, dense_view_ref(ckpt->tensor(name), name, source));
  return b.finish(c, dir.string(), options);
}

void write_hf(const Model& model, const std::filesystem::path& out,
              const std::vector<std::filesystem::path>& extra_files) {
  std::error_code ec;
  // An empty directory is taken as it is: `lowbit convert` writes into a staging directory (core/staged_dir.h).
  if (std::filesystem::exists(out, ec) &&
      !(std::filesystem::is_directory(out, ec) && std::filesystem::is_empty(out, ec)))
    fail(Errc::exists, "[convert] {}: already exists", out.string());
  std::filesystem::create_directories(out, ec);
  if (ec) fail(Errc::io, "[convert] {}: cannot create the directory: {}", out.string(), ec.message());
  ModelConfig hf_config = model.config;
  hf_config.rope_style = RopeStyle::half;
  {
    const std::string text = config_to_hf_json(hf_config).dump(2) + "\n";
    std::FILE* f = std::fopen((out / "config.json").c_str(), "wb");
    if (!f) fail_errno("convert", (out / "config.json").string());
    const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    if (std::fclose(f) != 0 || !ok) fail_errno("convert", (out / "config.json").string());
  }
  io::SafetensorsWriter writer(out / "model.safetensors", {{"format", "pt"}});
  for (const auto& t : model.tensors) writer.declare(t.name, DType::F32, t.ref.shape);
  for (const auto& t : model.tensors) {
    const std::vector<float> values = decode_half_rope(model, t);
    writer.write(t.name, std::as_bytes(std::span(values)));
  }
  writer.finish();
  for (const auto& file : extra_files) {
    std::filesystem::copy_file(file, out / file.filename(), ec);
    if (ec) fail(Errc::io, "[convert] {}: {}", file.string(), ec.message());
  }
}

std::vector<std::filesystem::path> tokenizer_files_beside(const std::filesystem::path& model_path) {
  std::vector<std::filesystem::path> files;
  if (!std::filesystem::is_directory(model_path)) return files;
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "tokenizer.model", "generation_config.json",
                           "special_tokens_map.json"})
    if (std::filesystem::is_regular_file(model_path / name)) files.push_back(model_path / name);
  return files;
}

}  // namespace lowbit::model
