// GGUF models: a tiny llama file built in memory loads with the right config, names and values; the Qwen3
// vocabulary carried the way GGUF embeds it (tokens, token types, merges, pre "qwen2") encodes like the
// tokenizer.json fixture.
#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>

#include "io/gguf_builder.h"
#include "lowbit/codec/codec.h"
#include "lowbit/core/dtype.h"
#include "lowbit/core/error.h"
#include "lowbit/core/sha256.h"
#include "lowbit/core/thread_pool.h"
#include "lowbit/model/cuda_model.h"
#include "lowbit/model/gguf_model.h"
#include "lowbit/model/gguf_tensors.h"
#include "model/tiny_model.h"

namespace lowbit::model {
namespace {

namespace fs = std::filesystem;
using io::GgmlType;
using io::GgufBuilder;
using io::GgufValueType;

fs::path write_temp(const std::vector<uint8_t>& image, const std::string& name) {
  auto path = fs::temp_directory_path() / (name + "_" + std::to_string(::getpid()) + ".gguf");
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(image.data()), static_cast<std::streamsize>(image.size()));
  return path;
}

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * 4);
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

// Q8_0 blocks whose element i is (i % 7 - 3) * 0.5.
std::vector<uint8_t> q8_bytes(size_t n) {
  std::vector<uint8_t> out;
  for (size_t b = 0; b < n / 32; ++b) {
    const uint16_t d = f32_to_f16(0.5f);
    out.push_back(static_cast<uint8_t>(d & 0xFF));
    out.push_back(static_cast<uint8_t>(d >> 8));
    for (size_t j = 0; j < 32; ++j) out.push_back(static_cast<uint8_t>(static_cast<int8_t>((b * 32 + j) % 7) - 3));
  }
  return out;
}

constexpr uint64_t kDim = 64, kHidden = 96, kVocab = 32, kHeads = 4, kKvHeads = 2, kKvDim = kDim / kHeads * kKvHeads;

// A llama with `layers` layers of tensors and block_count metadata `block_count` (one of each by default):
// Q8_0 matrices, f32 norms, tied embeddings.
GgufBuilder tiny_llama(uint32_t block_count = 1, int layers = 1) {
  const uint64_t dim = kDim, hidden = kHidden, vocab = kVocab, kv_dim = kKvDim;
  GgufBuilder g;
  g.kv_string("general.architecture", "llama");
  g.kv_scalar<uint32_t>("llama.embedding_length", GgufValueType::u32, dim);
  g.kv_scalar<uint32_t>("llama.block_count", GgufValueType::u32, block_count);
  g.kv_scalar<uint32_t>("llama.feed_forward_length", GgufValueType::u32, hidden);
  g.kv_scalar<uint32_t>("llama.attention.head_count", GgufValueType::u32, kHeads);
  g.kv_scalar<uint32_t>("llama.attention.head_count_kv", GgufValueType::u32, kKvHeads);
  g.kv_scalar<uint32_t>("llama.context_length", GgufValueType::u32, 256);
  g.kv_scalar<float>("llama.rope.freq_base", GgufValueType::f32, 100000.0f);
  g.kv_scalar<float>("llama.attention.layer_norm_rms_epsilon", GgufValueType::f32, 1e-6f);
  const std::vector<float> norm(dim, 1.0f);
  g.tensor("token_embd.weight", {dim, vocab}, GgmlType::Q8_0, q8_bytes(dim * vocab));
  g.tensor("output_norm.weight", {dim}, GgmlType::F32, f32_bytes(norm));
  for (int l = 0; l < layers; ++l) {
    const auto blk = [l](const char* name) { return "blk." + std::to_string(l) + "." + name; };
    g.tensor(blk("attn_norm.weight"), {dim}, GgmlType::F32, f32_bytes(norm));
    g.tensor(blk("ffn_norm.weight"), {dim}, GgmlType::F32, f32_bytes(norm));
    g.tensor(blk("attn_q.weight"), {dim, dim}, GgmlType::Q8_0, q8_bytes(dim * dim));
    g.tensor(blk("attn_k.weight"), {dim, kv_dim}, GgmlType::Q8_0, q8_bytes(dim * kv_dim));
    g.tensor(blk("attn_v.weight"), {dim, kv_dim}, GgmlType::Q8_0, q8_bytes(dim * kv_dim));
    g.tensor(blk("attn_output.weight"), {dim, dim}, GgmlType::Q8_0, q8_bytes(dim * dim));
    g.tensor(blk("ffn_gate.weight"), {dim, hidden}, GgmlType::Q8_0, q8_bytes(dim * hidden));
    g.tensor(blk("ffn_up.weight"), {dim, hidden}, GgmlType::Q8_0, q8_bytes(dim * hidden));
    g.tensor(blk("ffn_down.weight"), {hidden, dim}, GgmlType::Q8_0, q8_bytes(dim * hidden));
  }
  return g;
}

