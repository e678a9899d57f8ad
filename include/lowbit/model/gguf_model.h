// GGUF models: llama.cpp's metadata keys to a ModelConfig, its tensor names to the HF names the Model uses,
// and the embedded tokenizer ("gpt2" byte-level BPE from tokens + merges, "llama" SentencePiece from tokens +
// scores + types). Quantized tensors are dequantized to dense f32 at load (exactly as ggml does); they do not
// yet stay packed.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "lowbit/io/gguf.h"
#include "lowbit/model/model.h"
#include "lowbit/model/tokenizer.h"

namespace lowbit::model {

bool is_gguf_file(const std::filesystem::path& path);  // by the "GGUF" magic

// Config from "<arch>.*" metadata (llama, mistral, qwen2, qwen3). GGUF llama/mistral files store q/k rows in
// interleaved-pair RoPE order (llama.cpp's converter permutes them), so their config says RopeStyle::interleaved
// and the weights are used as stored. Errc::unsupported for other architectures.
ModelConfig gguf_config(const io::GgufFile& file);

std::unique_ptr<Model> load_gguf_model(const std::filesystem::path& path, const LoadOptions& options = {});

std::unique_ptr<Tokenizer> gguf_tokenizer(const io::GgufFile& file);
std::unique_ptr<Tokenizer> load_gguf_tokenizer(const std::filesystem::path& path);

// tokenizer.chat_template, if present.
std::optional<std::string> gguf_chat_template(const io::GgufFile& file);

}  // namespace lowbit::model
