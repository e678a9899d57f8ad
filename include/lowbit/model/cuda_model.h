// The GPU model runtime (docs/CUDA.md, "Runtime"): an interpreter of the model description (family.h). Every
// linear of the model prepared once for the GPU, the decode step (embedding, each layer's ops: norms,
// projections, RoPE, attention over a device KV cache, MLP activation, residual adds; LM head) captured in a CUDA
// graph per batch size and replayed per token. Token ids, positions and KV-cache slots live
// in device memory, so the same graph serves every step. Prefill (CudaModel::prefill) runs a prompt in passes of
// up to CudaModelOptions::prefill_rows positions of one sequence: every linear through CudaLinear::gemm on the
// whole pass, the per-row kernels over its rows, a prefill attention kernel, the LM head only where logits are
// wanted. Prefill launches eagerly (no graph).
//
// This header needs no CUDA headers. use_device(), cuda_built(), measure_cuda(), cuda_device_summary() and
// synthetic_model() are always built (the CUDA ones fail with Errc::usage without CUDA); CudaModel only with
// LOWBIT_CUDA=ON.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "lowbit/codec/codec.h"
#include "lowbit/model/config.h"
#include "lowbit/model/family.h"
#include "lowbit/model/model.h"
#include "lowbit/model/shard.h"

namespace lowbit::model {

// Makes forward() on `model` run on `device`: "cpu" (the default kernels) or "cuda" (Errc::usage in a build
// without CUDA; Errc::unsupported naming the tensor when a codec has no CUDA kernel yet). `devices` (--devices),
// when not empty, runs it on those GPUs through tensor_parallel() (device must be "cuda").
void use_device(Model& model, std::string_view device, std::span<const int> devices = {});

// --devices "0,1,...": GPU ids, distinct, 1 to 8 of them (Errc::usage naming the flag and the entry).
std::vector<int> parse_devices(std::string_view list);

// Looks up a stored tensor by its Hugging Face name (nullptr when absent; the names are the description's,
// hf_tensor_name). The model asks for the tensors of one layer at a time, in layer order, and prepares them before
// asking for the next layer's: a source may free earlier layers' storage then. A description with Role::qkv or
// Role::gate_up (a checkpoint that stores them fused) runs them as one matmul each; parts stored apart are
// stacked into one where their codec allows it.
using TensorLookup = TensorSource;

// The all-reduce of a sharded description's all_reduce ops (shard.h): device memory data [n] summed over the ranks
// in place, enqueued on `stream` (a cudaStream_t; inside a captured graph when graphs are on).
using AllReduce = std::function<void(float* data, size_t n, void* stream)>;

// Tensor parallelism on GPUs (shard.h's plan): a rank per GPU, each running the interpreter over its own slices
// (rank_tensors) from a host thread of its own, the ranks meeting in their all-reduces. The description is
// shard_desc's.
struct CudaRank {
  int device = 0;
  RankTensors tensors;
  AllReduce all_reduce;
};
struct TensorParallel {
  ModelDesc desc;
  std::vector<CudaRank> ranks;
};

// Tensor parallelism on the GPUs `devices` through NCCL: one communicator per GPU (ncclCommInitAll), rank r on
// devices[r] holding rank_tensors(.., r, devices.size()) of the model `lookup` gives. libnccl is loaded at run
// time (dlopen: the file $LOWBIT_NCCL, else libnccl.so.2 from the library path: the CUDA toolkit's lib/ or
// PyTorch's nvidia/nccl/lib), so lowbit does not depend on it; a missing one is Errc::unsupported saying so. One
// device: the 1-rank path (the same description and ops over one NCCL rank). Errc::usage in a build without CUDA;
// a model whose heads or MLP do not split over the devices is Errc::usage naming `source`.
TensorParallel tensor_parallel(const ModelConfig& config, const ModelDesc& desc, const TensorLookup& lookup,
                               std::span<const int> devices, std::string_view source);

class CudaModel;
struct CudaModelOptions;
// The model on the current GPU (devices empty), or tensor-parallel over `devices` (tensor_parallel, which names
// `source` in its errors; each rank gets its own all-reduce, options.all_reduce is not used). Only with CUDA.
std::unique_ptr<CudaModel> make_cuda_model(const ModelConfig& config, const ModelDesc& desc, const TensorLookup& lookup,
                                           std::span<const int> devices, const CudaModelOptions& options,
                                           std::string_view source);

// True when this lowbit was built with the CUDA backend.
bool cuda_built();

enum class KvType { f32, f16, bf16 };

// The non-matmul parts of a decode step or prefill pass, as bits (CudaModel::set_skipped_parts).
enum StepPart : unsigned {
  kPartNorm = 1,       // embedding gather and the norms (with the residual adds)
  kPartRope = 2,       // bias, q/k norm, RoPE and KV-cache append
  kPartAttention = 4,  // the attention kernel (and the o bias)
  kPartSwiglu = 8,     // the MLP activation (and the down bias); in MoE layers also the route and weighted sum
  kPartsAll = 15,      // every part but the matmuls
};

struct CudaModelOptions {
  int max_batch = 1;      // activation rows per decode step, 1..kernels::cuda::kMaxBatch
  // Positions per prefill pass (>= 1; capped at config.max_seq). The activation buffers hold
  // max(max_batch, prefill_rows) rows, the logits buffer as many rows of the vocabulary (512 rows of a 128256
  // vocabulary: 263 MB), so this bounds prefill's memory.
  int64_t prefill_rows = 512;
  int slots = 0;          // KV-cache slots (independent sequences); 0: max_batch
  int64_t capacity = 0;   // positions per KV slot (<= config.max_seq); 0: min(max_seq, 256)
  KvType kv_type = KvType::f32;
  bool use_graphs = true;  // replay a captured CUDA graph per batch size (false: launch every kernel each step)
  // The all-reduce of a sharded description's all_reduce ops; empty: a description with all_reduce ops is refused.
  // (Tensor parallelism gives each rank its own: CudaRank::all_reduce.)
  AllReduce all_reduce = nullptr;
};

class CudaModel {
 public:
  // Uploads every weight of `desc`'s layers (Errc::unsupported naming the tensor where prepare_cuda has no kernel
  // for its codec, or naming the layer where the description needs what the GPU interpreter lacks).
  CudaModel(const ModelConfig& config, ModelDesc desc, const TensorLookup& lookup, const CudaModelOptions& options);
  // The same with the description of config's family (describe_model).
  CudaModel(const ModelConfig& config, const TensorLookup& lookup, const CudaModelOptions& options);
  // Tensor parallelism: the ranks of `tp` (config is the whole model's), each on its GPU, every call below run by
  // all of them (a host thread each) and answered from rank 0; every rank computes the whole logits.
  CudaModel(const ModelConfig& config, TensorParallel tp, const CudaModelOptions& options);
  ~CudaModel();
  CudaModel(const CudaModel&) = delete;
  CudaModel& operator=(const CudaModel&) = delete;