std::unique_ptr<Model> load_image(const GgufBuilder& g, const std::string& name) {
  const auto path = write_temp(g.build(), name);
  try {
    auto model = load_gguf_model(path);
    fs::remove(path);
    return model;
  } catch (...) {
    fs::remove(path);
    throw;
  }
}

TEST(GgufModel, TinyLlamaLoadsWithConfigNamesAndValues) {
  const uint64_t dim = kDim, kv_dim = kKvDim;
  const auto model = load_image(tiny_llama(), "lowbit_tiny_llama");

  const ModelConfig& c = model->config;
  EXPECT_EQ(c.arch, "llama");
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.n_heads, 4);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.hidden_dim, 96);
  EXPECT_EQ(c.vocab, 32);
  EXPECT_EQ(c.max_seq, 256);
  EXPECT_EQ(c.rope_theta, 100000.0);
  EXPECT_EQ(c.norm_eps, 1e-6f);
  EXPECT_EQ(c.rope_style, RopeStyle::interleaved);
  EXPECT_TRUE(c.tied_embeddings);
  const NamedTensor* k = model->find("model.layers.0.self_attn.k_proj.weight");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->ref.shape, (Shape{static_cast<int64_t>(kv_dim), static_cast<int64_t>(dim)}));
  const auto values = codec::decode_all(k->ref);
  for (size_t i = 0; i < values.size(); ++i) ASSERT_EQ(values[i], static_cast<float>(static_cast<int>(i % 7) - 3) * 0.5f) << i;
}

// The tied Q8_0 token embedding is one packed kernel serving both the row lookup and the LM head: not a dense
// f32 matrix (4 bytes a weight; affine 8-bit g32, its biases -128 scale left out, reads 8.5 bits as the file does)
// and not prepared twice. Its gathered rows are the Q8_0 values exactly.
TEST(GgufModel, TiedQ8EmbeddingIsOnePackedKernelForLookupAndHead) {
  const auto model = load_image(tiny_llama(), "lowbit_tiny_llama_tied");
  ASSERT_TRUE(model->config.tied_embeddings);
  EXPECT_EQ(model->find(std::string(kEmbedTensor))->ref.codec->id, "affine");
  EXPECT_EQ(model->lm_head.get(), model->embed.get());
  EXPECT_EQ(model->lm_head->weight_bytes(), kVocab * kDim * 17 / 16);
  std::vector<int32_t> ids(kVocab);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
  std::vector<float> rows(kVocab * kDim);
  model->embed->gather_rows(ids, rows.data());
  for (size_t i = 0; i < rows.size(); ++i)
    ASSERT_EQ(rows[i], static_cast<float>(static_cast<int>(i % 7) - 3) * 0.5f) << i;
}

// Llama-3.1-style divisors by HF's llama3 rule: factor 8, band between wavelengths 8192/4 and 8192.
std::vector<float> llama3_divisors(double theta, int head_dim) {
  std::vector<float> out;
  for (int i = 0; i < head_dim / 2; ++i) {
    const double wavelen = 2 * M_PI * std::pow(theta, 2.0 * i / head_dim);
    const double smooth = (8192 / wavelen - 1) / 3;
    out.push_back(static_cast<float>(wavelen < 2048 ? 1.0 : wavelen > 8192 ? 8.0 : 1 / ((1 - smooth) / 8 + smooth)));
  }
  return out;
}

