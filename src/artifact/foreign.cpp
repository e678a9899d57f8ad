// The table of foreign formats and the one lossless import every format shares.
#include "lowbit/artifact/foreign.h"

#include <algorithm>
#include <array>

#include "lowbit/artifact/audio8_bundle.h"
#include "lowbit/artifact/phonon.h"
#include "lowbit/artifact/writer.h"
#include "lowbit/core/error.h"

namespace lowbit::artifact {

namespace {

// One row per format; a format's file defines its row (name, recognizer, opener).
const ForeignFormat kFormats[] = {
    {"audio8-mixed-bundle", audio8::recognizes, audio8::open},
    {phonon::kFormatName, phonon::recognizes, phonon::open},
};

TensorBuffer copy_array(const TensorView& view) {
  TensorBuffer out;
  out.dtype = view.dtype;
  out.shape = view.shape;
  out.bytes.assign(view.bytes.begin(), view.bytes.end());
  return out;
}

bool is_tied_head(const ForeignModel& model, const std::string& alias, const std::string& target) {
  return alias == "lm_head.weight" && target == "model.embed_tokens.weight" && model.config.is_object();
}

}  // namespace

const codec::TensorRef& ForeignModel::alias_target(const std::string& alias, const std::string& target) const {
  const auto it = std::find_if(tensors.begin(), tensors.end(), [&](const auto& t) { return t.first == target; });
  if (it == tensors.end()) fail(Errc::format, "[{}] alias '{}' names '{}', which is not stored", format, alias, target);
  return it->second;
}

std::span<const ForeignFormat> foreign_formats() { return kFormats; }

const ForeignFormat* find_foreign_format(const std::filesystem::path& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return nullptr;
  for (const ForeignFormat& f : kFormats)
    if (f.recognizes(dir)) return &f;
  return nullptr;
}

void import_foreign(const ForeignModel& model, ArtifactWriter& out) {
  const auto add = [&](const std::string& name, const codec::TensorRef& ref) {
    codec::EncodedTensor t;
    t.params = ref.params;
    for (const auto& [role, view] : ref.arrays.items) t.arrays.emplace_back(role, copy_array(view));
    out.add(name, ref.shape, ref.codec->id, std::move(t));
  };
  for (const auto& [name, ref] : model.tensors) add(name, ref);
  nlohmann::json config = model.config.is_null() ? nlohmann::json::object() : model.config;
  for (const auto& [alias, target] : model.aliases) {
    if (is_tied_head(model, alias, target)) {
      config["tie_word_embeddings"] = true;  // the runtime ties the head to the embedding: no second copy
      continue;
    }
    add(alias, model.alias_target(alias, target));
  }
  out.set_config(std::move(config));
  for (const ForeignFile& f : model.files) out.add_file(f.path, f.role);
  out.set_provenance(model.provenance);
  out.set_recipe({{"import", model.recipe}});
}

}  // namespace lowbit::artifact
