// Launchers of the elementwise and attention kernels of the GPU decode step and prefill pass
// (src/kernels/cuda/model_ops.cu), for the CUDA model runtime (src/model/cuda): the ops a model description
// (include/lowbit/model/family.h) is made of: embedding gather (scaled), the norms (RMS, RMS with (1 + w) gains,
// LayerNorm) with the residual add fused in, bias adds, qkv bias + per-head norm + RoPE + KV-cache append, decode
// and prefill attention (scale, soft-capping, sliding window), the MLP activations (SwiGLU, GeGLU, GELU), logit
// soft-capping, greedy argmax. Plain C++ with no lowbit includes, so that nvcc's front end only sees this header.
// Launches are unchecked and asynchronous on `stream` (capturable in a CUDA graph); callers check with
// check_last_error().
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

// x [batch, dim] = table [rows, dim] rows tokens[b] - first * scale (f32 out whatever the table type): the table
// holds the vocabulary rows first .. first + rows - 1 (all of them, or a tensor-parallel rank's share); other ids
// give 0.
void launch_embed_gather(const void* table, ElemType type, int64_t first, int64_t rows, int64_t dim,
                         const int32_t* tokens, float scale, int batch, float* x, CUstream_st* stream);

// How a norm normalises (family.h's NormKind): rms: w * x / rms(x); rms_unit_offset: (1 + w) * x / rms(x) (Gemma,
// f32); layer: (x - mean) / sqrt(var + eps) * w + b (f32 statistics, bias optional).
enum class NormType : uint8_t { rms, rms_unit_offset, layer };

// Whether launch_norm takes rows of n elements (a multiple of 4, at most 16384).
bool norm_supports(int64_t n);

// out [batch, n] = norm(x) row by row with gain `weight` (and `bias`, LayerNorm only; may be null). With `delta`,
// first x += delta (the residual add) in place. out may be x itself (a post-norm of the branch in place).
void launch_norm(NormType type, float* x, const float* delta, const float* weight, const float* bias, float* out,
                 int batch, int64_t n, float eps, CUstream_st* stream);

// x [batch, n] += delta [batch, n] (a residual add that no norm follows).
void launch_add(float* x, const float* delta, int batch, int64_t n, CUstream_st* stream);

// y [batch, n] += bias [n] (the o and down projections' biases).
void launch_add_bias(float* y, const float* bias, int batch, int64_t n, CUstream_st* stream);

// x [count] = cap * tanh(x / cap) (final-logit soft-capping), cap > 0.
void launch_softcap(float* x, int64_t count, float cap, CUstream_st* stream);

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
  const float* q_norm = nullptr;  // [head_dim] or null: a norm over each head before RoPE
  const float* k_norm = nullptr;
  bool norm_unit_offset = false;  // q/k norm gains are (1 + w) (NormType::rms_unit_offset), else w
  const float* inv_freq = nullptr;  // [rope_dims / 2]
  int n_heads = 0, n_kv_heads = 0, head_dim = 0;
  int rope_dims = 0;  // the first rope_dims dimensions of each head rotate (even, <= head_dim); the rest pass
  bool interleaved = false;  // RoPE pairs (2i, 2i+1) instead of (i, i + rope_dims / 2)
  float eps = 1e-5f;
  // Scores are softcap * tanh(q.k * scale / softcap) (softcap 0: q.k * scale); a query at position p sees keys
  // max(0, p - window + 1) .. p (window 0: 0 .. p).
  float scale = 1.0f;
  float softcap = 0.0f;
  int64_t window = 0;
  // false: bidirectional (an encoder's, prefill only, window 0): every row of a prefill pass sees positions 0 ..
  // first_pos + batch - 1, its own pass's later rows included.
  bool causal = true;
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
// slot[b] (the window's part of them); softmax of the scores (QkvArgs) in f32 (online, so any context length). Long
// contexts split their positions over up to attention_splits(kv.capacity) blocks per (row, head), at least 128
// positions each, that merge through `scratch`. Without `prepare`, q is as launch_qkv_prepare left it and the cache
// holds position pos[b]; with it, the kernel does launch_qkv_prepare's work itself (one launch fewer), which needs
// every row in a distinct slot: a row then never reads a position that another row of the launch appends.
void launch_decode_attention(const QkvArgs& a, const KvLayer& kv, const int32_t* pos, const int32_t* slot, int batch,
                             bool prepare, const AttentionScratch& scratch, float* out, CUstream_st* stream);

