// Writes a lowbit artifact (docs/FORMAT.md) atomically: tensors are added one at a time and their arrays go to
// disk at once (scratch files of the current payload shard, joined into a safetensors file once it reaches the
// shard limit), so memory holds the tensor in flight and the manifest, whatever the artifact's size. Everything
// goes into a staging directory beside the destination (".<name>.lowbit-staging-<pid>-<random>"); commit() writes
// the manifest, fsyncs every file and the directory, and renames the staging directory into place. Until commit()
// returns the destination is untouched; if the writer is destroyed without commit() (an error, an exception) the
// staging directory is removed. A staging directory left by a killed process is removed by the next writer into
// the same parent directory (lowbit/core/staged_dir.h, shared by every writer). With force, an existing
// destination is replaced only when it opens as a lowbit artifact.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "lowbit/artifact/manifest.h"
#include "lowbit/codec/codec.h"
#include "lowbit/core/tensor.h"

namespace lowbit::artifact {

inline constexpr uint64_t kDefaultShardBytes = 2ull << 30;

struct WriterOptions {
  uint64_t shard_bytes = kDefaultShardBytes;  // a shard is cut before it would grow past this (>= 1)
  bool force = false;                         // replace an existing artifact at the destination
};

class ArtifactWriter {
 public:
  // Cleans stale staging directories in the destination's parent and creates a fresh one. Throws Errc::exists
  // when the destination exists and !options.force.
  ArtifactWriter(std::filesystem::path destination, WriterOptions options = {});
  ~ArtifactWriter();  // removes the staging directory unless commit() succeeded
  ArtifactWriter(const ArtifactWriter&) = delete;
  ArtifactWriter& operator=(const ArtifactWriter&) = delete;

  // Adds an encoded tensor of the given codec and logical shape; it is validated (codec::validate_tensor) so that
  // nothing a reader would reject is written, and its arrays are written to the staging directory at once.
  void add(std::string name, const Shape& shape, std::string_view codec_id, codec::EncodedTensor tensor);
  // Adds a dense tensor (F32, F16 or BF16), stored as it is with codec "dense". The bytes are copied.
  void add_dense(std::string name, const TensorView& tensor);
  // Copies a file into the artifact (config.json, tokenizer files, ...), fsynced and hashed. `name` defaults to
  // the source's file name.
  void add_file(const std::filesystem::path& source, FileRole role, std::string name = {});
  // Writes a file of the given contents into the artifact (e.g. a config.json generated in memory).
  void add_file_contents(std::string name, FileRole role, std::string_view contents);

  void set_config(nlohmann::json config);
  void set_provenance(Provenance provenance);
  // The recipe record (artifact/records.h), written as recipe.json with role "recipe".
  void set_recipe(const nlohmann::json& recipe);

  // Writes the last shard and the manifest, fsyncs, and publishes the directory at the destination (replacing
  // the existing artifact atomically when forced). Returns the manifest as written. `quality`, when given, returns
  // the quality record (artifact/records.h) for an artifact of `artifact_bytes` bytes in all (every file,
  // quality.json and the manifest included): it is called until the size it is given is the size its record
  // makes, and the record is written as quality.json with role "quality". The records are checked as a reader
  // checks them before anything is published.
  const Manifest& commit(const std::function<nlohmann::json(uint64_t artifact_bytes)>& quality = {});

  const std::filesystem::path& staging_dir() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lowbit::artifact
