// Hostile input to the model-layer readers: FIFOs where files are expected, token counts that disagree with the
// embedding, token ids that would size huge tables, shapes whose products overflow. Each must end in a one-line
// lowbit::Error (exit 3 where the input is at fault), never a hang, a crash or an out-of-memory abort.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include "io/gguf_builder.h"
#include "lowbit/core/error.h"
#include "lowbit/core/thread_pool.h"
#include "lowbit/io/gguf.h"
#include "lowbit/model/gguf_model.h"
#include "lowbit/model/llama2c.h"
#include "lowbit/model/mlx.h"
#include "lowbit/model/model.h"
#include "lowbit/model/tokenizers.h"
#include "model/tiny_model.h"
#include "support/fifo_guard.h"

namespace lowbit::model {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

fs::path temp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / fmt::format("lowbit-hostile-{}-{}", name, ::getpid());
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

const json kLlamaConfig = {{"architectures", {"LlamaForCausalLM"}},
                           {"model_type", "llama"},
                           {"hidden_size", 8},
                           {"num_hidden_layers", 1},
                           {"num_attention_heads", 2},
                           {"intermediate_size", 16},
                           {"vocab_size", 32}};

// One safetensors file from (name, dtype, shape) entries whose data is empty (zero-size tensors).
void write_empty_safetensors(const fs::path& p, const std::vector<std::pair<std::string, json>>& entries) {
  json header = json::object();
  for (const auto& [name, entry] : entries) header[name] = entry;
  const std::string text = header.dump();
  const uint64_t n = text.size();
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << text;
}

TEST(HostileInput, FifoInPlaceOfAModelOrTokenizerFileIsRefusedWithoutBlocking) {
  const fs::path dir = temp_dir("fifo");
  // config.json of a Hugging Face directory.
  fs::create_directories(dir / "hf");
  lowbit::testing::read_fifo(dir / "hf/config.json", [&] { load_model(dir / "hf"); });
  // model.safetensors beside a good config.json.
  std::ofstream(dir / "hf/config.json") << kLlamaConfig.dump();
  lowbit::testing::read_fifo(dir / "hf/model.safetensors", [&] { load_model(dir / "hf"); });
  // Every kind of tokenizer file, as --tokenizer names it and as the loaders open it.
  for (const char* name : {"tokenizer.json", "tokenizer.model", "tokenizer.bin", "vocab.gguf"})
    lowbit::testing::read_fifo(dir / name, [&] { load_tokenizer(dir / "hf", dir / name); });
  lowbit::testing::read_fifo(dir / "t.json", [&] { load_hf_tokenizer(dir / "t.json"); });
  lowbit::testing::read_fifo(dir / "t.model", [&] { load_sentencepiece(dir / "t.model"); });
  lowbit::testing::read_fifo(dir / "t.bin", [&] { load_llama2c_tokenizer(dir / "t.bin"); });
  lowbit::testing::read_fifo(dir / "m.bin", [&] { load_llama2c(dir / "m.bin"); });
  lowbit::testing::read_fifo(dir / "m.gguf", [&] { io::GgufFile::open(dir / "m.gguf"); });
  fs::remove_all(dir);
}

// llama.cpp builds token_embd as [n_embd, n_tokens] and refuses any other shape; lowbit asks for the same.
TEST(HostileInput, GgufTokenListMustMatchTheEmbeddingRows) {
  constexpr uint64_t kDim = 4, kRows = 300;
  for (const int64_t delta : {-40, 40, 0}) {
    io::GgufBuilder g;
    std::vector<std::string> tokens;
    tokens.push_back("<unk>");
    for (uint64_t i = 1; i < kRows + delta; ++i) tokens.push_back(fmt::format("t{}", i));
    g.kv_string("tokenizer.ggml.model", "llama");
    g.kv_strings("tokenizer.ggml.tokens", tokens);
    std::vector<float> scores(tokens.size(), 0.0f);
    std::vector<int32_t> types(tokens.size(), 1);
    types[0] = 2;
    g.kv_array<float>("tokenizer.ggml.scores", io::GgufValueType::f32, scores);
    g.kv_array<int32_t>("tokenizer.ggml.token_type", io::GgufValueType::i32, types);
    g.tensor("token_embd.weight", {kDim, kRows}, io::GgmlType::F32, std::vector<uint8_t>(kDim * kRows * 4));
    const auto image = g.build();
    const auto file = io::GgufFile::from_bytes(std::as_bytes(std::span(image)), "vocab.gguf");
    if (delta == 0) {
      EXPECT_EQ(gguf_tokenizer(file)->vocab_size(), static_cast<int32_t>(kRows));
      continue;
    }
    try {
      gguf_tokenizer(file);
      ADD_FAILURE() << delta << ": accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::shape) << e.what();
      EXPECT_NE(std::string(e.what()).find(
                    fmt::format("lists {} tokens, but token_embd.weight has {} rows", kRows + delta, kRows)),
                std::string::npos)
          << e.what();
    }
  }
}

// Found by the fuzzers (UBSan): a float token type or token id converted to an integer out of range.
TEST(HostileInput, FloatTokenTypesAndIdsAreFormatErrors) {
  io::GgufBuilder g;
  g.kv_string("tokenizer.ggml.model", "llama");
  g.kv_strings("tokenizer.ggml.tokens", {"<unk>", "a"});
  g.kv_array<float>("tokenizer.ggml.scores", io::GgufValueType::f32, {0.0f, 0.0f});
  g.kv_array<float>("tokenizer.ggml.token_type", io::GgufValueType::f32, {2.0f, 1.1e27f});
  const auto image = g.build();
  try {
    gguf_tokenizer(io::GgufFile::from_bytes(std::as_bytes(std::span(image)), "vocab.gguf"));
    ADD_FAILURE() << "gguf: accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::format) << e.what();
  }
  const fs::path dir = temp_dir("float-id");
  std::ofstream(dir / "tokenizer.json") << R"({"model": {"type": "BPE", "vocab": {"a": 1e98}, "merges": []},)"
                                        << R"( "decoder": {"type": "ByteLevel"}})";
  try {
    load_hf_tokenizer(dir / "tokenizer.json");
    ADD_FAILURE() << "tokenizer.json: accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::format) << e.what();
  }
  fs::remove_all(dir);
}

// Strings from files reach messages escaped and cut: no raw newline or terminal escape, bounded length.
TEST(HostileInput, NamesFromFilesAreEscapedAndCutInMessages) {
  io::GgufBuilder g;
  g.kv_string("tokenizer.ggml.model", "evil\n\x1b[2J" + std::string(5000, 'x'));
  g.kv_strings("tokenizer.ggml.tokens", {"<unk>"});
  const auto image = g.build();
  const auto file = io::GgufFile::from_bytes(std::as_bytes(std::span(image)), "vocab\r.gguf");
  try {
    gguf_tokenizer(file);
    FAIL() << "accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find_first_of("\n\r\x1b"), std::string::npos) << what;
    EXPECT_NE(what.find("vocab\\x0d.gguf: tokenizer model 'evil\\n\\x1b[2Jxxx"), std::string::npos) << what;
    EXPECT_LT(what.size(), 2 * kMaxShownBytes) << what;
  }
}

// A tokenizer.json id of 2^31-1 sized a 64 GiB table (std::bad_alloc, exit 1, no file named).
TEST(HostileInput, HugeTokenIdIsALimitErrorNamingFileAndField) {
  const fs::path dir = temp_dir("token-id");
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[fmt::format("b{}", b)] = b;
  json root = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}},
               {"decoder", {{"type", "ByteLevel"}}},
               {"added_tokens", json::array()}};
  for (const char* field : {"model.vocab", "added_tokens"}) {
    json doc = root;
    if (std::string(field) == "model.vocab")
      doc["model"]["vocab"]["huge"] = 2147483647;
    else
      doc["added_tokens"].push_back({{"id", 2147483647}, {"content", "<huge>"}, {"special", true}});
    std::ofstream(dir / "tokenizer.json") << doc.dump();
    try {
      load_hf_tokenizer(dir / "tokenizer.json");
      ADD_FAILURE() << field << ": accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::limit) << e.what();
      EXPECT_EQ(exit_code(e.code()), 3);
      const std::string what = e.what();
      EXPECT_NE(what.find((dir / "tokenizer.json").string()), std::string::npos) << what;
      EXPECT_NE(what.find(fmt::format("{}: id 2147483647", field)), std::string::npos) << what;
    }
  }
  fs::remove_all(dir);
}

