// MLX quantized directories as mlx-lm writes them: an HF config.json with a "quantization" block
// ({"group_size", "bits", "mode"} plus per-module overrides keyed by module path), and for every quantized
// module "<path>.weight" (uint32 codes), "<path>.scales" and "<path>.biases". They load through the affine codec,
// codes as they are, never re-quantized. The same layout is what an all-affine lowbit artifact carries, so such
// an artifact is also an mlx-lm checkpoint (docs/FORMAT.md).
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <memory>

#include "lowbit/model/model.h"

namespace lowbit::model {

// True when an HF config.json declares MLX quantization.
bool is_mlx_quantized(const nlohmann::json& config);

std::unique_ptr<Model> load_mlx(const std::filesystem::path& dir, const LoadOptions& options = {});

}  // namespace lowbit::model
