// Format detection: the one place that knows every model and tokenizer source. A new format (GGUF, MLX) is
// one more branch here and a loader of its own.
#include "lowbit/artifact/foreign.h"
#include "lowbit/core/error.h"
#include "lowbit/core/mapped_file.h"
#include "lowbit/io/json.h"
#include "lowbit/model/artifact_model.h"
#include "lowbit/model/foreign_model.h"
#include "lowbit/model/gguf_model.h"
#include "lowbit/model/hf.h"
#include "lowbit/model/llama2c.h"
#include "lowbit/model/mlx.h"
#include "lowbit/model/model.h"
#include "lowbit/model/tokenizers.h"

namespace lowbit::model {

std::unique_ptr<Model> load_model(const std::filesystem::path& path, const LoadOptions& options) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    if (const auto* foreign = artifact::find_foreign_format(path)) return load_foreign_model(path, *foreign, options);
    if (std::filesystem::exists(path / "manifest.json")) return load_artifact_model(path, options);
    if (std::filesystem::exists(path / "config.json")) {
      if (is_mlx_quantized(io::read_json_file(path / "config.json", "load_model", 16 << 20))) return load_mlx(path, options);
      return load_hf(path, options);
    }
    fail(Errc::format, "[load_model] {}: a directory without config.json or manifest.json", path.string());
  }
  if (!std::filesystem::is_regular_file(path, ec)) fail(Errc::missing_file, "[load_model] {}: no such file", path.string());
  if (file_starts_with(path, "GGUF")) return load_gguf_model(path, options);
  return load_llama2c(path, options);
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& model_path,
                                          const std::optional<std::filesystem::path>& tokenizer_file) {
  if (tokenizer_file) {
    const auto& f = *tokenizer_file;
    if (file_starts_with(f, "GGUF")) return load_gguf_tokenizer(f);
    if (f.extension() == ".json") return load_hf_tokenizer(f);
    if (f.extension() == ".model") return load_sentencepiece(f);
    return load_llama2c_tokenizer(f);
  }
  std::error_code ec;
  if (std::filesystem::is_regular_file(model_path, ec) && file_starts_with(model_path, "GGUF"))
    return load_gguf_tokenizer(model_path);
  if (std::filesystem::is_directory(model_path, ec) && std::filesystem::exists(model_path / "manifest.json")) {
    if (const auto stored = artifact_tokenizer_file(model_path)) return load_tokenizer(model_path, stored);
  }
  if (std::filesystem::is_regular_file(model_path, ec)) {  // llama2.c: run.c's default tokenizer.bin beside it
    const auto beside = model_path.parent_path() / "tokenizer.bin";
    if (std::filesystem::is_regular_file(beside, ec)) return load_llama2c_tokenizer(beside);
  }
  if (std::filesystem::is_directory(model_path, ec)) {
    if (std::filesystem::exists(model_path / "tokenizer.json")) return load_hf_tokenizer(model_path / "tokenizer.json");
    if (std::filesystem::exists(model_path / "tokenizer.model")) return load_sentencepiece(model_path / "tokenizer.model");
  }
  fail(Errc::usage, "[load_tokenizer] {}: no tokenizer beside the model; pass --tokenizer FILE", model_path.string());
}

std::unique_ptr<Tokenizer> load_tokenizer_for(const Model& model, const std::filesystem::path& model_path,
                                              const std::optional<std::filesystem::path>& tokenizer_file) {
  auto tokenizer = load_tokenizer(model_path, tokenizer_file);
  if (tokenizer->lists_every_row() && tokenizer->vocab_size() < model.config.vocab)
    fail(Errc::shape, "[load_tokenizer] {}: {} tokens, but the model's vocabulary has {} rows",
         tokenizer_file.value_or(model_path).string(), tokenizer->vocab_size(), model.config.vocab);
  return tokenizer;
}

}  // namespace lowbit::model