// An MLX U32 code matrix [0, 2^62]: holds no bytes, but 2^62 words * 32 / bits columns overflowed int64 (UBSan).
TEST(HostileInput, MlxCodeShapeOverflowIsAnError) {
  const fs::path dir = temp_dir("mlx");
  json config = kLlamaConfig;
  config["quantization"] = {{"group_size", 64}, {"bits", 4}};
  std::ofstream(dir / "config.json") << config.dump();
  const json huge = {{"dtype", "U32"}, {"shape", {0, int64_t{1} << 62}}, {"data_offsets", {0, 0}}};
  const json small = {{"dtype", "F16"}, {"shape", {0, 1}}, {"data_offsets", {0, 0}}};
  write_empty_safetensors(dir / "model.safetensors", {{"model.embed_tokens.weight", huge},
                                                      {"model.embed_tokens.scales", small},
                                                      {"model.embed_tokens.biases", small}});
  try {
    load_mlx(dir);
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::overflow) << e.what();
    EXPECT_NE(std::string(e.what()).find("'model.embed_tokens.weight' columns"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

// fuzz_mlx_config's finding (CI, 2026-12-04): a config without "quantization" reached nlohmann's at(), whose
// out_of_range escaped as a crash instead of a format error naming the file and the field.
TEST(HostileInput, MlxConfigWithoutQuantizationIsAFormatError) {
  const fs::path dir = temp_dir("mlx-noquant");
  for (const json& quantization : {json(nullptr), json(4)}) {
    json config = kLlamaConfig;
    if (!quantization.is_null()) config["quantization"] = quantization;
    std::ofstream(dir / "config.json") << config.dump();
    write_empty_safetensors(dir / "model.safetensors", {});
    try {
      load_mlx(dir);
      FAIL() << "accepted " << config.dump();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::format) << e.what();
      EXPECT_NE(std::string(e.what()).find("config.json: 'quantization' is missing or not an object"),
                std::string::npos)
          << e.what();
    }
  }
  fs::remove_all(dir);
}

// A llama2.c tokenizer.bin of `n` tokens: <unk> <s> </s>, the 256 byte tokens, then "t0", "t1", ...
void write_llama2c_tokenizer(const fs::path& p, int n) {
  std::ofstream out(p, std::ios::binary);
  const int32_t max_len = 8;
  out.write(reinterpret_cast<const char*>(&max_len), 4);
  for (int i = 0; i < n; ++i) {
    const std::string piece = i == 0    ? "<unk>"
                              : i == 1  ? "<s>"
                              : i == 2  ? "</s>"
                              : i < 259 ? fmt::format("<0x{:02X}>", i - 3)
                                        : fmt::format("t{}", i - 259);
    const float score = -static_cast<float>(i);
    const int32_t len = static_cast<int32_t>(piece.size());
    out.write(reinterpret_cast<const char*>(&score), 4);
    out.write(reinterpret_cast<const char*>(&len), 4);
    out << piece;
  }
}

// A llama2.c tokenizer shorter than the model's vocabulary was accepted; the model then generated id 419 and
// generation died with "token id 419 outside [0, 300)". Refused before generating now; a longer one is fine
// (run.c reads the first vocab_size entries).
TEST(HostileInput, Llama2cTokenizerShorterThanTheModelIsRefused) {
  const fs::path dir = temp_dir("llama2c-tok");
  ModelConfig c = testing::tiny_config();
  c.vocab = 512;
  const auto model = testing::tiny_model(c);
  write_llama2c_tokenizer(dir / "tok300.bin", 300);
  try {
    load_tokenizer_for(*model, dir / "model.bin", dir / "tok300.bin");
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::shape) << e.what();
    EXPECT_NE(std::string(e.what()).find("tok300.bin: 300 tokens, but the model's vocabulary has 512 rows"),
              std::string::npos)
        << e.what();
  }
  write_llama2c_tokenizer(dir / "tok512.bin", 512);
  EXPECT_EQ(load_tokenizer_for(*model, dir / "model.bin", dir / "tok512.bin")->vocab_size(), 512);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace lowbit::model

namespace lowbit::model {
namespace {

// 400,000 zero-size tensors, as a hostile safetensors header may declare them, then the first name again: the
// duplicate is found by the builder's index (the pairwise comparison took 26 s at 100,000), and every name is
// found again afterwards.
TEST(HostileInput, ManyTensorsAreIndexedAndADuplicateIsRefused) {
  constexpr int kTensors = 400000;
  ModelBuilder b;
  for (int i = 0; i < kTensors; ++i) b.add_f32(fmt::format("x.{}", i), Shape{0}, {});
  EXPECT_TRUE(b.contains("x.0"));
  EXPECT_TRUE(b.contains(fmt::format("x.{}", kTensors - 1)));
  EXPECT_FALSE(b.contains("x.-1"));
  try {
    b.add_f32("x.0", Shape{0}, {});
    FAIL() << "a duplicate name was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::duplicate);
    EXPECT_NE(std::string(e.what()).find("'x.0'"), std::string::npos) << e.what();
  }
}

// A file may place a tensor at an offset misaligned for its element type (safetensors does not forbid it; mlx-lm's
// stacked experts do it): the builder copies such arrays to aligned memory, so kernels never read a float or a code
// word through a misaligned pointer (UBSan's "load of misaligned address" in the debug build), and the model
// computes what the aligned one does.
TEST(HostileInput, ArraysAtMisalignedOffsetsAreCopiedToAlignedMemory) {
  const ModelConfig c = testing::tiny_config();
  const auto aligned = testing::tiny_model(c);
  auto storage = std::make_shared<std::vector<std::byte>>();
  size_t total = 0;
  for (const auto& t : aligned->tensors)
    for (const auto& [_, view] : t.ref.arrays.items) total += view.bytes.size() + 8;
  storage->resize(total);
  size_t at = 1;  // every array starts 1 byte past a multiple of 4 (then of 8)
  ModelBuilder b;
  b.keep_alive(storage);
  for (const auto& t : aligned->tensors) {
    codec::TensorRef ref = t.ref;
    for (auto& [_, view] : ref.arrays.items) {
      std::memcpy(storage->data() + at, view.bytes.data(), view.bytes.size());
      view.bytes = std::span<const std::byte>(storage->data() + at, view.bytes.size());
      at += (view.bytes.size() + 7) / 8 * 8;
    }
    b.add(t.name, std::move(ref));
  }
  const auto copied = b.finish(c, "misaligned");
  for (const auto& t : copied->tensors)
    for (const auto& [array, view] : t.ref.arrays.items)
      EXPECT_EQ(reinterpret_cast<uintptr_t>(view.bytes.data()) % dtype_size(view.dtype), 0u) << t.name << "." << array;
  const std::vector<int32_t> tokens = {1, 5, 2, 7};
  std::vector<float> want(static_cast<size_t>(c.vocab)), got(want.size());
  KvCache cache_a(c, 8), cache_b(c, 8);
  forward(*aligned, cache_a, tokens, 0, want.data(), false, default_pool());
  forward(*copied, cache_b, tokens, 0, got.data(), false, default_pool());
  EXPECT_EQ(want, got);
}

}  // namespace
}  // namespace lowbit::model
