// Launchers of the elementwise and attention kernels of the GPU decode step and prefill pass (model_ops.cu):
// embedding gather, RMSNorm, qkv bias + per-head norm + RoPE + KV-cache append, decode and prefill attention,
// SwiGLU, greedy argmax. Plain C++
// with no lowbit includes, so that nvcc's front end only sees this header. Launches are unchecked and
// asynchronous on `stream` (capturable in a CUDA graph); callers check with check_last_error().
//
// A step runs `batch` activation rows. Row b reads its token, its position and its KV-cache slot from device
// memory (tokens[b], pos[b], slot[b]), so one captured graph serves every step: batched decode puts
// independent sequences in distinct slots, a prefill pass puts consecutive positions of one sequence in the
// same slot (each row then attends to the rows before it, whose keys launch_qkv_prepare appended first).
#pragma once

#include <cstdint>

struct CUstream_st;

namespace lowbit::kernels::cuda {

// Element type of an embedding table or of the KV cache.
enum class ElemType : uint8_t { f32, f16, bf16 };

// x [batch, dim] = table [vocab, dim] rows tokens[b] (f32 out whatever the table type); out-of-range ids give 0.
void launch_embed_gather(const void* table, ElemType type, int64_t vocab, int64_t dim, const int32_t* tokens,
                         int batch, float* x, CUstream_st* stream);

// Whether launch_rmsnorm takes rows of n elements (a multiple of 4, at most 16384).
bool rmsnorm_supports(int64_t n);

// out [batch, n] = weight * x / rms(x), row by row. With `delta`, first x += delta (the residual add) in place.
void launch_rmsnorm(float* x, const float* delta, const float* weight, float* out, int batch, int64_t n, float eps,
                    CUstream_st* stream);

// The attention inputs of one layer after the q/k/v projections. Rows of q, k and v may be strided (a fused
// qkv projection writes them side by side).
struct QkvArgs {
  float* q = nullptr;       // [batch, q_stride], heads in the first n_heads * head_dim columns; rotated in place
  const float* k = nullptr;  // [batch, k_stride]
  const float* v = nullptr;  // [batch, v_stride]
  int64_t q_stride = 0, k_stride = 0, v_stride = 0;
  const float* q_bias = nullptr;  // [n_heads * head_dim] or null (qwen2)
  const float* k_bias = nullptr;
  const float* v_bias = nullptr;
  const float* q_norm = nullptr;  // [head_dim] or null (qwen3: RMSNorm per head before RoPE)
  const float* k_norm = nullptr;
  const float* inv_freq = nullptr;  // [head_dim / 2]
  int n_heads = 0, n_kv_heads = 0, head_dim = 0;
  bool interleaved = false;  // RoPE pairs (2i, 2i+1) instead of (i, i + head_dim / 2)
  float eps = 1e-5f;
};

// The KV cache of one layer: [slots, capacity, n_kv_heads * head_dim] keys and the same for values.
struct KvLayer {
  void* keys = nullptr;
  void* values = nullptr;
  ElemType type = ElemType::f32;
  int64_t capacity = 0;
};

// Adds biases, normalizes heads, rotates q and k at pos[b] and appends k, v at (slot[b], pos[b]).
void launch_qkv_prepare(const QkvArgs& a, const KvLayer& kv, const int32_t* pos, const int32_t* slot, int batch,
                        CUstream_st* stream);

// Scratch of the decode attention's split over positions: per (row, head) up to kAttentionSplits partial
// results of head_dim + 2 floats, and one arrival counter per (row, head), zeroed once at allocation (every
// launch leaves the counters zero).
inline constexpr int kAttentionSplits = 32;
struct AttentionScratch {
  float* partials = nullptr;    // [batch * n_heads * kAttentionSplits * (head_dim + 2)]
  uint32_t* counters = nullptr;  // [batch * n_heads]
};

// The most blocks that split the positions of a cache of `capacity` (1..kAttentionSplits, fixed per capacity).
int attention_splits(int64_t capacity);

// out [batch, n_heads * head_dim]: causal GQA attention of each row's q over cache positions 0..pos[b] of
// slot[b]; softmax of q.k / sqrt(head_dim) in f32 (online, so any context length). Long contexts split their
// positions over up to attention_splits(kv.capacity) blocks per (row, head), at least 128 positions each, that
// merge through `scratch`. Without `prepare`, q is as launch_qkv_prepare left it and the cache holds position
// pos[b]; with it, the kernel does launch_qkv_prepare's work itself (one launch fewer), which needs every row in
// a distinct slot: a row then never reads a position that another row of the launch appends.
void launch_decode_attention(const QkvArgs& a, const KvLayer& kv, const int32_t* pos, const int32_t* slot, int batch,
                             bool prepare, const AttentionScratch& scratch, float* out, CUstream_st* stream);

// Prefill attention: out [batch, n_heads * head_dim] for `batch` rows at the consecutive positions first_pos ..
// first_pos + batch - 1 of KV slot `slot`, row b attending causally over cache positions 0..first_pos + b. q is as
// launch_qkv_prepare left it and the cache already holds every row's key and value. Unlike the decode attention,
// a block serves kPrefillAttentionRows rows of one head, so each key and value read from the cache serves them
// all. head_dim <= 256.
inline constexpr int kPrefillAttentionRows = 32;
void launch_prefill_attention(const QkvArgs& a, const KvLayer& kv, int32_t slot, int64_t first_pos, int batch,
                              float* out, CUstream_st* stream);

// out [batch, hidden] = silu(gate) * up, gate and up rows strided by `stride`.
void launch_swiglu(const float* gate, const float* up, int64_t stride, float* out, int batch, int64_t hidden,
                   CUstream_st* stream);

// Scratch of the argmax's split of a row over argmax_blocks(vocab) blocks: their winners [batch * blocks] and
// one arrival counter per row, zeroed once at allocation (every launch leaves the counters zero).
struct ArgmaxScratch {
  float* values = nullptr;
  int32_t* indices = nullptr;
  uint32_t* counters = nullptr;  // [batch]
};
int argmax_blocks(int64_t vocab);

// next[b] = argmax of logits [batch, vocab] row b (the lowest id on ties). With `tokens` and `pos`, also the
// greedy feedback of a decode loop that stays on the device: tokens[b] = next[b], pos[b] += 1.
void launch_argmax(const float* logits, int64_t vocab, int batch, const ArgmaxScratch& scratch, int32_t* next,
                   int32_t* tokens, int32_t* pos, CUstream_st* stream);

}  // namespace lowbit::kernels::cuda
