// The rotation fold (seed 003, QuaRot's R1): RMSNorm gains are folded into the linears that read the normalized
// stream, and the residual stream is rotated by a random Hadamard matrix R (codec/hadamard.h). With the stream
// carried as x' = R x: the embedding stores R e per token, every linear that reads the stream stores W R^T, every
// linear that writes it (the attention output and MLP down projections, and their biases) stores R W, and the
// head stores W diag(g) R^T. RMSNorm commutes with an orthogonal R once its gain is 1, so the model computes the
// same function, with outliers spread across channels: easier to quantize. The model's description (family.h)
// says which norm feeds which linears and how its gain applies: w for RMSNorm, 1 + w for Gemma's unit-offset
// RMSNorm (folded as 1 + w, the stored weight then 0). LayerNorms and norms of the branch before the residual add
// (Gemma's post norms) do not commute with R: Errc::unsupported.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lowbit/model/model.h"

namespace lowbit::quant {

struct FoldResult {
  std::unique_ptr<model::Model> model;
  uint64_t seed = 0;
  std::vector<std::string> deviations;  // what differs from the source's structure (e.g. an untied head)
};

// The folded, rotated copy of a half-rotation-layout model (all weights dense f32).
FoldResult fold_and_rotate(const model::Model& source, uint64_t seed);

// Mean KL divergence KL(p_a || p_b) of next-token distributions over the given windows' positions.
double mean_kld(const model::Model& a, const model::Model& b, const std::vector<std::vector<int32_t>>& windows);

}  // namespace lowbit::quant
