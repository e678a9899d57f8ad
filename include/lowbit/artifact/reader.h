// Opens and verifies a lowbit artifact (docs/FORMAT.md, "What a reader checks"). Nothing is used before every
// check has passed: the manifest is parsed strictly, the directory holds exactly the declared files (regular, not
// symlinked, not hard-linked, of the declared size and SHA-256), every payload is a valid safetensors file holding
// exactly the declared arrays, every tensor passes its codec's validation, and after mapping no file has changed.
// Tensors are zero-copy views into the read-only mappings, valid while the Artifact lives.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "lowbit/artifact/manifest.h"
#include "lowbit/codec/codec.h"

namespace lowbit::artifact {

struct ReadOptions {
  bool verify_hash = true;  // SHA-256 of every file; turn off only for trusted local files
  bool paranoid = false;    // also hash every file again after loading
  // Test hook: runs after every file is mapped and checked, just before the final "did anything change" check.
  std::function<void()> before_recheck = nullptr;
};

class Artifact {
 public:
  // Throws lowbit::Error on any failed check (docs/FORMAT.md lists which Errc each check raises).
  static Artifact open(const std::filesystem::path& dir, const ReadOptions& options = {});

  Artifact(Artifact&&) noexcept;
  Artifact& operator=(Artifact&&) noexcept;
  ~Artifact();

  const Manifest& manifest() const;
  const nlohmann::json& config() const { return manifest().config; }
  const Provenance& provenance() const { return manifest().provenance; }
  // The checked records (artifact/records.h): quality.json and recipe.json as parsed, null when the artifact has
  // none.
  const nlohmann::json& quality() const;
  const nlohmann::json& recipe() const;
  const std::filesystem::path& dir() const;

  std::vector<std::string> tensor_names() const;  // in manifest order
  bool contains(std::string_view name) const;
  // The stored tensor: codec, params, logical shape and views of its arrays. Errc::format when absent.
  const codec::TensorRef& tensor(std::string_view name) const;
  // Drops the pages of tensor `name`'s arrays from the resident set (MappedFile::release_pages) once a caller has
  // copied them out; they stay readable.
  void release_pages(std::string_view name) const;

  // Path of a declared file (config.json, a tokenizer file, ...). Errc::missing_file when not declared.
  std::filesystem::path file_path(std::string_view name) const;
  std::vector<std::filesystem::path> files_with_role(FileRole role) const;
  uint64_t total_bytes() const;  // every file, manifest included

  // Checks again that no file changed since it was opened (size, mtime, inode), and with `rehash` that every file
  // still has its SHA-256. Throws Errc::changed.
  void recheck(bool rehash) const;

 private:
  struct Impl;
  explicit Artifact(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace lowbit::artifact
