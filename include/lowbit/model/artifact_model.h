// Models stored as lowbit artifacts (docs/FORMAT.md).
#pragma once

#include <filesystem>
#include <memory>
#include <optional>

#include "lowbit/model/model.h"

namespace lowbit::model {

std::unique_ptr<Model> load_artifact_model(const std::filesystem::path& dir, const LoadOptions& options = {});

// The vocabulary file stored in an artifact (tokenizer.json, tokenizer.model or a llama2.c .bin), if any.
std::optional<std::filesystem::path> artifact_tokenizer_file(const std::filesystem::path& dir);

}  // namespace lowbit::model
