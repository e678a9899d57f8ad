// Calibration cache (`lowbit quantize --calib-cache DIR`, docs/RECIPES.md): every layer's captured Hessians are
// stored in DIR, one file per layer and pass, under a key that fixes everything they depend on, and a later run
// with the same key reads them instead of running the model.
//
// Key of the first layer: SHA-256 of a JSON object (base_key()) naming the cache format, the lowbit version, the
// pass ("quantize", or "measure" for --target-bpw's full-precision pass), the source files' SHA-256, the
// calibration windows' token ids (which fix the text, the tokenizer, the token count and the context), and the
// rotation fold (on or off, and its seed).
// Key of layer l + 1: SHA-256 of layer l's key, l, and every tensor of layer l as it was stored (name, codec,
// params, array bytes). Later layers calibrate on the already-quantized earlier ones, so whatever changed how an
// earlier layer was quantized (recipe, --target-bpw allocation, rounding method, codec version) changes the key.
//
// File DIR/<pass>-layer-<l>-<key>.lbcal: the 8 bytes "LBCALIB1", the JSON header's length (u64 little-endian),
// the JSON header {"format", "key", "pass", "layer", "hessians": [{"input", "dim", "samples", "layout"}],
// "payload_bytes", "payload_sha256", "seconds"}, then each Hessian as f64 little-endian: its upper triangle row by
// row ("layout": "upper", for an exactly symmetric matrix) or all of it ("full"). Written atomically (temporary
// file, fsync, rename). Read strictly: anything that does not match is an error naming the file and the field,
// and the caller ignores that entry with a warning and calibrates again.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "lowbit/codec/codec.h"
#include "lowbit/quant/calibration.h"

namespace lowbit {
class Sha256;
}

namespace lowbit::quant {

// Widths of a layer's four linear inputs (attn_in, attn_out, ffn_in, ffn_mid), which an entry must match.
using LayerInputDims = std::array<int64_t, 4>;

struct CachedLayer {
  LayerHessians hessians;
  double seconds = 0;  // what computing them took when they were stored
};

class CalibrationCache {
 public:
  // The first layer's key material (see above). `source_sha256` lists the source files' digests in order.
  static nlohmann::json base_key(std::string_view pass, const std::vector<std::string>& source_sha256,
                                 const CalibrationText& text, bool rotate, uint64_t rotation_seed);

  // Creates `dir` when absent.
  CalibrationCache(std::filesystem::path dir, const nlohmann::json& base_key);
  ~CalibrationCache();
  CalibrationCache(CalibrationCache&&) noexcept;
  CalibrationCache& operator=(CalibrationCache&&) noexcept;

  const std::string& key() const { return key_; }  // the current layer's key
  std::filesystem::path entry_path(int64_t layer) const;

  // The current layer's entry; nullopt when there is none. Throws (Errc::format, hash_mismatch, shape, ...) for an
  // entry that is invalid or does not match (key, pass, layer, dims), naming the file and the field.
  std::optional<CachedLayer> read(int64_t layer, const LayerInputDims& dims) const;
  void write(int64_t layer, const LayerHessians& hessians, double seconds) const;

  // Layer `layer`'s tensors as stored, in order; finish_layer() then moves to the next layer's key.
  void add_stored(std::string_view name, std::string_view codec, const codec::EncodedTensor& tensor);
  void finish_layer(int64_t layer);

 private:
  std::filesystem::path dir_;
  std::string pass_;
  std::string key_;
  std::unique_ptr<Sha256> next_;  // the next layer's key, being accumulated
};

struct CalibrationCacheStats {
  int64_t reused = 0, computed = 0, rejected = 0;  // layers
  double seconds_saved = 0, seconds_spent = 0;
};

// Layer-by-layer Hessians for the pipeline: read from the cache where a valid entry exists, otherwise captured by
// a LayerwiseCalibrator, whose hidden states are caught up lazily (layers whose Hessians came from the cache are
// run only when a later layer has to be captured, and then with their weights as the model holds them: quantized).
class CachedCalibrator {
 public:
  CachedCalibrator(model::Model& model, const CalibrationText& text, std::optional<CalibrationCache> cache);
  LayerHessians hessians(int64_t layer);
  // Tell the cache how layer `layer`'s tensors were stored (the next layers' key), then that the layer is done.
  void stored(std::string_view name, std::string_view codec, const codec::EncodedTensor& tensor);
  void finish_layer(int64_t layer);
  const CalibrationCacheStats& stats() const { return stats_; }

 private:
  model::Model& model_;
  const CalibrationText& text_;
  std::optional<CalibrationCache> cache_;
  std::optional<LayerwiseCalibrator> calibrator_;
  int64_t hidden_at_ = 0;  // the layer whose inputs the calibrator's hidden states are
  CalibrationCacheStats stats_;
};

}  // namespace lowbit::quant
