// Models in other runtimes' formats (include/lowbit/artifact/foreign.h) run through the same builder as lowbit
// artifacts: the foreign reader's TensorRefs view the mapped source files, nothing is converted.
#pragma once

#include <filesystem>
#include <memory>

#include "lowbit/artifact/foreign.h"
#include "lowbit/model/model.h"

namespace lowbit::model {

// Opens `dir` with every check of its format, reports the parts lowbit does not run (audio towers, ...) by name on
// stderr, and builds the language model. Throws Errc::unsupported when the source carries no language-model config.
std::unique_ptr<Model> load_foreign_model(const std::filesystem::path& dir, const artifact::ForeignFormat& format,
                                          const LoadOptions& options = {});

// The language model of an opened foreign source (no report); the model keeps `foreign` alive.
std::unique_ptr<Model> build_foreign_model(const std::shared_ptr<const artifact::ForeignModel>& foreign,
                                           std::string_view source, const LoadOptions& options = {});

}  // namespace lowbit::model