TEST(GgufModel, RopeFreqsTensorBecomesLlama3Scaling) {
  auto g = tiny_llama();
  const auto divisors = llama3_divisors(100000.0, kDim / kHeads);
  ASSERT_GT(divisors.back(), 1.0f);  // the test covers scaled frequencies
  g.tensor("rope_freqs.weight", {divisors.size()}, GgmlType::F32, f32_bytes(divisors));
  const auto model = load_image(g, "lowbit_rope_freqs");
  EXPECT_EQ(model->config.rope_scaling.kind, RopeScaling::Kind::llama3);
  EXPECT_EQ(model->config.rope_scaling.factor, 8.0);
  EXPECT_EQ(model->config.rope_scaling.original_max_position, 8192);

  auto bad = tiny_llama();
  auto wrong = divisors;
  wrong[0] = 3.0f;
  bad.tensor("rope_freqs.weight", {wrong.size()}, GgmlType::F32, f32_bytes(wrong));
  try {
    load_image(bad, "lowbit_rope_freqs_bad");
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::unsupported);
  }
}

TEST(GgufModel, UnknownArchitectureIsRejected) {
  GgufBuilder g;
  g.kv_string("general.architecture", "gpt-neox");
  const auto path = write_temp(g.build(), "lowbit_neox");
  try {
    load_gguf_model(path);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::unsupported);
    const std::string what = e.what();
    for (const std::string& part : {path.string(), std::string("general.architecture"), std::string("gpt-neox"),
                                   std::string("llama, mistral, qwen2, qwen3")})
      EXPECT_NE(what.find(part), std::string::npos) << what;
  }
  fs::remove(path);
}

TEST(GgufModel, LlamaAttentionBiasesAreReadWhenPresent) {
  auto g = tiny_llama();
  const std::vector<float> q_bias(kDim, 0.5f), kv_bias(kKvDim, -0.25f);
  g.tensor("blk.0.attn_q.bias", {kDim}, GgmlType::F32, f32_bytes(q_bias));
  g.tensor("blk.0.attn_k.bias", {kKvDim}, GgmlType::F32, f32_bytes(kv_bias));
  g.tensor("blk.0.attn_v.bias", {kKvDim}, GgmlType::F32, f32_bytes(kv_bias));
  const auto model = load_image(g, "lowbit_llama_bias");
  EXPECT_TRUE(model->config.qkv_bias);
  EXPECT_EQ(model->layers[0].vector(Role::q_bias), q_bias);
  EXPECT_EQ(model->layers[0].vector(Role::v_bias), kv_bias);
  EXPECT_FALSE(load_image(tiny_llama(), "lowbit_llama_no_bias")->config.qkv_bias);
}

// issue 18: block_count one less than the layers present used to run with the last layer dropped.
TEST(GgufModel, BlockCountMustMatchTheLayers) {
  EXPECT_EQ(load_image(tiny_llama(2, 2), "lowbit_two_blocks")->config.n_layers, 2);
  const auto refused = [](const GgufBuilder& g, const std::string& tensor, const char* why) {
    try {
      load_image(g, "lowbit_block_count");
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::format);
      EXPECT_EQ(exit_code(e.code()), 3);
      const std::string what = e.what();
      EXPECT_NE(what.find("'" + tensor + "'"), std::string::npos) << what;
      EXPECT_NE(what.find(why), std::string::npos) << what;
    }
  };
  refused(tiny_llama(1, 2), "blk.1.attn_norm.weight", "no place");  // a layer beyond block_count
  refused(tiny_llama(3, 2), "blk.2.attn_norm.weight", "missing");   // block_count beyond the layers
}

TEST(GgufModel, EmbeddedGpt2TokenizerMatchesQwen3Fixture) {
  const fs::path tokenizer = fs::path(LOWBIT_SHARED_DIR) / "tokenizers/qwen3/tokenizer.json";
  if (!fs::exists(tokenizer)) GTEST_SKIP() << tokenizer << " absent (../shared not mounted)";
  const auto hf = nlohmann::json::parse(std::ifstream(tokenizer));
  std::vector<std::string> tokens(hf.at("model").at("vocab").size() + hf.at("added_tokens").size());
  std::vector<int32_t> types(tokens.size(), 1);
  for (const auto& [text, id] : hf.at("model").at("vocab").items()) tokens.at(id.get<size_t>()) = text;
  for (const auto& added : hf.at("added_tokens")) {
    const auto id = added.at("id").get<size_t>();
    tokens.at(id) = added.at("content").get<std::string>();
    types.at(id) = added.at("special").get<bool>() ? 3 : 4;
  }
  std::vector<std::string> merges;
  for (const auto& m : hf.at("model").at("merges")) merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
  GgufBuilder g;
  g.kv_string("tokenizer.ggml.model", "gpt2");
  g.kv_string("tokenizer.ggml.pre", "qwen2");
  g.kv_strings("tokenizer.ggml.tokens", tokens);
  g.kv_array<int32_t>("tokenizer.ggml.token_type", GgufValueType::i32, types);
  g.kv_strings("tokenizer.ggml.merges", merges);
  g.kv_scalar<uint32_t>("tokenizer.ggml.eos_token_id", GgufValueType::u32, 151645);
  const auto image = g.build();
  const auto file = io::GgufFile::from_bytes(std::as_bytes(std::span(image)), "qwen3.gguf");
  const auto tok = gguf_tokenizer(file);
  EXPECT_EQ(tok->eos_ids().front(), 151645);
  const auto fixture =
      nlohmann::json::parse(std::ifstream(fs::path(LOWBIT_SOURCE_DIR) / "tests/model/fixtures/tokenizer_qwen3.json"));
  for (const auto& [name, text] : fixture.at("texts").items())
    EXPECT_EQ(tok->encode(text.get<std::string>(), false, true),
              fixture.at("expected").at(name).at("ids").get<std::vector<int32_t>>())
        << name;
}


