// A one-layer llama GGUF of random f32 weights with a small SentencePiece-style tokenizer and chat template
// embedded: a complete model for tests that quantize or run one through the CLI in well under a second.
#pragma once

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "io/gguf_builder.h"

namespace lowbit::quant::testing {

namespace fs = std::filesystem;
using io::GgmlType;
using io::GgufValueType;

// A SentencePiece-style vocabulary: specials, the 256 byte pieces, and a few merges of a, b and spaces.
inline void add_llama_tokenizer(io::GgufBuilder& g, std::vector<std::string>& tokens) {
  std::vector<float> scores;
  std::vector<int32_t> types;
  const auto add = [&](std::string piece, float score, int32_t type) {
    tokens.push_back(std::move(piece)), scores.push_back(score), types.push_back(type);
  };
  add("<unk>", 0, 2), add("<s>", 0, 3), add("</s>", 0, 3);
  for (int b = 0; b < 256; ++b) add(fmt::format("<0x{:02X}>", b), 0, 6);
  for (const char* piece : {"\xe2\x96\x81", "a", "b",
                            "\xe2\x96\x81"
                            "a",
                            "\xe2\x96\x81"
                            "b",
                            "ab", "ba",
                            "\xe2\x96\x81"
                            "ab"})
    add(piece, -static_cast<float>(tokens.size()), 1);
  g.kv_string("tokenizer.ggml.model", "llama");
  g.kv_strings("tokenizer.ggml.tokens", tokens);
  g.kv_array<float>("tokenizer.ggml.scores", GgufValueType::f32, scores);
  g.kv_array<int32_t>("tokenizer.ggml.token_type", GgufValueType::i32, types);
  g.kv_scalar<uint32_t>("tokenizer.ggml.bos_token_id", GgufValueType::u32, 1);
  g.kv_scalar<uint32_t>("tokenizer.ggml.eos_token_id", GgufValueType::u32, 2);
  g.kv_scalar<uint8_t>("tokenizer.ggml.add_bos_token", GgufValueType::boolean, 1);
  g.kv_string("tokenizer.chat_template", "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}");
}

// A one-layer llama of random f32 weights with that tokenizer embedded.
inline fs::path write_gguf(const fs::path& dir) {
  io::GgufBuilder g;
  std::vector<std::string> tokens;
  add_llama_tokenizer(g, tokens);
  const uint64_t dim = 32, hidden = 48, kv_dim = 16, vocab = tokens.size();
  g.kv_string("general.architecture", "llama");
  g.kv_scalar<uint32_t>("llama.embedding_length", GgufValueType::u32, dim);
  g.kv_scalar<uint32_t>("llama.block_count", GgufValueType::u32, 1);
  g.kv_scalar<uint32_t>("llama.feed_forward_length", GgufValueType::u32, hidden);
  g.kv_scalar<uint32_t>("llama.attention.head_count", GgufValueType::u32, 2);
  g.kv_scalar<uint32_t>("llama.attention.head_count_kv", GgufValueType::u32, 1);
  g.kv_scalar<uint32_t>("llama.context_length", GgufValueType::u32, 64);
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  const auto tensor = [&](const char* name, std::vector<uint64_t> ne, bool ones = false) {
    uint64_t n = 1;
    for (auto d : ne) n *= d;
    std::vector<uint8_t> bytes;
    for (uint64_t i = 0; i < n; ++i) io::GgufBuilder::put<float>(bytes, ones ? 1.0f : normal(rng));
    g.tensor(name, std::move(ne), GgmlType::F32, std::move(bytes));
  };
  tensor("token_embd.weight", {dim, vocab});
  tensor("output_norm.weight", {dim}, true);
  tensor("blk.0.attn_norm.weight", {dim}, true);
  tensor("blk.0.ffn_norm.weight", {dim}, true);
  tensor("blk.0.attn_q.weight", {dim, dim});
  tensor("blk.0.attn_k.weight", {dim, kv_dim});
  tensor("blk.0.attn_v.weight", {dim, kv_dim});
  tensor("blk.0.attn_output.weight", {dim, dim});
  tensor("blk.0.ffn_gate.weight", {dim, hidden});
  tensor("blk.0.ffn_up.weight", {dim, hidden});
  tensor("blk.0.ffn_down.weight", {hidden, dim});
  const auto image = g.build();
  const fs::path path = dir / "tiny.gguf";
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(image.data()), static_cast<std::streamsize>(image.size()));
  return path;
}

}  // namespace lowbit::quant::testing
