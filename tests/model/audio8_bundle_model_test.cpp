// A Qwen3-shaped tiny decoder stored as an audio8 mixed bundle (seed 001) runs straight from the bundle and
// generates exactly the tokens of its lowbit import (and of the artifact it was exported from).
#include <gtest/gtest.h>
#include <unistd.h>

#include <fmt/format.h>

#include <random>

#include "lowbit/artifact/audio8_bundle.h"
#include "lowbit/artifact/foreign.h"
#include "lowbit/artifact/reader.h"
#include "lowbit/artifact/writer.h"
#include "lowbit/core/checked.h"
#include "lowbit/core/thread_pool.h"
#include "lowbit/model/config.h"
#include "lowbit/model/model.h"

namespace lowbit::model {
namespace {

namespace fs = std::filesystem;

// dim 64, 4 heads of 16 (2 KV heads), MLP 128, vocab 64: every matrix has columns a multiple of 64.
ModelConfig qwen3_config() {
  ModelConfig c;
  c.arch = "qwen3";
  c.tied_embeddings = true;
  c.dim = 64;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.hidden_dim = 128;
  c.vocab = 64;
  c.max_seq = 32;
  return c;
}

// Packed linears in every bundle precision, dense norms; the embedding (and tied head) q4.
void write_qwen3_artifact(const fs::path& dest, const ModelConfig& c) {
  std::mt19937_64 rng(21);
  std::normal_distribution<float> normal(0.0f, 0.2f);
  artifact::ArtifactWriter w(dest);
  const auto values = [&](const Shape& shape, float offset) {
    std::vector<float> v(checked_numel(shape, "test"));
    for (float& x : v) x = offset + normal(rng);
    return v;
  };
  const auto packed = [&](const std::string& name, Shape shape, const char* precision) {
    const auto v = values(shape, 0.0f);
    w.add(name, shape, "offset_scale",
          codec::codec_or_throw("offset_scale", "test").encode({{"precision", precision}}, shape, v.data(), {}));
  };
  const auto norm = [&](const std::string& name, int64_t n) {
    const auto v = values({n}, 1.0f);
    w.add(name, {n}, "dense", codec::codec_or_throw("dense", "test").encode({{"dtype", "f32"}}, {n}, v.data(), {}));
  };
  packed("model.embed_tokens.weight", {c.vocab, c.dim}, "q4");
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const auto n = [l](std::string_view s) { return fmt::format("model.layers.{}.{}", l, s); };
    norm(n("input_layernorm.weight"), c.dim);
    norm(n("post_attention_layernorm.weight"), c.dim);
    norm(n("self_attn.q_norm.weight"), c.head_dim);
    norm(n("self_attn.k_norm.weight"), c.head_dim);
    packed(n("self_attn.q_proj.weight"), {c.q_dim(), c.dim}, "q4");
    packed(n("self_attn.k_proj.weight"), {c.kv_dim(), c.dim}, "q3_full8");
    packed(n("self_attn.v_proj.weight"), {c.kv_dim(), c.dim}, "q3");
    packed(n("self_attn.o_proj.weight"), {c.dim, c.q_dim()}, "q4");
    packed(n("mlp.gate_proj.weight"), {c.hidden_dim, c.dim}, "q3_full8");
    packed(n("mlp.up_proj.weight"), {c.hidden_dim, c.dim}, "q4");
    packed(n("mlp.down_proj.weight"), {c.dim, c.hidden_dim}, "q3");
  }
  norm("model.norm.weight", c.dim);
  w.set_config(config_to_hf_json(c));
  w.commit();
}

// Greedy tokens after `prompt`, one decode step at a time, and every step's logits.
std::pair<std::vector<int32_t>, std::vector<float>> greedy(const Model& m, std::vector<int32_t> tokens, int steps) {
  ThreadPool pool(1);
  KvCache cache(m.config, m.config.max_seq);
  std::vector<float> logits(m.config.vocab), all;
  forward(m, cache, tokens, 0, logits.data(), false, pool);
  for (int i = 0; i < steps; ++i) {
    all.insert(all.end(), logits.begin(), logits.end());
    tokens.push_back(static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    forward(m, cache, std::span(&tokens.back(), 1), static_cast<int64_t>(tokens.size()) - 1, logits.data(), false,
            pool);
  }
  return {tokens, all};
}

TEST(Audio8BundleModel, Qwen3BundleGeneratesTheTokensOfItsImport) {
  const fs::path tmp = fs::temp_directory_path() / fmt::format("lowbit_audio8_model_{}", ::getpid());
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  const ModelConfig c = qwen3_config();
  write_qwen3_artifact(tmp / "artifact", c);
  artifact::audio8::export_bundle(artifact::Artifact::open(tmp / "artifact"), tmp / "bundle");
  {
    const artifact::ForeignFormat* format = artifact::find_foreign_format(tmp / "bundle");
    ASSERT_NE(format, nullptr);
    artifact::ArtifactWriter w(tmp / "imported");
    artifact::import_foreign(format->open(tmp / "bundle", {}), w);
    w.commit();
  }
  const auto from_bundle = load_model(tmp / "bundle");
  const auto from_import = load_model(tmp / "imported");
  const auto from_artifact = load_model(tmp / "artifact");
  EXPECT_EQ(from_bundle->config.arch, "qwen3");
  EXPECT_TRUE(from_bundle->desc.layers[0].has(Role::q_norm));
  const std::vector<int32_t> prompt = {1, 5, 9, 2};
  const auto [bundle_tokens, bundle_logits] = greedy(*from_bundle, prompt, 12);
  const auto [import_tokens, import_logits] = greedy(*from_import, prompt, 12);
  const auto [artifact_tokens, artifact_logits] = greedy(*from_artifact, prompt, 12);
  EXPECT_EQ(bundle_tokens, import_tokens);
  EXPECT_EQ(bundle_logits, import_logits);  // same codes, same kernels: bit-identical
  EXPECT_EQ(bundle_tokens, artifact_tokens);
  EXPECT_EQ(bundle_logits, artifact_logits);
  std::set<int32_t> distinct(bundle_tokens.begin() + 4, bundle_tokens.end());
  EXPECT_GT(distinct.size(), 1u) << "a decoder that repeats one token would not test much";
  fs::remove_all(tmp);
}

TEST(Audio8BundleModel, BundleWithoutConfigVerifiesButDoesNotRun) {
  const fs::path tmp = fs::temp_directory_path() / fmt::format("lowbit_audio8_noconfig_{}", ::getpid());
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  write_qwen3_artifact(tmp / "artifact", qwen3_config());
  artifact::audio8::export_bundle(artifact::Artifact::open(tmp / "artifact"), tmp / "bundle");
  fs::remove(tmp / "bundle" / "config.json");
  const auto foreign = artifact::audio8::open(tmp / "bundle", {});
  ASSERT_FALSE(foreign.unsupported.empty());
  EXPECT_NE(foreign.unsupported.back().find("no config.json"), std::string::npos) << foreign.unsupported.back();
  try {
    load_model(tmp / "bundle");
    ADD_FAILURE() << "a bundle without config.json ran";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::unsupported) << e.what();
  }
  fs::remove_all(tmp);
}

}  // namespace
}  // namespace lowbit::model
