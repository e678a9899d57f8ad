// Tensor parallelism: one model split across ranks (devices), each rank holding a slice of every layer and running
// the same interpreter (forward.cpp, the CUDA runtime) over its own shapes, with an all-reduce where the slices'
// partial sums meet. How a tensor splits is read off its shape in the description (family.h), never off its name:
//   - a linear whose rows are heads or MLP columns (Dim q_dim, kv_dim, qkv_dim, hidden, gate_up_dim) is
//     column-parallel: rank r keeps its heads' or columns' rows (q/k/v, qkv, gate/up, gate_up); a vector of those
//     sizes (q/k/v biases, up_bias) likewise;
//   - a linear whose columns are heads or MLP columns is row-parallel (o, down): rank r keeps those columns and its
//     output is a partial sum, which the `all_reduce` op the plan inserts after attention, mlp and moe sums; the
//     bias added after it (o_bias, down_bias: a [dim] vector of a layer with a row-parallel linear) stays on rank 0;
//   - expert tensors are split by expert (rank r keeps experts [r E / R, (r + 1) E / R)), the router replicated;
//   - the embedding and the head are vocabulary-parallel: rank r keeps rows [r V / R, (r + 1) V / R); a token
//     outside them embeds to zeros before an all-reduce, and the head's logits land in their columns of a zeroed
//     [m, vocab] row before one;
//   - everything else (norm gains, q/k norms, the router) is replicated.
// Slices are cut from the same stored tensors (no per-rank files) through codec::slice_tensor, so each shard runs
// through the same codec and kernels; a split that would cut a quantization group or tile is refused, naming the
// tensor. Heads split by KV group: n_kv_heads and the MLP width must divide by the number of ranks.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "lowbit/codec/codec.h"
#include "lowbit/model/model.h"

namespace lowbit {
class ThreadPool;
}

namespace lowbit::model {

// How a layer tensor splits, from its TensorSpec.
enum class Split : uint8_t { replicated, rows, cols, by_expert, first_rank };
Split split_of(const TensorSpec& t, const LayerDesc& layer);

// The ranges of a Dim that rank `rank` of `ranks` holds (the whole of an unsplit Dim); the config is the full one.
std::vector<codec::Range> dim_ranges(Dim d, const ModelConfig& c, int rank, int ranks);

// Refuses (Errc::usage naming `source`) a model that cannot split over `ranks`: KV heads or MLP columns that do not
// divide, more ranks than vocabulary rows.
void check_shardable(const ModelConfig& c, int ranks, std::string_view source);

// Rank `rank`'s config: its heads, KV heads and MLP columns (vocab stays the full one: the logits are whole).
ModelConfig shard_config(const ModelConfig& c, int rank, int ranks);

// The description with an all_reduce op after every attention, mlp and moe op.
ModelDesc shard_desc(const ModelDesc& d);

// Rank `rank` of `ranks` of `full` (loaded with its stored arrays: not LoadOptions::cpu_only): its slices of every
// tensor, prepared for the CPU kernels, its config and description, and `comm` for its all-reduces.
std::unique_ptr<Model> shard_model(const Model& full, int rank, int ranks, std::shared_ptr<Communicator> comm,
                                   std::string_view source);

// A model's tensors by Hugging Face name (nullptr where absent), as a runtime that prepares its own kernels reads them.
using TensorSource = std::function<const codec::TensorRef*(const std::string& name)>;

// Rank `rank` of `ranks` of the model (config c, description d) whose tensors `full` gives, for such a runtime (the
// CUDA ranks, cuda_model.h): its config (shard_config), the vocabulary rows of its embedding and head, its experts,
// and a source of its tensors under the same names, cut by this header's plan (a first-rank vector is zeros on the
// other ranks, the experts of other ranks are absent). The source slices on demand and keeps only the slices of the
// layer it was last asked for, so a reader takes one layer's tensors before the next layer's (as CudaModel does).
// One rank: `full` itself.
struct RankTensors {
  ModelConfig config;
  codec::Range vocab;    // rows of the embedding and head
  codec::Range experts;  // experts of every MoE layer
  TensorSource tensors;
};
RankTensors rank_tensors(const ModelConfig& c, const ModelDesc& d, TensorSource full, int rank, int ranks,
                         std::string_view source);

// The CPU simulation of R devices in one process: R communicators whose all-reduce sums the ranks' buffers in rank
// order (0, 1, ..., R-1: the same result on every rank, every run). Each rank must call every collective, from its
// own thread.
std::vector<std::shared_ptr<Communicator>> local_group(int ranks);

// forward() of every rank's model on a thread of its own (as one process drives several devices), each with its
// cache and pool; logits as forward()'s, rank 0's (all ranks compute the same). The first error is rethrown after
// every thread has ended.
void forward_ranks(std::span<const Model* const> ranks, std::span<KvCache* const> caches,
                   std::span<ThreadPool* const> pools, std::span<const int32_t> tokens, int64_t pos, float* logits,
                   bool all_logits);

}  // namespace lowbit::model
