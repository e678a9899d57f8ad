// The in-memory model: a config, its family's description (family.h), weights under Hugging Face names, each a
// codec::TensorRef so that quantized weights stay packed, and the prepared CPU kernels the forward pass runs.
// Loaders (llama2.c, HF safetensors, lowbit artifacts, GGUF) fill a ModelBuilder; load_model() picks the loader
// from the path.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "lowbit/codec/codec.h"
#include "lowbit/core/mapped_file.h"
#include "lowbit/kernels/cpu.h"
#include "lowbit/model/config.h"
#include "lowbit/model/family.h"
#include "lowbit/model/kv_cache.h"
#include "lowbit/model/tokenizer.h"

namespace lowbit {
class ThreadPool;
}

namespace lowbit::model {

struct NamedTensor {
  std::string name;  // HF name, e.g. "model.layers.0.self_attn.q_proj.weight"
  codec::TensorRef ref;
  // This tensor's own hold on its arrays, dropped when a kernel has copied them (LoadOptions::cpu_only): the
  // arrays themselves when they are the tensor's alone (a GGUF tensor re-packed at load, a dense f32 tensor), or
  // a handle that releases their pages of a shared mapping (an artifact's); null when only Model::keep_alive
  // holds them.
  std::shared_ptr<const void> storage;
};

// One layer's weights by role, as its LayerDesc lists them: linears prepared for the CPU kernels, vectors
// (norm gains, biases) decoded to f32. A role the layer does not have is null / empty.
// One expert of an MoE layer: a gated MLP [expert_hidden, dim] x2, [dim, expert_hidden].
struct ExpertWeights {
  std::unique_ptr<kernels::CpuLinear> gate, up, down;
};

struct LayerWeights {
  std::array<std::unique_ptr<kernels::CpuLinear>, kRoleCount> linears;
  std::array<std::vector<float>, kRoleCount> vectors;
  std::vector<ExpertWeights> experts;  // [n_experts] in MoE layers, else empty

  kernels::CpuLinear* linear(Role r) const { return linears[static_cast<size_t>(r)].get(); }
  std::unique_ptr<kernels::CpuLinear>& linear_slot(Role r) { return linears[static_cast<size_t>(r)]; }
  // The slot of a layer tensor's linear: an expert's (expert >= 0: expert_gate, expert_up, expert_down) or by role.
  std::unique_ptr<kernels::CpuLinear>& linear_slot(Role r, int32_t expert) {
    if (expert < 0) return linear_slot(r);
    ExpertWeights& e = experts.at(static_cast<size_t>(expert));
    return r == Role::expert_gate ? e.gate : r == Role::expert_up ? e.up : e.down;
  }
  const std::vector<float>& vector(Role r) const { return vectors[static_cast<size_t>(r)]; }
};

// Runs forward() in place of the CPU kernels (the CUDA runtime, cuda_model.h's use_device). It keeps its own
// KV cache for the sequence whose host KvCache forward() passes, which then stays unused.
class DeviceForward {
 public:
  virtual ~DeviceForward() = default;
  virtual void forward(KvCache& cache, std::span<const int32_t> tokens, int64_t pos, float* logits,
                       bool all_logits) = 0;
  // forward() from input rows x [m, dim] (forward_embeddings).
  virtual void forward_embeddings(KvCache& cache, std::span<const float> x, int64_t pos, float* logits,
                                  bool all_logits) = 0;
};

// The collective of tensor parallelism (shard.h): every rank of a sharded model calls it at the same ops.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int ranks() const = 0;
  // data [n] of every rank <- the sum over ranks, in place.
  virtual void all_reduce(float* data, size_t n) = 0;
};

// What a rank of a sharded model holds beyond its shapes (shard_model in shard.h).
struct ShardInfo {
  int rank = 0;
  int ranks = 1;
  int64_t vocab_begin = 0;  // the embedding and head rows it holds start here (the head's rows() say how many)
  std::shared_ptr<Communicator> comm;
};

