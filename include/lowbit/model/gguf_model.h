// GGUF models: llama.cpp's metadata keys to a ModelConfig, its tensor names to the HF names the Model uses,
// and the embedded tokenizer ("gpt2" byte-level BPE from tokens + merges, "llama" SentencePiece from tokens +
// scores + types). Tensors stay packed where lowbit has their codec (gguf_tensors.h: Q4_0, Q4_1, Q5_0, Q5_1 and
// Q8_0 as affine, F32/F16/BF16 dense); the K-quants, IQ4_NL and IQ4_XS are still dequantized to dense f32 at
// load (exactly as ggml does).
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

// The config comes from the family table (family.h, parse_gguf_config); tensor names from the description's
// TensorSpecs. A tensor the description has no place for, or a layer tensor missing for one of block_count
// layers, is Errc::format naming it.
// `dequantized` turns every tensor into dense f32 instead (the reference the packed load is tested against).
enum class GgufWeights { packed, dequantized };
std::unique_ptr<Model> load_gguf_model(const std::filesystem::path& path, const LoadOptions& options = {},
                                       GgufWeights weights = GgufWeights::packed);

std::unique_ptr<Tokenizer> gguf_tokenizer(const io::GgufFile& file);
std::unique_ptr<Tokenizer> load_gguf_tokenizer(const std::filesystem::path& path);

// tokenizer.chat_template, if present.
std::optional<std::string> gguf_chat_template(const io::GgufFile& file);

}  // namespace lowbit::model
