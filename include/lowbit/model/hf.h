// Hugging Face model directories: config.json plus safetensors (one file or shards with an index), weights
// under HF Llama names. Reading keeps the weights zero-copy in the mapped files (bf16 / f16 / f32 as stored,
// through the dense codec); writing produces the dense f32 layout every HF tool reads.
#pragma once

#include <filesystem>
#include <memory>

#include "lowbit/model/model.h"

namespace lowbit::model {

// The dense codec's parameter for a float dtype ("f32", "f16", "bf16"); Errc::unsupported for other dtypes.
std::string_view float_dtype_param(DType t, std::string_view name, std::string_view source);
// A dense TensorRef viewing a stored float tensor as it is (zero-copy).
codec::TensorRef dense_view_ref(const TensorView& view, std::string_view name, std::string_view source);

std::unique_ptr<Model> load_hf(const std::filesystem::path& dir, const LoadOptions& options = {});

// Writes `model` to a new directory `out` as config.json + model.safetensors (f32), q/k rows in HF's half
// RoPE layout whatever the source layout was. Files named in `extra_files` (tokenizer files) are copied in.
// Errc::exists when `out` exists.
void write_hf(const Model& model, const std::filesystem::path& out,
              const std::vector<std::filesystem::path>& extra_files = {});

// Tokenizer and generation files beside a model that write_hf should carry along.
std::vector<std::filesystem::path> tokenizer_files_beside(const std::filesystem::path& model_path);

}  // namespace lowbit::model