class Model {
 public:
  ModelConfig config;
  std::vector<NamedTensor> tensors;             // every weight, in load order
  std::shared_ptr<kernels::CpuLinear> embed;    // [vocab, dim], rows gathered
  std::shared_ptr<kernels::CpuLinear> lm_head;  // [vocab, dim]; the embedding's kernel itself when tied
  std::vector<float> final_norm;                // [dim]
  std::vector<float> final_norm_bias;           // [dim] when desc.final_norm is NormKind::layer, else empty
  ModelDesc desc;                               // the family's description of config (family.h)
  std::vector<LayerWeights> layers;             // by desc.layers
  std::shared_ptr<DeviceForward> device;        // null: forward() runs on the CPU
  ShardInfo shard;                              // ranks 1 and no comm: the whole model

  const NamedTensor* find(std::string_view name) const;
  // Keeps the storage the TensorRefs point into alive (mapped files, owned buffers, readers).
  std::vector<std::shared_ptr<const void>> keep_alive;
  // The mapped files (kept alive by keep_alive) whose pages release_pages() may drop.
  std::vector<const MappedFile*> mapped_files;
  // Drops the pages of t's arrays that lie in mapped_files from the resident set (MappedFile::release_pages): a
  // reader done with a tensor (the load's value checks, the quantizer once it is encoded) stops holding it. The
  // pages read the file again if touched; arrays in memory are left alone.
  void release_pages(const NamedTensor& t) const;
  // Loaded with LoadOptions::cpu_only: the tensors whose kernels copied them have no arrays left.
  bool stored_arrays_released = false;
  // Errc::usage naming `user` when stored_arrays_released (the CUDA upload reads the stored arrays).
  void require_stored_arrays(std::string_view user) const;

 private:
  friend class ModelBuilder;
  // tensors' positions by name: a checkpoint of 400,000 tensors is indexed in O(n log n), not compared pairwise
  std::map<std::string, size_t, std::less<>> index_;
};

struct LoadOptions {
  std::optional<int64_t> max_seq = std::nullopt;  // caps config.max_seq (and so the KV cache a caller may allocate)
  // Only the CPU kernels will read the weights (generate, chat, bench, serve and eval on the CPU): a tensor's
  // stored arrays are released as soon as its kernel holds its own copy (the affine and trellis re-layouts, the
  // decoded norm vectors), so the model holds its weights once instead of twice. The tensors keep their names,
  // codecs and shapes; the CUDA upload, quantize and convert need the arrays and must load without this.
  bool cpu_only = false;
};

// Collects named tensors and their storage, then validates them and prepares the kernels.
class ModelBuilder {
 public:
  // A dense f32 tensor whose values the builder owns.
  void add_f32(std::string name, Shape shape, std::vector<float> values);
  // A tensor whose arrays live in storage kept alive by keep_alive().
  void add(std::string name, codec::TensorRef ref);
  // A tensor with its own hold on its arrays (NamedTensor::storage), dropped under LoadOptions::cpu_only once a
  // kernel has copied them.
  void add(std::string name, codec::TensorRef ref, std::shared_ptr<const void> storage);
  void keep_alive(std::shared_ptr<const void> owner);
  // keep_alive() of an owner of mapped files the tensors view, which Model::release_pages() may release.
  void keep_alive(std::shared_ptr<const void> owner, std::vector<const MappedFile*> files);
  bool contains(std::string_view name) const;
  // Describes the model by its family, checks that the tensors are exactly the description's (each present with
  // its shape, none left over: Errc::shape / Errc::format naming `source` and the tensor), and prepares the
  // kernels (releasing the stored arrays they copied under options.cpu_only). A tied embedding is prepared once,
  // for both the lookup and the head.
  std::unique_ptr<Model> finish(const ModelConfig& config, std::string_view source, const LoadOptions& options = {});

