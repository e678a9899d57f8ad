// The calibration cache: entries round-trip exactly, anything wrong in one is rejected naming file and field,
// and a second quantize reuses every layer and writes the same artifact.
#include "lowbit/quant/calibration_cache.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "lowbit/core/error.h"
#include "lowbit/quant/pipeline.h"
#include "quant/quant_fixture.h"

namespace lowbit::quant {
namespace {

namespace fs = std::filesystem;

using testing::TempDir;

constexpr LayerInputDims kDims{4, 3, 4, 6};

Hessian random_hessian(int64_t dim, std::mt19937_64& rng, bool symmetric) {
  std::normal_distribution<double> n01;
  Hessian h{dim, std::vector<double>(static_cast<size_t>(dim * dim)), 17};
  for (int64_t i = 0; i < dim; ++i)
    for (int64_t j = symmetric ? i : 0; j < dim; ++j) {
      h.h[i * dim + j] = n01(rng);
      if (symmetric) h.h[j * dim + i] = h.h[i * dim + j];
    }
  return h;
}

LayerHessians random_layer(uint64_t seed) {
  std::mt19937_64 rng(seed);
  // ffn_mid not exactly symmetric: stored whole rather than as a triangle.
  return {random_hessian(kDims[0], rng, true), random_hessian(kDims[1], rng, true), random_hessian(kDims[2], rng, true),
          random_hessian(kDims[3], rng, false), {}, {}};  // no experts
}

void expect_same(const LayerHessians& a, const LayerHessians& b) {
  for (auto member :
       {&LayerHessians::attn_in, &LayerHessians::attn_out, &LayerHessians::ffn_in, &LayerHessians::ffn_mid}) {
    EXPECT_EQ((a.*member).dim, (b.*member).dim);
    EXPECT_EQ((a.*member).samples, (b.*member).samples);
    EXPECT_EQ((a.*member).h, (b.*member).h);
  }
}

CalibrationText tiny_text() {
  return {
      {{1, 5, 9, 2}, {1, 7}},
      "0123",
  };
}

template <class Fn>
void expect_rejected(Errc code, std::string_view field, Fn&& fn) {
  try {
    fn();
    FAIL() << "accepted an entry with a bad " << field;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(".lbcal"), std::string::npos) << e.what();
  }
}

TEST(CalibrationCache, EntriesRoundTripExactlyAndKeysChain) {
  TempDir tmp;
  CalibrationCache cache(tmp.path / "cache", CalibrationCache::base_key("quantize", {"ab"}, tiny_text(), false, 0));
  EXPECT_FALSE(cache.read(0, kDims).has_value());
  const LayerHessians h = random_layer(1);
  cache.write(0, h, 1.5);
  const auto back = cache.read(0, kDims);
  ASSERT_TRUE(back.has_value());
  expect_same(back->hessians, h);
  EXPECT_EQ(back->seconds, 1.5);

  // The next layer's key depends on how this layer was stored.
  CalibrationCache other(tmp.path / "cache", CalibrationCache::base_key("quantize", {"ab"}, tiny_text(), false, 0));
  codec::EncodedTensor t;
  t.params = {{"bits", 4}};
  cache.add_stored("model.layers.0.mlp.down_proj.weight", "affine", t);
  cache.finish_layer(0);
  t.params = {{"bits", 3}};
  other.add_stored("model.layers.0.mlp.down_proj.weight", "affine", t);
  other.finish_layer(0);
  EXPECT_NE(cache.key(), other.key());
  // Anything else in the base key changes it too.
  for (const auto& base : {CalibrationCache::base_key("measure", {"ab"}, tiny_text(), false, 0),
                           CalibrationCache::base_key("quantize", {"ac"}, tiny_text(), false, 0),
                           CalibrationCache::base_key("quantize", {"ab"}, tiny_text(), true, 0),
                           CalibrationCache::base_key("quantize", {"ab"}, {{{1, 5, 9, 3}, {1, 7}}, "0123"}, false, 0)})
    EXPECT_NE(
        CalibrationCache(tmp.path / "cache", base).key(),
        CalibrationCache(tmp.path / "cache", CalibrationCache::base_key("quantize", {"ab"}, tiny_text(), false, 0))
            .key());
}

TEST(CalibrationCache, BadEntriesAreRejectedNamingFileAndField) {
  TempDir tmp;
  CalibrationCache cache(tmp.path, CalibrationCache::base_key("quantize", {"ab"}, tiny_text(), false, 0));
  cache.write(2, random_layer(2), 0.25);
  const fs::path entry = cache.entry_path(2);
  std::ifstream in(entry, std::ios::binary);
  const std::string good((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto rewrite = [&](const std::string& bytes) {
    std::ofstream(entry, std::ios::binary | std::ios::trunc) << bytes;
  };

  expect_rejected(Errc::shape, "dim", [&] { cache.read(2, {4, 3, 4, 5}); });
  std::string flipped = good;
  flipped[flipped.size() - 3] ^= 1;
  rewrite(flipped);
  expect_rejected(Errc::hash_mismatch, "payload_sha256", [&] { cache.read(2, kDims); });
  rewrite(good.substr(0, good.size() - 8));
  expect_rejected(Errc::size_mismatch, "payload_bytes", [&] { cache.read(2, kDims); });
  rewrite(good.substr(0, 12));
  expect_rejected(Errc::format, "magic", [&] { cache.read(2, kDims); });
  std::string other_layer = good;
  other_layer.replace(other_layer.find("\"layer\":2"), 9, "\"layer\":3");
  rewrite(other_layer);
  expect_rejected(Errc::format, "layer", [&] { cache.read(2, kDims); });
  // An entry renamed to another key's file is not trusted.
  rewrite(good);
  cache.finish_layer(2);
  fs::copy_file(entry, cache.entry_path(3));
  expect_rejected(Errc::format, "key", [&] { cache.read(3, kDims); });
}

// A second quantize with the same cache reuses every layer and writes byte-identical tensors; a corrupted entry is
// ignored (recomputed), never trusted.
TEST(CalibrationCache, SecondQuantizeReusesEveryLayerAndMatchesByteForByte) {
  std::optional<QuantizeOptions> stories = testing::calibrated_stories260k("affine4", 128, 64);
  if (!stories) GTEST_SKIP() << "stories260K or the TinyStories excerpt absent (../shared not mounted)";
  QuantizeOptions& o = *stories;
  TempDir tmp;
  o.calib_cache = tmp.path / "cache";
  const auto run = [&](const char* name) {
    o.destination = tmp.path / name;
    const QuantizeReport r = quantize(o);
    return std::pair{r, testing::artifact_tensor_bytes(o.destination)};
  };
  const auto [first, first_bytes] = run("first");
  EXPECT_EQ(first.calibration_cache["layers_computed"], 5);
  EXPECT_EQ(first.calibration_cache["layers_reused"], 0);
  const auto [second, second_bytes] = run("second");
  EXPECT_EQ(second.calibration_cache["layers_reused"], 5);
  EXPECT_EQ(second.calibration_cache["layers_computed"], 0);
  EXPECT_TRUE(first_bytes == second_bytes) << "the reused Hessians gave different tensors";

  for (const auto& e : fs::directory_iterator(o.calib_cache.value()))
    if (e.path().filename().string().starts_with("quantize-layer-0003")) {
      std::fstream f(e.path(), std::ios::binary | std::ios::in | std::ios::out);
      f.seekp(-5, std::ios::end);
      f.put('\x7f');
    }
  const auto [third, third_bytes] = run("third");
  EXPECT_EQ(third.calibration_cache["entries_rejected"], 1);
  EXPECT_EQ(third.calibration_cache["layers_reused"], 4);
  EXPECT_TRUE(first_bytes == third_bytes);
}

}  // namespace
}  // namespace lowbit::quant
