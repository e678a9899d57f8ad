// lowbit artifacts as models: the manifest's config is an HF config, tensors stay packed in the mapped payloads
// (verified, hashes checked, before anything is used).
#include "lowbit/artifact/reader.h"
#include "lowbit/core/error.h"
#include "lowbit/model/family.h"
#include "lowbit/model/artifact_model.h"

namespace lowbit::model {

std::unique_ptr<Model> load_artifact_model(const std::filesystem::path& dir, const LoadOptions& options) {
  return load_artifact_model(std::make_shared<artifact::Artifact>(artifact::Artifact::open(dir)), dir, options);
}

std::unique_ptr<Model> load_artifact_model(std::shared_ptr<artifact::Artifact> art, const std::filesystem::path& dir,
                                           const LoadOptions& options) {
  ModelConfig c = parse_hf_config(art->config(), (dir / "manifest.json").string());
  if (options.max_seq) c.max_seq = std::min(c.max_seq, *options.max_seq);
  ModelBuilder b;
  b.keep_alive(art);
  // An artifact imported from a multi-part source (Phonon's audio tower) or quantized from one (qwen3_asr) keeps
  // the other parts' tensors; the runtime runs the text decoder.
  // Each tensor's storage is its hold on its pages of the mapping: dropped once a kernel copied it (cpu_only), it
  // releases them, so the mapping and the kernels' copies are not both resident.
  for (const std::string& name : art->tensor_names())
    if (is_decoder_tensor_name(name))
      b.add(name, art->tensor(name),
            std::shared_ptr<const void>(art.get(), [art, name](const void*) { art->release_pages(name); }));
  return b.finish(c, dir.string(), options);
}

std::optional<std::filesystem::path> artifact_tokenizer_file(const std::filesystem::path& dir) {
  const artifact::Artifact art = artifact::Artifact::open(dir, {.verify_hash = false});
  const auto files = art.files_with_role(artifact::FileRole::tokenizer);
  // tokenizer.json and tokenizer.model describe the vocabulary; tokenizer_config.json and the like only
  // accompany them. A llama2.c vocabulary (.bin) and a GGUF source's tokenizer metadata (.gguf) stand alone.
  for (const char* preferred : {"tokenizer.json", "tokenizer.model"})
    for (const auto& f : files)
      if (f.filename() == preferred) return f;
  for (const auto& f : files)
    if (f.extension() == ".bin" || f.extension() == ".gguf") return f;
  return std::nullopt;
}

}  // namespace lowbit::model
