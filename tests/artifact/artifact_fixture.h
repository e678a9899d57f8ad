// Shared by the artifact tests: a temporary directory, a valid artifact built from a seeded RNG (dense tensors of
// every dense dtype, offset_scale q4 tensors, config and tokenizer files, sharded over several payloads), and
// helpers to edit its manifest and payloads while keeping the declared sizes and hashes in step.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "lowbit/artifact/manifest.h"
#include "lowbit/artifact/reader.h"
#include "lowbit/artifact/writer.h"
#include "lowbit/codec/codec.h"
#include "lowbit/core/checked.h"
#include "lowbit/core/error.h"
#include "lowbit/core/sha256.h"

namespace lowbit::artifact::testing {

namespace fs = std::filesystem;
using nlohmann::json;

class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "lowbit-artifact-test-XXXXXX").string();
    if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  const fs::path& path() const { return path_; }
  fs::path operator/(const std::string& name) const { return path_ / name; }

 private:
  fs::path path_;
};

inline std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void write_text(const fs::path& path, std::string_view text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
}

inline std::vector<float> random_values(std::mt19937_64& rng, size_t n) {
  std::normal_distribution<float> dist(0.0f, 0.05f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

inline codec::EncodedTensor encode(std::string_view codec_id, const codec::Params& params, const Shape& shape,
                                   const std::vector<float>& values) {
  return codec::codec_or_throw(codec_id, "test").encode(params, shape, values.data(), {});
}

// A quality record as quantize writes it (artifact/records.h), built from the tensors as they are added.
struct QualityReport {
  json tensors = json::array();
  uint64_t weights = 0, bytes = 0;

  void add(ArtifactWriter& w, const std::string& name, const Shape& shape, std::string_view codec_id,
           codec::EncodedTensor encoded) {
    uint64_t stored = 0;
    for (const auto& [role, array] : encoded.arrays) stored += array.bytes.size();
    const double bits = codec::bits_per_weight(codec::codec_or_throw(codec_id, "test"), encoded.params, shape);
    tensors.push_back({{"name", name}, {"shape", shape}, {"codec", codec_id}, {"method", "rtn"},
                       {"bits_per_weight", bits}, {"bytes", stored}, {"proxy_loss", 0.25}, {"rtn_proxy_loss", 0.25},
                       {"rtn_proxy_loss_sampled_rows", 0}, {"guard_tripped", false}});
    weights += checked_numel(shape, name);
    bytes += stored;
    w.add(name, shape, codec_id, std::move(encoded));
  }

  json operator()(uint64_t artifact_bytes) const {
    return {{"quantize",
             {{"tensors", tensors}, {"weights", weights}, {"bytes", bytes},
              {"bits_per_weight", weights ? 8.0 * bytes / weights : 0.0}, {"linear_bits_per_weight", 4.5},
              {"artifact_bytes", artifact_bytes}, {"wall_seconds", 1.5}, {"peak_rss_bytes", 1 << 20},
              {"calibration_tokens", 0}, {"source_quantized", false}, {"allocation", nullptr}, {"fold", nullptr},
              {"calibration_cache", nullptr}}}};
  }
};

// A recipe record as quantize writes it (Recipe::to_json under "quantize").
inline json test_recipe() {
  return {{"quantize",
           {{"name", "test"},
            {"rotate", false},
            {"rules", {{{"match", "layers.*"}, {"codec", "offset_scale"}, {"params", {{"precision", "q4"}}}}}},
            {"default", {{"codec", "dense"}, {"params", {{"dtype", "f32"}}}}}}}};
}

// A valid artifact: 6 tensors over several payload shards, config.json and tokenizer.json, full provenance, and
// the quality and recipe records.
inline Manifest write_valid_artifact(const fs::path& dest, uint64_t seed, WriterOptions options = {.shard_bytes = 3000}) {
  std::mt19937_64 rng(seed);
  ArtifactWriter w(dest, options);
  QualityReport report;
  const std::pair<std::string, Shape> dense[] = {{"embed.weight", {32, 16}}, {"norm.weight", {16}}, {"head.bias", {8, 3}}};
  const char* dtypes[] = {"bf16", "f32", "f16"};
  for (size_t i = 0; i < 3; ++i) {
    const auto& [name, shape] = dense[i];
    const auto values = random_values(rng, static_cast<size_t>(checked_numel(shape, name)));
    report.add(w, name, shape, "dense", encode("dense", {{"dtype", dtypes[i]}}, shape, values));
  }
  for (int layer = 0; layer < 3; ++layer) {
    const Shape shape{16, 64 + 16 * layer};  // the last two need padding to a multiple of 64
    const auto values = random_values(rng, static_cast<size_t>(shape[0] * shape[1]));
    report.add(w, "layers." + std::to_string(layer) + ".weight", shape, "offset_scale",
               encode("offset_scale", {{"precision", "q4"}}, shape, values));
  }
  const json config = {{"model_type", "test"}, {"hidden_size", 16}, {"seed", seed}};
  w.add_file_contents("config.json", FileRole::config, config.dump());
  w.add_file_contents("tokenizer.json", FileRole::tokenizer, R"({"model": {"type": "BPE"}})");
  w.set_config(config);
  Provenance p;
  p.sources.push_back({"model.safetensors", 1234, std::string(64, 'a')});
  p.calibration_sha256 = std::string(64, 'b');
  p.seeds = {{"rng", seed}};
  w.set_provenance(std::move(p));
  w.set_recipe(test_recipe());
  return w.commit(report);
}

// A lowbit artifact of every exportable codec: dense BF16/F16/F32, offset_scale q4/q3/q3_full8.
inline void write_exportable_artifact(const fs::path& dest, uint64_t seed = 11, WriterOptions options = {}) {
  std::mt19937_64 rng(seed);
  ArtifactWriter w(dest, options);
  const auto add = [&](const std::string& name, const Shape& shape, std::string_view codec_id, const json& params) {
    const auto values = random_values(rng, static_cast<size_t>(checked_numel(shape, name)));
    w.add(name, shape, codec_id, encode(codec_id, params, shape, values));
  };
  add("model.embed_tokens.weight", {16, 64}, "offset_scale", {{"precision", "q4"}});
  add("model.layers.0.self_attn.q_proj.weight", {8, 128}, "offset_scale", {{"precision", "q3"}});
  add("model.layers.0.mlp.up_proj.weight", {8, 64}, "offset_scale", {{"precision", "q3_full8"}});
  add("model.norm.weight", {64}, "dense", {{"dtype", "bf16"}});
  add("model.layers.0.input_layernorm.weight", {64}, "dense", {{"dtype", "f32"}});
  add("vision.patch", {3, 3}, "dense", {{"dtype", "f16"}});
  w.set_config({{"model_type", "qwen3"}, {"tie_word_embeddings", true}});
  w.add_file_contents("tokenizer.json", FileRole::tokenizer, R"({"model": {"type": "BPE"}})");
  w.commit();
}

inline json read_manifest(const fs::path& dir) { return json::parse(read_text(dir / kManifestName)); }
// As the writer serializes it, so that an edit keeping every value's length keeps the size quality.json states.
inline void write_manifest(const fs::path& dir, const json& m) { write_text(dir / kManifestName, m.dump(2) + "\n"); }

inline json& file_entry(json& manifest, std::string_view name) {
  for (json& f : manifest["files"])
    if (f["name"] == name) return f;
  throw std::runtime_error("no file entry " + std::string(name));
}

inline json& tensor_entry(json& manifest, std::string_view name) {
  for (json& t : manifest["tensors"])
    if (t["name"] == name) return t;
  throw std::runtime_error("no tensor entry " + std::string(name));
}

// Updates the manifest's size and SHA-256 of a file after the test changed it.
inline void refresh_file_entry(const fs::path& dir, std::string_view name) {
  json m = read_manifest(dir);
  json& f = file_entry(m, name);
  f["size"] = fs::file_size(dir / name);
  f["sha256"] = sha256_file(dir / name);
  write_manifest(dir, m);
}

// A payload split into its header (as JSON) and data section, reassembled by `assemble`.
struct RawSafetensors {
  json header;
  std::string data;

  static RawSafetensors load(const fs::path& path) {
    const std::string bytes = read_text(path);
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    return {json::parse(bytes.substr(8, n)), bytes.substr(8 + n)};
  }
  std::string assemble() const { return assemble_with(header.dump()); }
  // As the writer does: the header padded with spaces to a multiple of 8, so the data stays aligned.
  std::string assemble_with(std::string header_text) const {
    header_text.resize((header_text.size() + 7) / 8 * 8, ' ');
    return assemble_unpadded(header_text);
  }
  std::string assemble_unpadded(const std::string& header_text) const {
    const uint64_t n = header_text.size();
    std::string out(8, '\0');
    std::memcpy(out.data(), &n, 8);
    return out + header_text + data;
  }
};

// Rewrites a payload through `edit` and refreshes its manifest entry, so that only the edit is wrong.
inline void edit_payload(const fs::path& dir, std::string_view file, const std::function<void(RawSafetensors&)>& edit) {
  RawSafetensors raw = RawSafetensors::load(dir / file);
  edit(raw);
  write_text(dir / file, raw.assemble());
  refresh_file_entry(dir, file);
}

// The payload file and key holding a tensor's array of the given role.
inline std::pair<std::string, std::string> array_location(const fs::path& dir, std::string_view tensor,
                                                          std::string_view role) {
  json m = read_manifest(dir);
  for (const json& a : tensor_entry(m, tensor)["arrays"])
    if (a["role"] == role) return {a["file"].get<std::string>(), a["key"].get<std::string>()};
  throw std::runtime_error("no array " + std::string(role));
}

// Runs fn and returns the Errc it throws (Errc::internal with a test failure when it throws nothing).
template <class Fn>
Errc error_of(Fn&& fn, std::string* message = nullptr) {
  try {
    fn();
  } catch (const Error& e) {
    if (message) *message = e.what();
    return e.code();
  }
  ADD_FAILURE() << "no lowbit::Error thrown";
  return Errc::internal;
}

struct CliResult {
  int status = -1;
  std::string out, err;
};

// Runs `lowbit args...` (the binary under test, LOWBIT_CLI) to completion, capturing stdout and stderr.
inline CliResult run_cli(const std::vector<std::string>& args) {
  TempDir tmp;
  std::string cmd = LOWBIT_CLI;
  for (const std::string& a : args) cmd += " '" + a + "'";
  cmd += " >" + (tmp / "out").string() + " 2>" + (tmp / "err").string();
  const int raw = std::system(cmd.c_str());
  return {WIFEXITED(raw) ? WEXITSTATUS(raw) : -1, read_text(tmp / "out"), read_text(tmp / "err")};
}

}  // namespace lowbit::artifact::testing
