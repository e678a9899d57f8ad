#include "lowbit/model/foreign_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>

#include "lowbit/core/error.h"
#include "lowbit/model/family.h"

namespace lowbit::model {

std::unique_ptr<Model> load_foreign_model(const std::filesystem::path& dir, const artifact::ForeignFormat& format,
                                          const LoadOptions& options) {
  const std::string source = dir.string();
  auto foreign = std::make_shared<artifact::ForeignModel>(format.open(dir, {}));
  for (const std::string& part : foreign->unsupported)
    fmt::print(stderr, "[load_model] {}: '{}' is not supported by lowbit and is not run\n", source, part);
  return build_foreign_model(std::move(foreign), source, options);
}

std::unique_ptr<Model> build_foreign_model(const std::shared_ptr<const artifact::ForeignModel>& foreign,
                                           std::string_view source, const LoadOptions& options) {
  if (!foreign->config.is_object())
    fail(Errc::unsupported, "[load_model] {}: this {} carries no language-model config", source, foreign->format);
  ModelConfig c = parse_hf_config(foreign->config, source);
  if (options.max_seq) c.max_seq = std::min(c.max_seq, *options.max_seq);
  ModelBuilder b;
  b.keep_alive(foreign);
  for (const auto& [name, ref] : foreign->tensors)
    if (is_decoder_tensor_name(name)) b.add(name, ref);  // the rest are the parts reported above
  for (const auto& [alias, target] : foreign->aliases) {
    if (c.tied_embeddings && alias == kLmHeadTensor) continue;  // the builder ties the head itself
    b.add(alias, foreign->alias_target(alias, target));
  }
  return b.finish(c, source, options);
}

}  // namespace lowbit::model