 private:
  std::unique_ptr<Model> model_ = std::make_unique<Model>();
};

// A dense f32 TensorRef viewing `values` (which must outlive it).
codec::TensorRef dense_f32_ref(Shape shape, std::span<const float> values);

// Converts the rows of a q or k projection [n_heads * head_dim, cols] between RoPE layouts, head by head:
// interleaved row 2i + j <-> half row j * head_dim/2 + i (llama2.c export.py's permute).
std::vector<float> permute_rope_rows(std::span<const float> w, int64_t n_heads, int64_t head_dim, int64_t cols,
                                     RopeStyle from, RopeStyle to);

// The values of tensor t of `model` with q/k rows (weights and biases, fused qkv included) in HF's half-rotation
// RoPE layout, whatever model.config.rope_style is; other tensors decoded as they are.
std::vector<float> decode_half_rope(const Model& model, const NamedTensor& t);

// Loads a llama2.c .bin checkpoint, a Hugging Face directory (config.json + safetensors) or a lowbit
// artifact directory (manifest.json). The format is detected from the path (see src/model/load.cpp).
std::unique_ptr<Model> load_model(const std::filesystem::path& path, const LoadOptions& options = {});

// The tokenizer for a model: `tokenizer_file` when given (llama2.c .bin, tokenizer.json, tokenizer.model),
// else the one beside or inside the model.
std::unique_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& model_path,
                                          const std::optional<std::filesystem::path>& tokenizer_file);

// load_tokenizer for running `model`: also refuses (Errc::shape) a tokenizer that lists_every_row() but has fewer
// tokens than the model has rows, which would otherwise generate ids without text and fail mid-generation.
std::unique_ptr<Tokenizer> load_tokenizer_for(const Model& model, const std::filesystem::path& model_path,
                                              const std::optional<std::filesystem::path>& tokenizer_file);

// Runs tokens[0..m) at positions pos..pos+m-1, appending their keys and values to the cache.
// all_logits: logits is [m, vocab]; otherwise [vocab], for the last token only.
// m > 1 goes through the batched matmul kernels (prefill), m == 1 through matvec (decode).
void forward(const Model& model, KvCache& cache, std::span<const int32_t> tokens, int64_t pos, float* logits,
             bool all_logits, ThreadPool& pool);

// x [m, dim] = the embeddings of tokens (scaled by the family's embed_scale), the rows forward() starts from.
std::vector<float> embed(const Model& model, std::span<const int32_t> tokens);

// forward() from input rows x [m, dim] instead of tokens' embeddings: a speech model's audio features in the rows
// of its placeholder tokens (on the model's device, as forward()).
void forward_embeddings(const Model& model, KvCache& cache, std::vector<float> x, int64_t pos, float* logits,
                        bool all_logits, ThreadPool& pool);

// One decode step of m sequences together: row i runs tokens[i] at position pos[i] of its own *caches[i],
// appending its keys and values there and attending over that cache alone; logits is [m, vocab]. The linears run
// once over all m rows (m > 1: the batched matmul kernels, as a prefill, so the weights are read once per step,
// not once per sequence); norms, RoPE, the cache appends and attention run row by row. Each row's logits are those
// of forward() of that token alone, up to the rounding difference between matmul and matvec. CPU only.
void forward_rows(const Model& model, std::span<KvCache* const> caches, std::span<const int32_t> tokens,
                  std::span<const int64_t> pos, float* logits, ThreadPool& pool);

// Runs hidden states x [m, dim] of tokens at positions pos..pos+m-1 through layers [layer_begin, layer_end), in
// place, appending those layers' keys and values to the cache. The quantizer's calibration goes layer by layer
// through it, so that each layer sees the already-quantized layers before it.
void forward_layers(const Model& model, KvCache& cache, float* x, int64_t m, int64_t pos, int64_t layer_begin,
                    int64_t layer_end, ThreadPool& pool);

}  // namespace lowbit::model
