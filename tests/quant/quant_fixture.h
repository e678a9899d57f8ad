// Pieces the quantizer tests share: a temporary directory removed with its contents, quantize options that
// calibrate stories260K on the TinyStories excerpt from ../shared, and an artifact's tensor bytes.
#pragma once

#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>

#include "lowbit/quant/pipeline.h"
#include "lowbit/quant/recipe.h"

namespace lowbit::quant::testing {

namespace fs = std::filesystem;

class TempDir {
 public:
  fs::path path = fs::temp_directory_path() / fmt::format("lowbit-quant-test-{}-{}", ::getpid(), next_id()++);
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

 private:
  static int& next_id() {
    static int id = 0;
    return id;
  }
};

// Options that quantize stories260K with `preset`, calibrated on `tokens` tokens of the TinyStories excerpt in
// windows of `ctx`; nullopt when ../shared is not mounted (the caller skips).
inline std::optional<QuantizeOptions> calibrated_stories260k(std::string_view preset_name, int tokens, int ctx) {
  const fs::path dir = fs::path(LOWBIT_SHARED_DIR) / "models/stories260K";
  const fs::path text = fs::path(LOWBIT_SHARED_DIR) / "data/tinystories-valid-excerpt.txt";
  if (!fs::exists(dir / "stories260K.bin") || !fs::exists(text)) return std::nullopt;
  QuantizeOptions o;
  o.source = dir / "stories260K.bin";
  o.tokenizer = dir / "tok512.bin";
  o.recipe = preset(preset_name);
  o.calibration = text;
  o.calib_tokens = tokens;
  o.calib_ctx = ctx;
  return o;
}

// The bytes of a one-shard artifact's tensor file.
inline std::string artifact_tensor_bytes(const fs::path& artifact) {
  std::ifstream in(artifact / "model-00001.safetensors", std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace lowbit::quant::testing