// tests/model/fixtures/gguf_quant/: the llama family fixture quantized by llama.cpp's llama-quantize to each
// 32-block type, with llama.cpp's logits (scripts/make_gguf_quant_fixtures.sh).
// Of the largest |logit| (about 11 here). llama.cpp rounds the activations to 8 bits per block of 32 (Q8_0/Q8_1)
// before each quantized matmul and keeps its KV cache in f16, lowbit keeps both f32: measured 2026-12-04 the
// differences were 2.3% (Q4_0, Q8_0), 2.7% (Q4_1), 4.3% (Q5_0), 2.5% (Q5_1, IQ4_NL) of it, against 0.13% for the
// same model in F32 (only the f16 KV cache then differs).
constexpr double kLlamaCppTolerance = 0.06;
const fs::path kQuantFixtures = fs::path(LOWBIT_SOURCE_DIR) / "tests/model/fixtures/gguf_quant";

std::vector<float> stepwise_logits(const Model& m, const std::vector<int32_t>& tokens) {
  ThreadPool pool(2);
  return testing::stepwise_logits(m, tokens, pool);
}

class GgufPacked : public ::testing::TestWithParam<std::string> {};

// Every matrix of a llama.cpp-quantized file loads as affine (not dense f32; IQ4_NL, which has no lowbit codec
// yet, as dense f32), its decoded weights are ggml's dequantized ones bit for bit, and the logits equal the
// dequantized-f32 load's and llama.cpp's own within tolerance.
TEST_P(GgufPacked, LoadsAsAffineWithTheDequantizedLogitsAndLlamaCpps) {
  const std::string type = GetParam();
  const bool affine = type != "IQ4_NL";
  const fs::path path = kQuantFixtures / ("model." + type + ".gguf");
  const auto packed = load_gguf_model(path);
  const auto dense = load_gguf_model(path, {}, GgufWeights::dequantized);
  int matrices = 0;
  for (const NamedTensor& t : packed->tensors) {
    if (t.ref.shape.size() != 2) continue;  // the norm gains stay f32
    ++matrices;
    EXPECT_EQ(t.ref.codec->id, affine ? "affine" : "dense") << t.name;
    if (affine) {
      EXPECT_EQ(t.ref.params.at("group_size"), 32) << t.name;
      EXPECT_EQ(t.ref.params.at("scale_dtype"), "f16") << t.name;
    }
    const NamedTensor* d = dense->find(t.name);
    ASSERT_NE(d, nullptr) << t.name;
    EXPECT_EQ(d->ref.codec->id, "dense") << t.name;
    EXPECT_TRUE(codec::decode_all(t.ref) == codec::decode_all(d->ref)) << t.name << ": not ggml's values bit for bit";
  }
  EXPECT_EQ(matrices, 16);  // every matrix of the two layers, embedding and output: --pure

  const auto fixture = nlohmann::json::parse(std::ifstream(kQuantFixtures / "llamacpp_logits.json"));
  const auto tokens = fixture.at("tokens").get<std::vector<int32_t>>();
  const auto got = stepwise_logits(*packed, tokens);
  const auto want = stepwise_logits(*dense, tokens);
  const auto& llama = fixture.at("models").at(type);
  ASSERT_EQ(llama.size(), tokens.size());
  const size_t vocab = static_cast<size_t>(packed->config.vocab);
  double max_vs_dense = 0, max_vs_llama = 0, scale = 0;
  for (size_t p = 0; p < tokens.size(); ++p)
    for (size_t v = 0; v < vocab; ++v) {
      const double g = got[p * vocab + v];
      scale = std::max(scale, std::abs(static_cast<double>(want[p * vocab + v])));
      max_vs_dense = std::max(max_vs_dense, std::abs(g - want[p * vocab + v]));
      max_vs_llama = std::max(max_vs_llama, std::abs(g - llama[p][v].get<double>()));
    }
  ASSERT_GT(scale, 0.1);  // the logits are not degenerate
  // The batch-1 affine kernels round each activation to a 16-bit integer per group (docs/CODECS.md, row-block
  // layout), 1.5e-5 of the group's largest |x|; through two layers that measured up to 1.5e-4 of the largest logit.
  EXPECT_LE(max_vs_dense, 5e-4 * scale) << type;
  // llama.cpp rounds the activations to 8 bits (Q8_0/Q8_1) before each quantized matmul; lowbit keeps them f32.
  EXPECT_LE(max_vs_llama, kLlamaCppTolerance * scale) << type;
}