// Prefill attention: out [batch, n_heads * head_dim] for `batch` rows at the consecutive positions first_pos ..
// first_pos + batch - 1 of KV slot `slot`, row b attending causally over cache positions 0..first_pos + b (the
// window's part of them), or over 0..first_pos + batch - 1 where the attention is not causal. q is as
// launch_qkv_prepare left it and the cache already holds every row's key and value. Unlike the decode attention,
// a block serves kPrefillAttentionRows rows of one head, so each key and value read from the cache serves them
// all. head_dim <= 256.
inline constexpr int kPrefillAttentionRows = 32;
void launch_prefill_attention(const QkvArgs& a, const KvLayer& kv, int32_t slot, int64_t first_pos, int batch,
                              float* out, CUstream_st* stream);

// The audio encoder's convolutional front end (Qwen3-ASR: three 3x3 convolutions of stride 2 and padding 1, each a
// GEMM over the patches of its input). patches [oh * ow, ci * 9], oh = (h + 1) / 2, ow = (w + 1) / 2: row y * ow +
// x, column i * 9 + ky * 3 + kx = in [2y + ky - 1, 2x + kx - 1, i] of `in` [h, w, ci] (channels last; 0 beyond
// the edges).
void launch_conv3x3s2_patches(const float* in, int64_t h, int64_t w, int64_t ci, float* patches, CUstream_st* stream);
// rows [n, ch * f] from in [f, w, ch] (frequency, time, channel): row t is channel 0's f frequencies at time t,
// then channel 1's, ... (t < n <= w).
void launch_conv_time_rows(const float* in, int64_t f, int64_t w, int64_t ch, int64_t n, float* rows,
                           CUstream_st* stream);

// The MLP activation (family.h's Activation): swiglu silu(gate) * up; geglu_tanh gelu_tanh(gate) * up; gelu_erf
// gelu(up) with no gate (erf GELU).
enum class ActType : uint8_t { swiglu, geglu_tanh, gelu_erf };

// out [batch, hidden] = act(gate, up + up_bias), gate and up rows strided by `stride` (gate unused by gelu_erf;
// up_bias [hidden] may be null).
void launch_activation(ActType type, const float* gate, const float* up, const float* up_bias, int64_t stride,
                       float* out, int batch, int64_t hidden, CUstream_st* stream);

// Mixture-of-Experts routing on the device (family.h's MoeSpec), so that a decode step with MoE layers needs no host
// round trip. For `batch` rows of router logits [batch, n_experts]: p = softmax over all experts (f32), the top_k
// largest p (ties: the lower index, as the CPU interpreter and torch.topk), weights p, or p divided by the sum of
// the chosen p when `renormalise`. The batch * top_k (row, expert) pairs are numbered in (expert, row) order;
// pair i is row pair_row[i] (the grouped gate/up matmul reads its input rows through it); the pairs of one expert
// form a group (groups in expert order: group_expert, group_start = its first pair, group_count = its pairs, one
// per row that chose it; groups past the last have count 0). slot[b * top_k + j] and weight[b * top_k + j] are
// row b's pairs and weights in expert order (the order the CPU adds the experts' outputs in). A tensor-parallel
// rank holds the experts [expert_begin, expert_end) only: its groups number their experts from expert_begin, the
// groups of other experts have count 0 and the pairs that chose them slot -1 (the weighted sum leaves them out).
inline constexpr int kMoeMaxTopK = 64;       // pairs of a step: at most kMaxBatch * kMoeMaxTopK
inline constexpr int kMoeMaxExperts = 4096;  // the router's chosen-set bit masks live in shared memory
inline constexpr int kMoeMaxRows = 16;       // one warp per row
struct MoeRoute {
  int32_t* pair_row = nullptr;      // [batch * top_k]
  int32_t* slot = nullptr;          // [batch * top_k]
  float* weight = nullptr;          // [batch * top_k]
  int32_t* group_expert = nullptr;  // [batch * top_k]
  int32_t* group_start = nullptr;   // [batch * top_k]
  int32_t* group_count = nullptr;   // [batch * top_k]
  int expert_begin = 0, expert_end = kMoeMaxExperts;
};

// Routes `batch` (1..kMoeMaxRows) rows of logits, n_experts (1..kMoeMaxExperts), top_k (1..min(n_experts,
// kMoeMaxTopK)): one block.
void launch_moe_route(const float* logits, int n_experts, int top_k, bool renormalise, int batch, const MoeRoute& route,
                      CUstream_st* stream);

// out [batch, dim]: row b = sum over j < top_k of weight[b * top_k + j] * y [slot[b * top_k + j]] (the experts'
// outputs, weighted, added in expert order; slots -1 left out).
void launch_moe_combine(const float* y, int64_t dim, const MoeRoute& route, int batch, int top_k, float* out,
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
