// The streaming invariant of `lowbit quantize` (issue 22): the peak resident memory is one source shard, the
// tensor in flight and the binary, whatever the model's size. Two checkpoints of one shape, 1 and 12 layers in
// 32 MB shards (scripts/make_synthetic_checkpoint.py writes the real-size ones), are quantized by the binary; the
// larger one's peak may exceed the smaller's by less than one shard, where holding the source (or the output)
// would add its whole size.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lowbit/core/dtype.h"
#include "lowbit/io/safetensors.h"
#include "quant/quant_fixture.h"

namespace lowbit::quant {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

constexpr int64_t kDim = 1024, kHidden = 4096, kVocab = 8192;
constexpr uint64_t kShardBytes = 32ull << 20;

struct Spec {
  std::string name;
  Shape shape;
};

std::vector<Spec> llama_tensors(int layers) {
  std::vector<Spec> out{{"model.embed_tokens.weight", {kVocab, kDim}}};
  for (int l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    for (const char* norm : {"input_layernorm", "post_attention_layernorm"})
      out.push_back({p + norm + ".weight", {kDim}});
    for (const char* proj : {"q_proj", "k_proj", "v_proj", "o_proj"})
      out.push_back({p + "self_attn." + proj + ".weight", {kDim, kDim}});
    out.push_back({p + "mlp.gate_proj.weight", {kHidden, kDim}});
    out.push_back({p + "mlp.up_proj.weight", {kHidden, kDim}});
    out.push_back({p + "mlp.down_proj.weight", {kDim, kHidden}});
  }
  out.push_back({"model.norm.weight", {kDim}});
  out.push_back({"lm_head.weight", {kVocab, kDim}});
  return out;
}

// A Llama checkpoint of pseudo-random bf16 weights (norm gains 1) in shards of at most kShardBytes, written one
// tensor at a time.
void write_checkpoint(const fs::path& dir, int layers) {
  fs::create_directories(dir);
  const nlohmann::json config{{"architectures", {"LlamaForCausalLM"}},
                              {"model_type", "llama"},
                              {"hidden_size", kDim},
                              {"num_hidden_layers", layers},
                              {"num_attention_heads", 8},
                              {"num_key_value_heads", 8},
                              {"intermediate_size", kHidden},
                              {"vocab_size", kVocab},
                              {"rms_norm_eps", 1e-5},
                              {"max_position_embeddings", 512},
                              {"tie_word_embeddings", false},
                              {"bos_token_id", 1},
                              {"eos_token_id", 2}};
  std::ofstream(dir / "config.json") << config.dump(2);
  const std::vector<Spec> specs = llama_tensors(layers);
  std::vector<std::vector<Spec>> shards(1);
  uint64_t bytes = 0;
  for (const Spec& s : specs) {
    const uint64_t b = 2 * static_cast<uint64_t>(s.shape.size() == 1 ? s.shape[0] : s.shape[0] * s.shape[1]);
    if (!shards.back().empty() && bytes + b > kShardBytes) {
      shards.emplace_back();
      bytes = 0;
    }
    shards.back().push_back(s);
    bytes += b;
  }
  nlohmann::json weight_map = nlohmann::json::object();
  uint32_t state = 12345;
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string file = fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, shards.size());
    io::SafetensorsWriter w(dir / file, {{"format", "pt"}});
    for (const Spec& s : shards[i]) w.declare(s.name, DType::BF16, s.shape);
    for (const Spec& s : shards[i]) {
      const size_t n = s.shape.size() == 1 ? s.shape[0] : s.shape[0] * s.shape[1];
      std::vector<uint16_t> v(n);
      for (auto& x : v) {
        state = state * 1664525u + 1013904223u;
        // sign and a small exponent (|w| in [2^-8, 2^-6)) from the state's high bits, mantissa from the low ones
        x = s.shape.size() == 1 ? 0x3F80 : static_cast<uint16_t>((state >> 16 & 0x8000) | (0x3B80 + (state & 0xFF)));
      }
      w.write(s.name, std::as_bytes(std::span(v)));
      weight_map[s.name] = file;
    }
    w.finish();
  }
  std::ofstream(dir / "model.safetensors.index.json") << nlohmann::json{{"weight_map", weight_map}}.dump();
}

nlohmann::json quantize_json(const fs::path& source, const fs::path& out) {
  const std::string cmd = fmt::format(
      // ASan's quarantine keeps up to 256 MB of freed blocks resident; it would measure the sanitizer, not us.
      "ASAN_OPTIONS=\"$ASAN_OPTIONS:quarantine_size_mb=1\" LOWBIT_NO_PROGRESS=1 '{}' quantize '{}' '{}' --preset affine4 --no-calib "
      "--shard-bytes {} --threads 2 --json 2>/dev/null",
      LOWBIT_CLI, source.string(), out.string(), kShardBytes);
  std::FILE* p = ::popen(cmd.c_str(), "r");
  std::string text;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) text.append(buf, n);
  EXPECT_EQ(::pclose(p), 0) << cmd;
  return nlohmann::json::parse(text);
}

TEST(StreamingQuantize, PeakDoesNotGrowWithTheModel) {
  TempDir tmp;
  write_checkpoint(tmp.path / "small", 1);
  write_checkpoint(tmp.path / "large", 12);
  uint64_t large_bytes = 0;
  for (const auto& e : fs::directory_iterator(tmp.path / "large")) large_bytes += e.file_size();
  ASSERT_GT(large_bytes, 12 * kShardBytes);
  const nlohmann::json small = quantize_json(tmp.path / "small", tmp.path / "small-q");
  const nlohmann::json large = quantize_json(tmp.path / "large", tmp.path / "large-q");
  const auto peak = [](const nlohmann::json& j, const char* key) { return j.at(key).get<int64_t>(); };
  for (const char* key : {"peak_rss_bytes", "peak_rss_anon_bytes", "peak_rss_file_bytes"}) {
    std::printf("%s: %lld at 1 layer, %lld at 12 layers (source %llu bytes)\n", key,
                static_cast<long long>(peak(small, key)), static_cast<long long>(peak(large, key)),
                static_cast<unsigned long long>(large_bytes));
    EXPECT_GT(peak(small, key), 0) << key;
    EXPECT_LT(peak(large, key) - peak(small, key), static_cast<int64_t>(kShardBytes))
        << key << ": " << peak(small, key) << " at 1 layer, " << peak(large, key) << " at 12 layers of " << large_bytes
        << " bytes";
  }
  // The output is several shards, each written while the next tensors were encoded.
  int payloads = 0;
  for (const auto& e : fs::directory_iterator(tmp.path / "large-q"))
    payloads += e.path().filename().string().starts_with("model-");
  EXPECT_GT(payloads, 2);
}

}  // namespace
}  // namespace lowbit::quant