// Loaded for the CPU only, the embedding lookup gathers ggml's dequantized rows bit for bit, the LM head stays
// packed, every stored array an affine kernel copied is released (IQ4_NL's dense f32 matrices are read in place
// and stay), the logits are the default load's exactly, and the CUDA upload is refused instead of reading nothing.
TEST_P(GgufPacked, CpuOnlyLoadGathersGgmlRowsAndReleasesTheCopiedArrays) {
  const std::string type = GetParam();
  const bool affine = type != "IQ4_NL";
  const fs::path path = kQuantFixtures / ("model." + type + ".gguf");
  const auto cpu = load_gguf_model(path, {.cpu_only = true});
  const auto packed = load_gguf_model(path);
  const auto dense = load_gguf_model(path, {}, GgufWeights::dequantized);
  const int64_t vocab = cpu->config.vocab, dim = cpu->config.dim;

  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
  std::vector<float> rows(static_cast<size_t>(vocab * dim));
  cpu->embed->gather_rows(ids, rows.data());
  EXPECT_TRUE(rows == codec::decode_all(dense->find(std::string(kEmbedTensor))->ref)) << "not ggml's rows bit for bit";
  if (affine) {
    EXPECT_LT(cpu->lm_head->weight_bytes(), static_cast<uint64_t>(vocab * dim * 4) / 3) << "the head is dense";
  }

  for (const NamedTensor& t : cpu->tensors)
    EXPECT_EQ(t.ref.arrays.items.empty(), affine || t.ref.shape.size() == 1) << t.name;
  const auto tokens = nlohmann::json::parse(std::ifstream(kQuantFixtures / "llamacpp_logits.json"))
                          .at("tokens")
                          .get<std::vector<int32_t>>();
  EXPECT_TRUE(stepwise_logits(*cpu, tokens) == stepwise_logits(*packed, tokens));
  try {
    use_device(*cpu, "cuda");
    ADD_FAILURE() << "use_device cuda accepted a model without its stored arrays";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::usage);
    EXPECT_NE(std::string(e.what()).find("cpu_only"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(LlamaQuantize, GgufPacked, ::testing::Values("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL"));

// tests/model/fixtures/gguf_quant/wide/: a random llama with 256-wide rows quantized by llama-quantize's mixed
// recipes (Q4_K_M, Q2_K; IQ1_S, IQ1_M, IQ2_XS, IQ3_XXS, IQ4_XS with an importance matrix), with the SHA-256 of ggml's
// own dequantization of every tensor, llama.cpp's logits on each file, and llama.cpp's logits on an f32 copy of each
// holding ggml's dequantized values (scripts/make_gguf_quant_fixtures.sh).
const fs::path kWideFixtures = kQuantFixtures / "wide";

// Both of the largest |logit| (12.7 to 15.7 here), measured 2026-12-05 (Q2_K 2026-12-06) against the llama.cpp of
// llama-cpp-python 0.3.36. On the quantized files llama.cpp rounds the activations to 8 bits per block of 256 (Q8_K)
// before each quantized matmul, lowbit keeps them f32: 1.1% (IQ2_XS), 1.2% (Q2_K), 1.3% (IQ1_S), 1.5% (Q4_K_M), 1.7%
// (IQ4_XS), 1.8% (IQ3_XXS), 2.1% (IQ1_M) apart, and llama.cpp's own quantized and f32 runs of the same weights differ
// by the same amounts (to 0.01%), so that is all llama.cpp's rounding. On the f32 copies (no activation rounding; only
// llama.cpp's f16 KV cache differs) they agree to 0.030% .. 0.039%.
constexpr double kLlamaCppWideTolerance = 0.04;
constexpr double kLlamaCppF32Tolerance = 2e-3;

class GgufWide : public ::testing::TestWithParam<std::string> {};

// Every quantized tensor dequantizes to ggml's values bit for bit (its f32 bytes hash as ggml's do), the model
// loads and runs, and its logits are the dequantized load's, llama.cpp's on the same f32 weights and llama.cpp's
// on the quantized file within tolerance.
TEST_P(GgufWide, DequantizesAsGgmlAndGivesLlamaCppsLogits) {
  const std::string type = GetParam();
  const fs::path path = kWideFixtures / ("model." + type + ".gguf");
  const auto file = io::GgufFile::open(path);
  const auto digests = nlohmann::json::parse(std::ifstream(kWideFixtures / "ggml_dequant.json")).at(type);
  size_t quantized = 0;
  for (const io::GgufTensorInfo& t : file.header().tensors) {
    const auto* info = io::ggml_type_info(static_cast<uint32_t>(t.type));
    if (info->block_elems == 1) continue;  // the f32 norm gains
    ++quantized;
    ASSERT_TRUE(digests.contains(t.name)) << t.name;
    EXPECT_EQ(info->name, digests.at(t.name).at("type").get<std::string>()) << t.name;
    const auto values = file.dequantize(t);
    EXPECT_EQ(sha256_hex(std::as_bytes(std::span(values))), digests.at(t.name).at("sha256").get<std::string>())
        << t.name << " (" << info->name << "): not ggml's values bit for bit";
  }
  EXPECT_EQ(quantized, 9u);  // every matrix of the layer, the embedding and the output
  EXPECT_EQ(quantized, digests.size());

  const auto model = load_gguf_model(path);
  const auto dense = load_gguf_model(path, {}, GgufWeights::dequantized);
  const auto tokens = nlohmann::json::parse(std::ifstream(kWideFixtures / "llamacpp_logits.json"))
                          .at("tokens")
                          .get<std::vector<int32_t>>();
  const auto got = stepwise_logits(*model, tokens);
  const auto want = stepwise_logits(*dense, tokens);
  const size_t vocab = static_cast<size_t>(model->config.vocab);
  double scale = 0, max_vs_dense = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    scale = std::max(scale, std::abs(static_cast<double>(want[i])));
    max_vs_dense = std::max(max_vs_dense, std::abs(static_cast<double>(got[i]) - want[i]));
  }
  ASSERT_GT(scale, 0.1);                          // the logits are not degenerate
  EXPECT_LE(max_vs_dense, 5e-4 * scale) << type;  // packed kernels round activations (GgufPacked)
  for (const auto& [json, tolerance] : {std::pair{"llamacpp_logits.json", kLlamaCppWideTolerance},
                                        std::pair{"llamacpp_logits_f32.json", kLlamaCppF32Tolerance}}) {
    const auto fixture = nlohmann::json::parse(std::ifstream(kWideFixtures / json));
    ASSERT_EQ(fixture.at("tokens").get<std::vector<int32_t>>(), tokens) << json;
    const auto& llama = fixture.at("models").at(type);
    ASSERT_EQ(llama.size(), tokens.size()) << json;
    double max_diff = 0;
    for (size_t p = 0; p < tokens.size(); ++p)
      for (size_t v = 0; v < vocab; ++v)
        max_diff = std::max(max_diff, std::abs(got[p * vocab + v] - llama[p][v].get<double>()));
    std::printf("%s %s: max |lowbit - llama.cpp| %.4g, %.3g%% of the largest logit %.4g\n", type.c_str(), json,
                max_diff, 100 * max_diff / scale, scale);
    EXPECT_LE(max_diff, tolerance * scale) << type << " " << json;
  }
}

// Q2_K .. Q6_K matrices load packed, as affine 4/5 bits in groups of 32 and 2/3/6 bits in groups of 16 with f32
// metadata, and decode to ggml's values (as f32 compare them: ggml's (d sc) * 0 may be -0 where scale q + bias gives
// +0); the IQ types are dequantized.
TEST_P(GgufWide, AffineKQuantsLoadPackedWithGgmlsValues) {
  const fs::path path = kWideFixtures / ("model." + GetParam() + ".gguf");
  const auto file = io::GgufFile::open(path);
  std::map<io::GgmlType, int> file_types;
  for (const io::GgufTensorInfo& t : file.header().tensors) ++file_types[t.type];
  const auto packed = load_gguf_model(path);
  const auto dense = load_gguf_model(path, {}, GgufWeights::dequantized);
  int affine = 0;
  for (const NamedTensor& t : packed->tensors) {
    if (t.ref.shape.size() != 2 || t.ref.codec->id != "affine") continue;
    ++affine;
    const int bits = t.ref.params.at("bits").get<int>();
    EXPECT_TRUE(bits >= 2 && bits <= 6) << t.name;
    EXPECT_EQ(t.ref.params.at("group_size"), bits == 4 || bits == 5 ? 32 : 16) << t.name;
    const NamedTensor* d = dense->find(t.name);
    ASSERT_NE(d, nullptr) << t.name;
    EXPECT_TRUE(codec::decode_all(t.ref) == codec::decode_all(d->ref)) << t.name << ": not ggml's values bit for bit";
  }
  int k_types = 0;
  std::string counts;
  for (const auto type :
       {io::GgmlType::Q2_K, io::GgmlType::Q3_K, io::GgmlType::Q4_K, io::GgmlType::Q5_K, io::GgmlType::Q6_K}) {
    k_types += file_types[type];
    counts.append(" ").append(io::ggml_type_info(static_cast<uint32_t>(type))->name);
    counts.append(" ").append(std::to_string(file_types[type]));
  }
  std::printf("%s: %d of %zu tensors packed as affine (%s)\n", GetParam().c_str(), affine, file.header().tensors.size(),
              counts.c_str() + 1);
  EXPECT_EQ(affine, k_types) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(LlamaQuantize, GgufWide,
                         ::testing::Values("Q4_K_M", "Q2_K", "IQ1_S", "IQ1_M", "IQ2_XS", "IQ3_XXS", "IQ4_XS"));

// tests/model/fixtures/gguf_quant/moe/: the qwen3_moe family fixture's GGUF with its merged gate/up expert tensors
// quantized to Q4_1 (scripts/gguf_quantize_tensors.py, gguf-py's quantizer); the down experts stay BF16. Each
// expert loads as its own packed matrix (affine 4 bits, or dense bf16), equal to the dequantized load's bit for bit,
// and the logits are the dequantized load's within the kernels' activation rounding.
TEST(GgufMoe, MergedExpertTensorsLoadPackedPerExpert) {
  const fs::path path = kQuantFixtures / "moe/qwen3_moe.Q4_1_experts.gguf";
  const auto packed = load_gguf_model(path);
  const auto dense = load_gguf_model(path, {}, GgufWeights::dequantized);
  std::map<std::string, int> experts;  // codec and dtype -> count
  for (const NamedTensor& t : packed->tensors) {
    if (t.name.find(".experts.") == std::string::npos) continue;
    const std::string kind =
        std::string(t.ref.codec->id) + (t.ref.codec->id == "dense" ? t.ref.params.at("dtype").get<std::string>() : "");
    ++experts[kind];
    const NamedTensor* d = dense->find(t.name);
    ASSERT_NE(d, nullptr) << t.name;
    EXPECT_EQ(d->ref.codec->id, "dense") << t.name;
    EXPECT_TRUE(codec::decode_all(t.ref) == codec::decode_all(d->ref)) << t.name << ": not the dequantized values";
  }
  // 2 layers x 5 experts: gate and up (Q4_1) as affine, down (BF16) as dense bf16.
  EXPECT_EQ(experts, (std::map<std::string, int>{{"affine", 20}, {"densebf16", 10}}));

  const std::vector<int32_t> tokens = {1, 17, 42, 99, 5, 127, 64, 3};
  const auto got = stepwise_logits(*packed, tokens);
  const auto want = stepwise_logits(*dense, tokens);
  double scale = 0, max_diff = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    scale = std::max(scale, std::abs(static_cast<double>(want[i])));
    max_diff = std::max(max_diff, std::abs(static_cast<double>(got[i]) - want[i]));
  }
  ASSERT_GT(scale, 0.1);
  EXPECT_LE(max_diff, 5e-4 * scale);  // packed kernels round activations (GgufPacked)
}

// Every block type that loads packed, on random blocks (every code and sub-block scale, f16 fields of either sign,
// a block of zero fields): the affine re-expression decodes to ggml's dequantization (io::dequantize_ggml, which the
// wide fixtures check against ggml's own digests) bit for bit but for the sign of zero, in 2 rows of 3 blocks.
TEST(GgufPackedBlocks, EveryPackedTypeDecodesAsItsDequantization) {
  // The f16 fields (d, and dmin or m) of each type: their offsets in a block.
  const std::vector<std::pair<GgmlType, std::vector<size_t>>> types = {
      {GgmlType::Q4_0, {0}},    {GgmlType::Q4_1, {0, 2}},   {GgmlType::Q5_0, {0}},   {GgmlType::Q5_1, {0, 2}},
      {GgmlType::Q8_0, {0}},    {GgmlType::Q2_K, {80, 82}}, {GgmlType::Q3_K, {108}}, {GgmlType::Q4_K, {0, 2}},
      {GgmlType::Q5_K, {0, 2}}, {GgmlType::Q6_K, {208}}};
  std::mt19937 rng(22);
  std::uniform_int_distribution<int> byte(0, 255), exponent(-12, 2);
  for (const auto& [type, halves] : types) {
    const io::GgmlTypeInfo& info = *io::ggml_type_info(static_cast<uint32_t>(type));
    const int64_t rows = 2, blocks_per_row = 3, cols = blocks_per_row * static_cast<int64_t>(info.block_elems);
    std::vector<uint8_t> bytes(static_cast<size_t>(rows * blocks_per_row) * info.block_bytes);
    for (uint8_t& v : bytes) v = static_cast<uint8_t>(byte(rng));
    for (size_t blk = 0; blk < bytes.size() / info.block_bytes; ++blk)
      for (const size_t at : halves) {
        // Finite, of either sign; zero throughout block 1.
        const float magnitude = std::ldexp(1.0f + static_cast<float>(byte(rng)) / 256.0f, exponent(rng));
        const float v = blk == 1 ? 0.0f : byte(rng) % 2 ? -magnitude : magnitude;
        const uint16_t h = f32_to_f16(v);
        std::memcpy(&bytes[blk * info.block_bytes + at], &h, 2);
      }
    const auto raw = std::as_bytes(std::span(bytes));
    const auto packed = gguf_packed_matrix(type, raw, {rows, cols});
    ASSERT_TRUE(packed.has_value()) << info.name;
    const codec::TensorRef ref{packed->codec, packed->tensor.params, {rows, cols}, packed->tensor.views()};
    codec::validate_tensor(ref, info.name);
    const std::vector<float> got = codec::decode_all(ref);
    std::vector<float> want(static_cast<size_t>(rows * cols));
    io::dequantize_ggml(type, raw, want);
    int zeros = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      zeros += want[i] == 0.0f;
      ASSERT_TRUE(std::bit_cast<uint32_t>(got[i]) == std::bit_cast<uint32_t>(want[i]) ||
                  (got[i] == 0.0f && want[i] == 0.0f))
          << info.name << " element " << i << ": " << got[i] << " vs " << want[i];
    }
    EXPECT_GE(zeros, info.block_elems) << info.name;  // block 1
  }
}

// Together the wide fixtures hold every IQ type and the K-quants llama.cpp's recipes mix in.
TEST(GgufWide, FixturesCoverEveryIqType) {
  const auto digests = nlohmann::json::parse(std::ifstream(kWideFixtures / "ggml_dequant.json"));
  std::set<std::string> types;
  for (const auto& [name, tensors] : digests.items())
    for (const auto& [tensor, row] : tensors.items()) types.insert(row.at("type").get<std::string>());
  EXPECT_EQ(types, (std::set<std::string>{"IQ1_M", "IQ1_S", "IQ2_S", "IQ2_XS", "IQ2_XXS", "IQ3_S", "IQ3_XXS", "IQ4_XS",
                                          "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"}));
}

}  // namespace
}  // namespace lowbit::model