  const ModelConfig& config() const;
  const CudaModelOptions& options() const;
  // Bytes of weight data a one-row step reads through the matmuls (all layers and the LM head; of an MoE layer's
  // experts the top_k a row runs, on average), over all ranks.
  uint64_t weight_bytes() const;
  // Grows the KV cache to `capacity` positions per slot (its contents are lost; graphs are captured anew).
  void reserve(int64_t capacity);

  // Runs one step for rows 0..batch-1: row b embeds tokens[b] at position pos[b] of KV slot slot[b], appends its
  // key and value there and attends over positions 0..pos[b] of that slot. Asynchronous; logits stay on the
  // device until download_logits().
  void step(std::span<const int32_t> tokens, std::span<const int32_t> pos, std::span<const int32_t> slot);
  // Which logits prefill() copies back.
  enum class Logits { none, last, all };
  // Runs `tokens` at positions pos, pos + 1, .. of KV slot `slot` (appending their keys and values) in passes of
  // up to options().prefill_rows positions. `logits` (host memory) receives the last token's logits [vocab]
  // (Logits::last) or every token's [tokens.size(), vocab] (Logits::all, the LM head run on every pass; one copy
  // back per pass); waits then. Afterwards step() or set_rows() give the next inputs (decode_greedy needs them).
  void prefill(std::span<const int32_t> tokens, int64_t pos, int32_t slot, Logits which, float* logits);
  // prefill() from input rows x [n, dim] (host memory) in place of the tokens' embeddings: a speech model's prompt
  // with the audio features in its placeholder rows, or an encoder's inputs. A model whose config has vocab 0 (an
  // encoder) has no embedding and no LM head (`which` must be none) and no decode step; one with bidirectional
  // attention (AttentionSpec::causal false) takes each sequence in one pass from position 0 (n <= prefill_rows).
  void prefill_rows(std::span<const float> x, int64_t pos, int32_t slot, Logits which, float* logits);
  // Copies rows [row_begin, row_end) of the last prefill pass's final norm output [rows, dim] to `out`; waits.
  void download_hidden(int64_t row_begin, int64_t row_end, float* out) const;
  // Greedy decoding on the device: `steps` steps of rows 0..batch-1, each feeding its argmax back as the next
  // token at the next position (no host round trip). Inputs as last given to step() or set_rows().
  void decode_greedy(int batch, int64_t steps);
  // Uploads the inputs without running a step (for decode_greedy).
  void set_rows(std::span<const int32_t> tokens, std::span<const int32_t> pos, std::span<const int32_t> slot);
  // Copies logits rows [row_begin, row_end) of the last step (or prefill pass) to `out` [(row_end - row_begin),
  // vocab]; waits.
  void download_logits(int row_begin, int row_end, float* out) const;
  // The argmax token of rows 0..batch-1 of the last step's logits; waits.
  void argmax(int batch, std::span<int32_t> out) const;
  // The tokens the device holds for rows 0..batch-1 (after decode_greedy: the last step's argmax); waits.
  void download_tokens(int batch, std::span<int32_t> out) const;
  void synchronize() const;
  // Timing only: later steps and prefill passes leave out the parts in `parts` (StepPart bits), so that a
  // benchmark can split their time between the matmuls and the rest; logits are meaningless meanwhile. 0 restores
  // the step.
  void set_skipped_parts(unsigned parts);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Decode and prefill speed on the GPU (lowbit bench): prefill of `prompt` random tokens on slot 0 through
// CudaModel::prefill (passes of prefill_rows positions, the last token's logits copied back); then, per batch
// size B, B independent sequences decoded greedily on the device for `steps` steps from position 0 (after a
// warm-up that captures the graph). The prefill and each batch's step are also timed with parts left out
// (set_skipped_parts). Times are host clock around synchronized work, so they include the per-step graph launch.
struct SpeedOptions {
  std::vector<int> batches{1};
  int64_t prompt = 128;
  int64_t steps = 128;
  KvType kv_type = KvType::f32;
  bool use_graphs = true;
  uint64_t seed = 1;
  std::vector<int> devices = {};  // --devices: through tensor_parallel(); empty: the current GPU alone
};
struct Speed {
  int batch = 1;
  double prefill_tokens_per_s = 0;  // measured once, reported with every batch
  // The prefill with only its linears (GEMMs and LM head) launched, and what its attention adds (the prefill's
  // time minus its time without the attention), ms.
  double prefill_gemm_ms = 0, prefill_attention_ms = 0;
  double decode_tokens_per_s = 0;   // all B sequences together
  double ms_per_step = 0;
  // The same steps launching only the matmuls, and how much each part adds (the step's time minus its time
  // without that part).
  double matmul_ms_per_step = 0;
  double norm_ms = 0, rope_ms = 0, attention_ms = 0, swiglu_ms = 0;
  uint64_t weight_bytes = 0;  // read by one step's matmuls
  double load_seconds = 0;    // preparing and uploading the weights (CudaModel's constructor), once
};
// Errc::usage in a build without CUDA.
std::vector<Speed> measure_cuda(const ModelConfig& config, const ModelDesc& desc, const TensorLookup& lookup,
                                const SpeedOptions& options);
// The GPU's name and size, one line (Errc::usage in a build without CUDA).
std::string cuda_device_summary();

// A Llama-3-8B-shaped model (32 layers, dim 4096, ffn 14336, 32 query / 8 KV heads, vocab 128256; `layers`
// overrides the depth) with random stored arrays in one codec, generated directly (never encoded): "bf16",
// "affine4" (4 bits, group 64, bf16 scales), "trellis2", "trellis3" (L 16, 1MAD, no rotation). Every layer
// views the same random arrays (one layer's worth of host memory); each gets its own device copy. The
// embedding is dense bf16; q/k/v and gate/up are stored fused (the description has Role::qkv and Role::gate_up).
struct SyntheticModel {
  ModelConfig config;
  ModelDesc desc;
  TensorLookup lookup;
  std::shared_ptr<const void> storage;
};
SyntheticModel synthetic_model(std::string_view shape, std::string_view codec, uint64_t seed, int64_t layers = 0);

}  // namespace lowbit::model
