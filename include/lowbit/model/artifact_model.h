// Models stored as lowbit artifacts (docs/FORMAT.md).
#pragma once

#include <filesystem>
#include <memory>
#include <optional>

#include "lowbit/artifact/reader.h"
#include "lowbit/model/model.h"

namespace lowbit::model {

std::unique_ptr<Model> load_artifact_model(const std::filesystem::path& dir, const LoadOptions& options = {});
// The text decoder of an artifact already opened (`dir` is its directory, for messages): the tensors under
// model.* and lm_head.* that is_decoder_tensor_name takes; the model holds `art`.
std::unique_ptr<Model> load_artifact_model(std::shared_ptr<artifact::Artifact> art, const std::filesystem::path& dir,
                                           const LoadOptions& options);

// The vocabulary file stored in an artifact (tokenizer.json, tokenizer.model or a llama2.c .bin), if any.
std::optional<std::filesystem::path> artifact_tokenizer_file(const std::filesystem::path& dir);

}  // namespace lowbit::model
