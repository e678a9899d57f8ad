// Models stored in other runtimes' formats (docs/FORMAT.md, "Foreign formats"): the seeds' audio8 mixed bundles
// (seed 001) and Phonon packed-decoder directories (seed 000). Each format is one row of a table: how to recognize
// a directory cheaply, and how to open it with every check its own loader makes. An opened foreign model exposes
// its tensors as lowbit codecs viewing the mapped files, so verify, inspect, import (a lossless copy of the codes
// into a lowbit artifact) and the runtime all share one reader per format and nothing is ever re-quantized.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lowbit/artifact/manifest.h"
#include "lowbit/codec/codec.h"

namespace lowbit::artifact {

class ArtifactWriter;

struct ForeignOpenOptions {
  bool verify_hash = true;  // the format's own hash checks (before use and again after loading, where it has them)
  // Test hook: runs after every record is checked, just before the final "changed while loading" check.
  std::function<void()> before_recheck = nullptr;
};

struct ForeignFile {
  std::filesystem::path path;  // a file of the source directory (config.json, tokenizer.json, ...)
  FileRole role = FileRole::other;
};

struct ForeignModel {
  std::string format;  // the source's own format name and version, e.g. "audio8-mixed-bundle-v2"
  // HF-style config of the language model (what parse_hf_config reads); null when the source carries none.
  nlohmann::json config;
  // Every stored tensor under the name the runtime uses (HF names for the language model), in source order.
  std::vector<std::pair<std::string, codec::TensorRef>> tensors;
  std::vector<std::pair<std::string, std::string>> aliases;  // tied names: alias -> stored tensor's name
  // Parts of the source lowbit does not run (audio towers, ...), by name, so callers can say so.
  std::vector<std::string> unsupported;
  std::vector<ForeignFile> files;  // files an import carries over into the artifact
  // The source files with their hashes; an import stores it as the artifact's provenance.
  Provenance provenance;
  // What the format's loader verified (format, hashes, provenance blocks); an import stores it as the "import"
  // record of recipe.json, whose schema artifact/records.h checks.
  nlohmann::json recipe = nlohmann::json::object();
  std::vector<std::shared_ptr<const void>> keep_alive;  // mapped files the TensorRefs point into

  // The stored tensor an alias names; throws Errc::format when it is not stored.
  const codec::TensorRef& alias_target(const std::string& alias, const std::string& target) const;
};

struct ForeignFormat {
  std::string_view name;
  bool (*recognizes)(const std::filesystem::path& dir);  // reads at most one small manifest; never throws
  ForeignModel (*open)(const std::filesystem::path& dir, const ForeignOpenOptions& options);  // throws lowbit::Error
};

std::span<const ForeignFormat> foreign_formats();

// The format that recognizes `dir`, or nullptr (not a directory, or a lowbit artifact, or unknown).
const ForeignFormat* find_foreign_format(const std::filesystem::path& dir);

// Copies every tensor's arrays (codes, scales, ...) unchanged into `out`, with the config, files and provenance
// (source format, hashes). Aliases are not stored twice: the config's tie_word_embeddings covers the tied head.
void import_foreign(const ForeignModel& model, ArtifactWriter& out);

}  // namespace lowbit::artifact
