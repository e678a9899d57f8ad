// CudaModel: the decode step and the prefill pass on the GPU (include/lowbit/model/cuda_model.h), an interpreter
// of the model description (family.h) as forward.cpp is on the CPU: tensors found by role, each layer's ops run
// over the registers x and h, the residual add fused into the next norm. Built only with LOWBIT_CUDA=ON.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <exception>
#include <numeric>
#include <optional>
#include <thread>
#include <vector>

#include "cuda/stack_rows.h"
#include "lowbit/core/checked.h"
#include "lowbit/core/dtype.h"
#include "lowbit/core/error.h"
#include "lowbit/kernels/cuda.h"
#include "lowbit/kernels/cuda_model_ops.h"
#include "lowbit/model/cuda_model.h"
#include "lowbit/model/family.h"
#include "lowbit/model/shard.h"

namespace lowbit::model {

namespace kc = kernels::cuda;

namespace {

void check(cudaError_t status, const char* op) {
  if (status != cudaSuccess) fail(Errc::internal, "[cuda_model] {}: {}", op, cudaGetErrorString(status));
}

const codec::TensorRef& require(const TensorLookup& lookup, const std::string& name, const Shape& shape) {
  const codec::TensorRef* t = lookup(name);
  if (!t) fail(Errc::format, "[cuda_model] tensor '{}' is missing", name);
  if (t->shape != shape)
    fail(Errc::shape, "[cuda_model] tensor '{}' has shape {}, expected {}", name, shape_str(t->shape),
         shape_str(shape));
  return *t;
}

// prepare_cuda with the tensor's name in the error (e.g. a codec whose kernel does not exist yet).
std::unique_ptr<kc::CudaLinear> prepare(const codec::TensorRef& t, const std::string& name) {
  try {
    return kc::prepare_cuda(t);
  } catch (const Error& e) {
    fail(e.code(), "[cuda_model] tensor '{}' ({}): {}", name, t.codec->id, e.what());
  }
}

kc::DeviceBuffer upload_floats(std::span<const float> values) {
  kc::DeviceBuffer b(values.size() * sizeof(float));
  b.upload(values.data(), b.size());
  return b;
}

kc::ElemType elem_type(KvType t) {
  switch (t) {
    case KvType::f16: return kc::ElemType::f16;
    case KvType::bf16: return kc::ElemType::bf16;
    default: return kc::ElemType::f32;
  }
}

// The embedding table on the device, gathered by row. Dense f32/f16/bf16 tables are uploaded as stored; other
// codecs are decoded on the host once, to f32 when the table fits in 1 GiB that way and to bf16 otherwise.
struct Table {
  kc::DeviceBuffer data;
  kc::ElemType type = kc::ElemType::f32;
};

Table upload_embedding(const codec::TensorRef& t, int64_t vocab, int64_t dim) {
  Table table;
  if (t.codec->id == "dense") {
    const TensorView& v = t.arrays.at("data");
    const auto type = v.dtype == DType::F32 ? std::optional(kc::ElemType::f32)
                      : v.dtype == DType::F16 ? std::optional(kc::ElemType::f16)
                      : v.dtype == DType::BF16 ? std::optional(kc::ElemType::bf16)
                                               : std::nullopt;
    if (type) {
      table.type = *type;
      table.data = kc::DeviceBuffer(v.bytes.size());
      table.data.upload(v.bytes.data(), v.bytes.size());
      return table;
    }
  }
  const uint64_t n = checked_mul(static_cast<uint64_t>(vocab), static_cast<uint64_t>(dim), "[cuda_model] embedding");
  const bool as_f32 = n * sizeof(float) <= (uint64_t{1} << 30);
  table.type = as_f32 ? kc::ElemType::f32 : kc::ElemType::bf16;
  const size_t elem = as_f32 ? sizeof(float) : 2;
  table.data = kc::DeviceBuffer(n * elem);
  constexpr int64_t kRows = 256;
  std::vector<float> rows(static_cast<size_t>(kRows * dim));
  std::vector<std::byte> staged(static_cast<size_t>(kRows * dim) * elem);
  for (int64_t r0 = 0; r0 < vocab; r0 += kRows) {
    const int64_t r1 = std::min(vocab, r0 + kRows), count = (r1 - r0) * dim;
    t.codec->decode_rows(t.params, t.shape, t.arrays, r0, r1, rows.data());
    if (as_f32) {
      std::memcpy(staged.data(), rows.data(), static_cast<size_t>(count) * elem);
    } else {
      for (int64_t i = 0; i < count; ++i) store_float(DType::BF16, staged.data(), static_cast<size_t>(i), rows[i]);
    }
    check(cudaMemcpy(static_cast<std::byte*>(table.data.data()) + r0 * dim * elem, staged.data(),
                     static_cast<size_t>(count) * elem, cudaMemcpyHostToDevice),
          "embedding upload");
  }
  return table;
}

constexpr size_t at(Role r) { return static_cast<size_t>(r); }

kc::NormType norm_type(NormKind k) {
  switch (k) {
    case NormKind::rms_unit_offset: return kc::NormType::rms_unit_offset;
    case NormKind::layer: return kc::NormType::layer;
    default: return kc::NormType::rms;
  }
}

kc::ActType act_type(Activation a) {
  switch (a) {
    case Activation::geglu_tanh: return kc::ActType::geglu_tanh;
    case Activation::gelu_erf: return kc::ActType::gelu_erf;
    default: return kc::ActType::swiglu;
  }
}

// One layer's weights by role (family.h): the linears prepared for the GPU, every vector (norm gains, biases)
// uploaded as f32. Where q, k and v (gate and up) were stacked into one matmul, it sits under Role::qkv
// (Role::gate_up) and the parts are null.
struct Layer {
  const LayerDesc* desc = nullptr;
  std::array<std::unique_ptr<kc::CudaLinear>, kRoleCount> linears;  // expert roles stay null
  // An MoE layer's experts: each expert's gate and up stacked into one [2 expert_hidden, dim] weight, and down.
  std::unique_ptr<kc::CudaExperts> expert_gate_up, expert_down;
  std::array<kc::DeviceBuffer, kRoleCount> vectors;
  kc::DeviceBuffer keys, values;  // [slots, capacity, kv_dim]

  const kc::CudaLinear* linear(Role r) const { return linears[at(r)].get(); }
  const float* vector(Role r) const {
    return r != Role::count && vectors[at(r)].size() ? vectors[at(r)].as<const float>() : nullptr;
  }
};

Shape shape_of(const TensorSpec& t, const ModelConfig& c) {
  return t.linear() ? Shape{dim_size(t.rows, c), dim_size(t.cols, c)} : Shape{dim_size(t.rows, c)};
}

// Refuses (Errc::unsupported, naming the layer) what the GPU interpreter cannot run: ops that read the branch
// register h before any op (of this or an earlier layer) wrote it, an attention or MLP without its linears, q/k
// LayerNorms, RoPE tables and rotary widths outside the description.
void check_layer(const LayerDesc& d, const ModelDesc& desc, const ModelConfig& c, int64_t l, bool reduces,
                 bool& h_written) {
  const auto refuse = [&](std::string_view what) {
    fail(Errc::unsupported, "[cuda_model] layer {}: {}", l, what);
  };
  for (const Op& op : d.ops) {
    const bool reads_h = op.kind != Op::Kind::norm || op.in == Reg::h;
    if (reads_h && !h_written) refuse("an op reads register h before any op wrote it");
    if (op.kind == Op::Kind::norm && !d.has(op.weight)) refuse("a norm op without its gain tensor");
    if (op.kind == Op::Kind::all_reduce && !reduces) refuse("an all_reduce op without CudaModelOptions::all_reduce");
    h_written = true;
  }
  const auto runs = [&](Op::Kind kind) {
    return std::any_of(d.ops.begin(), d.ops.end(), [kind](const Op& o) { return o.kind == kind; });
  };
  if (runs(Op::Kind::moe)) {
    const MoeSpec& m = d.moe;
    if (!d.has(Role::router) || !d.has(Role::expert_gate) || !d.has(Role::expert_up) || !d.has(Role::expert_down))
      refuse("a Mixture-of-Experts block without its router and expert gate/up/down tensors");
    if (d.activation == Activation::gelu_erf) refuse("experts with an ungated GELU MLP (the GPU takes gated experts)");
    if (m.n_experts < 1 || m.n_experts > kc::kMoeMaxExperts || m.top_k < 1 || m.top_k > m.n_experts ||
        m.top_k > kc::kMoeMaxTopK)
      refuse(fmt::format("{} experts, top {} (the GPU router takes up to {} experts and top {})", m.n_experts, m.top_k,
                         kc::kMoeMaxExperts, kc::kMoeMaxTopK));
  }
  const bool attention = runs(Op::Kind::attention), mlp = runs(Op::Kind::mlp);
  const bool qkv = d.has(Role::qkv) || (d.has(Role::q) && d.has(Role::k) && d.has(Role::v));
  if (attention && (!qkv || !d.has(Role::o)))
    refuse("attention without its q/k/v (or qkv) and o tensors");
  const bool gated = d.activation != Activation::gelu_erf;
  if (mlp && (!d.has(Role::down) || (gated ? !(d.has(Role::gate_up) || (d.has(Role::gate) && d.has(Role::up)))
                                           : !d.has(Role::up))))
    refuse("an MLP without its gate/up (or gate_up) and down tensors");
  if ((d.has(Role::q_norm) || d.has(Role::k_norm)) && d.norm == NormKind::layer)
    refuse("q/k norms of kind layer (the GPU takes RMS norms of heads)");
  const AttentionSpec& a = d.attention;
  if (attention && !a.causal && a.window > 0) refuse("bidirectional attention in a sliding window");
  const auto table = static_cast<size_t>(a.rope);
  const bool table_fits = a.rope >= 0 && table < desc.rope_inv_freq.size() &&
                          desc.rope_inv_freq[table].size() >= static_cast<size_t>(a.rope_dims / 2);
  if (attention && a.rope_dims > 0 && (a.rope_dims % 2 != 0 || a.rope_dims > c.head_dim || !table_fits))
    refuse(fmt::format("RoPE table {} of {} for {} rotary dimensions of {}", a.rope, desc.rope_inv_freq.size(),
                       a.rope_dims, c.head_dim));
}

// Several projections of the same input as one matmul: the parts' rows stacked where their codec allows it
// (stack_rows), else null (the caller prepares the parts).
std::unique_ptr<kc::CudaLinear> stacked(std::span<const codec::TensorRef* const> parts,
                                        std::span<const std::string> names) {
  std::string joined;
  for (const std::string& name : names) joined += (joined.empty() ? "" : "+") + name;
  const std::optional<StackedTensor> s = stack_rows(parts);
  return s ? prepare(s->ref, joined) : nullptr;
}

// The experts `held` of an MoE layer (all of them, or a tensor-parallel rank's), gate and up stacked per expert
// (stack_rows), grouped for the kernels that take the expert ids from device memory. A codec whose experts cannot
// stack or have no grouped kernel is refused naming it.
template <class Ref>
void load_experts(Layer& w, const Ref& ref, const LayerDesc& d, int64_t l, codec::Range held) {
  const auto n = static_cast<size_t>(d.moe.n_experts);
  std::vector<const TensorSpec*> gate(n), up(n), down(n);
  for (const TensorSpec& t : d.tensors) {
    if (t.expert < 0 || static_cast<size_t>(t.expert) >= n) continue;
    auto& slot = t.role == Role::expert_gate ? gate : t.role == Role::expert_up ? up : down;
    slot[static_cast<size_t>(t.expert)] = &t;
  }
  std::vector<std::unique_ptr<kc::CudaLinear>> gate_up, downs;
  std::string codec_id;
  for (auto e = static_cast<size_t>(held.begin); e < static_cast<size_t>(held.end); ++e) {
    if (!gate[e] || !up[e] || !down[e])
      fail(Errc::unsupported, "[cuda_model] layer {}: expert {} lacks its gate, up or down tensor", l, e);
    const codec::TensorRef* parts[] = {&ref(*gate[e]), &ref(*up[e])};
    const std::string names[] = {hf_tensor_name(l, *gate[e]), hf_tensor_name(l, *up[e])};
    codec_id = parts[0]->codec->id;
    std::unique_ptr<kc::CudaLinear> stack = stacked(parts, names);
    if (!stack)
      fail(Errc::unsupported,
           "[cuda_model] layer {}: experts in codec '{}' have no grouped GPU kernel yet (dense and "
           "affine 4/8 bits and 2 bits in groups of 32 or more have)",
           l, codec_id);
    gate_up.push_back(std::move(stack));
    downs.push_back(prepare(ref(*down[e]), hf_tensor_name(l, *down[e])));
  }
  try {
    w.expert_gate_up =
        std::make_unique<kc::CudaExperts>(std::move(gate_up), fmt::format("layer {} experts' gate/up", l));
    w.expert_down = std::make_unique<kc::CudaExperts>(std::move(downs), fmt::format("layer {} experts' down", l));
  } catch (const Error& e) {
    fail(e.code(), "[cuda_model] experts in codec '{}': {}", codec_id, e.what());
  }
}

Layer load_layer(const TensorLookup& lookup, const ModelConfig& c, const LayerDesc& d, int64_t l,
                 codec::Range experts) {
  Layer w;
  w.desc = &d;
  const auto ref = [&](const TensorSpec& t) -> const codec::TensorRef& {
    return require(lookup, hf_tensor_name(l, t), shape_of(t, c));
  };
  // Parts of a projection the checkpoint stores apart, stacked into the fused role where the codec allows it.
  const auto fuse = [&](Role fused, std::initializer_list<Role> roles) {
    if (d.has(fused)) return;
    std::vector<const codec::TensorRef*> parts;
    std::vector<std::string> names;
    for (const Role r : roles) {
      const TensorSpec* t = d.find(r);
      if (!t) return;
      parts.push_back(&ref(*t));
      names.push_back(hf_tensor_name(l, *t));
    }
    w.linears[at(fused)] = stacked(parts, names);
  };
  fuse(Role::qkv, {Role::q, Role::k, Role::v});
  if (d.activation != Activation::gelu_erf) fuse(Role::gate_up, {Role::gate, Role::up});
  if (d.has(Role::router))
    load_experts(w, ref, d, l, {std::min(experts.begin, d.moe.n_experts), std::min(experts.end, d.moe.n_experts)});
  for (const TensorSpec& t : d.tensors) {
    if (t.expert >= 0) continue;  // load_experts
    const bool in_stack = ((t.role == Role::q || t.role == Role::k || t.role == Role::v) && w.linear(Role::qkv)) ||
                          ((t.role == Role::gate || t.role == Role::up) && w.linear(Role::gate_up));
    if (in_stack) continue;
    if (t.linear()) {
      w.linears[at(t.role)] = prepare(ref(t), hf_tensor_name(l, t));
    } else {
      w.vectors[at(t.role)] = upload_floats(codec::decode_all(ref(t)));
    }
  }
  return w;
}

// Bytes a one-row step reads: every linear, and of an MoE layer's experts the top_k a row runs (on average; a
// tensor-parallel rank's share of them).
uint64_t layer_bytes(const Layer& w) {
  uint64_t bytes = 0;
  for (const auto& p : w.linears)
    if (p) bytes += p->weight_bytes();
  if (w.expert_gate_up) {
    const uint64_t experts = w.expert_gate_up->weight_bytes() + w.expert_down->weight_bytes();
    bytes += experts / static_cast<uint64_t>(w.desc->moe.n_experts) * static_cast<uint64_t>(w.desc->moe.top_k);
  }
  return bytes;
}

template <class T>
const T* as(const kc::DeviceBuffer& b) {
  return b.size() ? b.as<const T>() : nullptr;
}

// One rank's runtime: the whole model, or a tensor-parallel rank's slices (shard.h) on its GPU.
struct Rank {
  using Logits = CudaModel::Logits;
  ModelConfig c;  // the rank's (its heads and MLP columns; the whole vocabulary)
  ModelDesc desc;
  CudaModelOptions o;
  codec::Range vocab;         // the embedding's and head's rows it holds
  codec::Range experts;       // the experts of its MoE layers
  std::vector<Layer> layers;  // each points at its description in desc.layers
  Table embed;
  std::unique_ptr<kc::CudaLinear> lm_head;
  kc::DeviceBuffer final_norm, final_norm_bias;
  std::vector<kc::DeviceBuffer> rope_tables;  // desc.rope_inv_freq
  // Activations for R = max(max_batch, prefill_rows) rows: x, xb [R, dim]; qkv [R, q_dim + 2 kv_dim]; att
  // [R, q_dim]; proj [R, dim]; gu [R, 2 hidden]; hb [R, hidden]; logits [R, vocab]; per-row tokens, positions,
  // slots, argmax.
  int64_t row_capacity = 0;
  kc::DeviceBuffer x, xb, qkv, att, proj, gu, hb, logits, tokens, pos, slot, next;
  kc::DeviceBuffer head_out;  // [R, its vocabulary rows], where it holds a share of them
  // MoE layers, for up to kMaxBatch rows at a time (prefill passes run them in chunks of that many): router logits
  // [rows, n_experts]; per (row, expert) pair the experts' gate/up [pairs, 2 expert_hidden], activation [pairs,
  // expert_hidden] and output [pairs, dim]; the route (cuda_model_ops.h).
  int64_t moe_top_k = 0;  // the largest top_k of the layers (0: no MoE layer)
  kc::DeviceBuffer moe_logits, moe_gu, moe_h, moe_y;
  kc::DeviceBuffer route_pair_row, route_slot, route_weight, route_group_expert, route_group_start, route_group_count;
  // The decode attention's and the argmax's split scratch, for max_batch rows (decode steps only).
  kc::DeviceBuffer attention_partials, attention_counters;
  kc::DeviceBuffer argmax_values, argmax_indices, argmax_counters;
  cudaStream_t stream = nullptr;
  // One graph per batch size and per slot pattern (distinct or shared slots), captured at first use.
  std::array<std::array<cudaGraphExec_t, 2>, kc::kMaxBatch + 1> graphs{};
  std::vector<int32_t> host_pos, host_slot;  // as last uploaded, for range checks
  int last_batch = 0;
  int64_t last_rows = 0;       // rows of the last prefill pass (download_hidden)
  bool distinct_slots = true;  // no two rows of the last inputs share a slot
  uint64_t bytes = 0;
  bool bidirectional = false;  // a layer's attention is not causal (an encoder): prefill only, one pass a sequence
  unsigned skipped = 0;  // StepPart bits left out (timing only)
  bool on(StepPart part) const { return !(skipped & part); }

  ~Rank() {
    drop_graphs();
    if (stream) cudaStreamDestroy(stream);
  }

  int64_t vocab_rows() const { return vocab.end - vocab.begin; }
  bool vocab_split() const { return vocab_rows() != c.vocab; }

  float* f(const kc::DeviceBuffer& b) const { return b.as<float>(); }
  int32_t* i(const kc::DeviceBuffer& b) const { return b.as<int32_t>(); }

  void drop_graphs() {
    for (auto& by_slots : graphs)
      for (auto& g : by_slots)
        if (g) {
          cudaGraphExecDestroy(g);
          g = nullptr;
        }
  }

  void allocate_activations() {
    const auto rows = [&](int64_t width) {
      return kc::DeviceBuffer(checked_mul(static_cast<uint64_t>(row_capacity) * sizeof(float),
                                          static_cast<uint64_t>(width), "[cuda_model] activations"));
    };
    x = rows(c.dim);
    xb = rows(c.dim);
    qkv = rows(c.q_dim() + 2 * c.kv_dim());
    att = rows(c.q_dim());
    proj = rows(c.dim);
    gu = rows(2 * c.hidden_dim);
    hb = rows(c.hidden_dim);
    logits = rows(c.vocab);
    if (vocab_split()) head_out = rows(vocab_rows());
    const auto per_row = [&](int64_t n, size_t elem) {
      return kc::DeviceBuffer(checked_mul(static_cast<uint64_t>(o.max_batch) * elem, static_cast<uint64_t>(n),
                                          "[cuda_model] activations"));
    };
    attention_partials = per_row(c.n_heads * kc::kAttentionSplits * (c.head_dim + 2), sizeof(float));
    attention_counters = per_row(c.n_heads, sizeof(uint32_t));
    attention_counters.fill(0);
    argmax_values = per_row(kc::argmax_blocks(c.vocab), sizeof(float));
    argmax_indices = per_row(kc::argmax_blocks(c.vocab), sizeof(int32_t));
    argmax_counters = per_row(1, sizeof(uint32_t));
    argmax_counters.fill(0);
    allocate_moe();
    for (auto* b : {&tokens, &pos, &slot, &next}) {
      *b = kc::DeviceBuffer(static_cast<size_t>(row_capacity) * sizeof(int32_t));
      b->fill(0);
    }
  }

  void allocate_moe() {
    int64_t n_experts = 0;
    for (const LayerDesc& d : desc.layers)
      if (d.has(Role::router)) {
        moe_top_k = std::max(moe_top_k, d.moe.top_k);
        n_experts = std::max(n_experts, d.moe.n_experts);
      }
    if (moe_top_k == 0) return;
    const auto rows = std::min<int64_t>(row_capacity, kc::kMaxBatch), pairs = rows * moe_top_k;
    const auto floats = [](int64_t n, int64_t width) {
      return kc::DeviceBuffer(checked_mul(static_cast<uint64_t>(n) * sizeof(float), static_cast<uint64_t>(width),
                                          "[cuda_model] expert activations"));
    };
    moe_logits = floats(rows, n_experts);
    moe_gu = floats(pairs, 2 * c.expert_hidden_dim);
    moe_h = floats(pairs, c.expert_hidden_dim);
    moe_y = floats(pairs, c.dim);
    for (auto* b :
         {&route_pair_row, &route_slot, &route_weight, &route_group_expert, &route_group_start, &route_group_count}) {
      *b = kc::DeviceBuffer(static_cast<size_t>(pairs) * sizeof(int32_t));
      b->fill(0);  // count 0: no group, until the first route (a timing run may leave the router out)
    }
  }

  kc::MoeRoute route() const {
    return {i(route_pair_row),
            i(route_slot),
            f(route_weight),
            i(route_group_expert),
            i(route_group_start),
            i(route_group_count),
            static_cast<int>(experts.begin),
            static_cast<int>(experts.end)};
  }

  // out = moe(in) for `rows` rows, in chunks of up to kMaxBatch rows (a prefill pass runs its rows through the decode
  // kernels this way): the router matmul, the device route, the chosen experts' gate/up as one grouped matmul over
  // the (row, expert) pairs (reading each pair's row of `in` through the route's pair_row), the activation, their
  // down projections grouped alike, and the weighted sum per row.
  void moe(const Layer& w, const float* in, float* out, int64_t rows) {
    const MoeSpec& spec = w.desc->moe;
    const int64_t ih = c.expert_hidden_dim;
    const int k = static_cast<int>(spec.top_k);
    const kc::ActType act = act_type(w.desc->activation);
    const kc::MoeRoute r = route();
    for (int64_t r0 = 0; r0 < rows; r0 += kc::kMaxBatch) {
      const int n = static_cast<int>(std::min<int64_t>(kc::kMaxBatch, rows - r0)), pairs = n * k;
      const float* chunk = in + r0 * c.dim;
      w.linear(Role::router)->matmul(chunk, n, f(moe_logits), stream);
      if (on(kPartSwiglu))
        kc::launch_moe_route(f(moe_logits), static_cast<int>(spec.n_experts), k, spec.renormalise, n, r, stream);
      const kc::CudaExperts::Groups groups{r.group_expert, r.group_start, r.group_count, pairs};
      kc::CudaExperts::Groups gathered = groups;
      gathered.x_rows = r.pair_row;
      w.expert_gate_up->grouped_matmul(chunk, gathered, n, f(moe_gu), stream);
      if (on(kPartSwiglu))
        kc::launch_activation(act, f(moe_gu), f(moe_gu) + ih, nullptr, 2 * ih, f(moe_h), pairs, ih, stream);
      w.expert_down->grouped_matmul(f(moe_h), groups, n, f(moe_y), stream);
      if (on(kPartSwiglu)) kc::launch_moe_combine(f(moe_y), c.dim, r, n, k, out + r0 * c.dim, stream);
    }
  }

  void reserve(int64_t capacity) {
    if (capacity < 1 || capacity > c.max_seq)
      fail(Errc::limit, "[cuda_model] KV capacity {} outside [1, {}]", capacity, c.max_seq);
    if (capacity <= o.capacity && layers.front().keys.size()) return;
    drop_graphs();  // the graphs hold the old cache's addresses
    const size_t elem = o.kv_type == KvType::f32 ? 4 : 2;
    const uint64_t bytes_per_layer =
        checked_mul(checked_mul(static_cast<uint64_t>(o.slots), static_cast<uint64_t>(capacity), "[cuda_model] kv"),
                    static_cast<uint64_t>(c.kv_dim()) * elem, "[cuda_model] kv");
    for (Layer& w : layers) {
      w.keys = kc::DeviceBuffer();
      w.values = kc::DeviceBuffer();
      w.keys = kc::DeviceBuffer(bytes_per_layer);
      w.values = kc::DeviceBuffer(bytes_per_layer);
      w.keys.fill(0);
      w.values.fill(0);
    }
    o.capacity = capacity;
    kc::synchronize("cuda_model reserve");  // the fills ran on the default stream
  }

  kc::ArgmaxScratch argmax_scratch() const {
    return {f(argmax_values), i(argmax_indices), argmax_counters.as<uint32_t>()};
  }

  kc::KvLayer kv(const Layer& w) const { return {w.keys.data(), w.values.data(), elem_type(o.kv_type), o.capacity}; }

  // The q/k/v row layout: one fused row [q | k | v] per row, or three [R, width] blocks.
  kc::QkvArgs qkv_args(const Layer& w) const {
    kc::QkvArgs a;
    const int64_t qd = c.q_dim(), kd = c.kv_dim();
    float* base = f(qkv);
    if (w.linear(Role::qkv)) {
      a.q = base;
      a.k = base + qd;
      a.v = base + qd + kd;
      a.q_stride = a.k_stride = a.v_stride = qd + 2 * kd;
    } else {
      a.q = base;
      a.k = base + row_capacity * qd;
      a.v = a.k + row_capacity * kd;
      a.q_stride = qd;
      a.k_stride = a.v_stride = kd;
    }
    a.q_bias = w.vector(Role::q_bias);
    a.k_bias = w.vector(Role::k_bias);
    a.v_bias = w.vector(Role::v_bias);
    a.q_norm = w.vector(Role::q_norm);
    a.k_norm = w.vector(Role::k_norm);
    a.norm_unit_offset = w.desc->norm == NormKind::rms_unit_offset;
    const AttentionSpec& spec = w.desc->attention;
    a.rope_dims = static_cast<int>(spec.rope_dims);  // 0: no rotation
    a.inv_freq = a.rope_dims > 0 ? f(rope_tables[static_cast<size_t>(spec.rope)]) : nullptr;
    a.n_heads = static_cast<int>(c.n_heads);
    a.n_kv_heads = static_cast<int>(c.n_kv_heads);
    a.head_dim = static_cast<int>(c.head_dim);
    a.interleaved = desc.rope_style == RopeStyle::interleaved;
    a.eps = desc.norm_eps;
    a.scale = spec.scale;
    a.softcap = spec.softcap;
    a.window = spec.window;
    a.causal = spec.causal;
    return a;
  }

  // A prefill pass (enqueue's `pass`): its rows sit at positions first_pos.. of `slot`; the LM head runs on the
  // rows `head` names (the last row's logits land in logits row 0).
  struct Pass {
    int64_t first_pos = 0;
    int32_t slot = 0;
    Logits head = Logits::none;
    bool rows_given = false;  // x holds the pass's input rows (prefill_rows): no embedding gather
  };

  // y = x @ W^T for `rows` rows: the decode matvec, or the prefill GEMM in a pass.
  void project(const kc::CudaLinear& w, const float* in, int64_t rows, float* out, const Pass* pass) const {
    if (pass) {
      w.gemm(in, rows, out, stream);
    } else {
      w.matmul(in, static_cast<int>(rows), out, stream);
    }
  }

  // out = attention(in): the q/k/v (or fused) projections, bias + head norms + RoPE + cache append, the attention
  // kernel, the o projection (and its bias).
  void attention(const Layer& w, const float* in, float* out, int64_t rows, const Pass* pass) {
    const kc::QkvArgs a = qkv_args(w);
    if (const kc::CudaLinear* fused = w.linear(Role::qkv)) {
      project(*fused, in, rows, f(qkv), pass);
    } else {
      float* k = f(qkv) + row_capacity * c.q_dim();
      project(*w.linear(Role::q), in, rows, f(qkv), pass);
      project(*w.linear(Role::k), in, rows, k, pass);
      project(*w.linear(Role::v), in, rows, k + row_capacity * c.kv_dim(), pass);
    }
    const int n = static_cast<int>(rows);
    if (pass) {
      if (on(kPartRope)) kc::launch_qkv_prepare(a, kv(w), i(pos), i(slot), n, stream);
      if (on(kPartAttention)) kc::launch_prefill_attention(a, kv(w), pass->slot, pass->first_pos, n, f(att), stream);
    } else {
      // Rows in distinct slots (decode) let the attention kernel prepare q, k and v itself.
      if (on(kPartRope) && !distinct_slots) kc::launch_qkv_prepare(a, kv(w), i(pos), i(slot), n, stream);
      if (on(kPartAttention))
        kc::launch_decode_attention(a, kv(w), i(pos), i(slot), n, distinct_slots && on(kPartRope),
                                    {f(attention_partials), attention_counters.as<uint32_t>()}, f(att), stream);
    }
    project(*w.linear(Role::o), f(att), rows, out, pass);
    if (const float* bias = w.vector(Role::o_bias); bias && on(kPartAttention))
      kc::launch_add_bias(out, bias, n, c.dim, stream);
  }

  // out = mlp(in): gate and up (fused, stacked or apart; up alone for a plain GELU MLP), the activation, down (and
  // its bias).
  void mlp(const Layer& w, const float* in, float* out, int64_t rows, const Pass* pass) {
    const int64_t h = c.hidden_dim;
    const int n = static_cast<int>(rows);
    const kc::ActType act = act_type(w.desc->activation);
    const float* up_bias = w.vector(Role::up_bias);
    if (const kc::CudaLinear* fused = w.linear(Role::gate_up)) {
      project(*fused, in, rows, f(gu), pass);
      if (on(kPartSwiglu)) kc::launch_activation(act, f(gu), f(gu) + h, up_bias, 2 * h, f(hb), n, h, stream);
    } else if (act == kc::ActType::gelu_erf) {
      project(*w.linear(Role::up), in, rows, f(gu), pass);
      if (on(kPartSwiglu)) kc::launch_activation(act, nullptr, f(gu), up_bias, h, f(hb), n, h, stream);
    } else {
      float* up_out = f(gu) + row_capacity * h;
      project(*w.linear(Role::gate), in, rows, f(gu), pass);
      project(*w.linear(Role::up), in, rows, up_out, pass);
      if (on(kPartSwiglu)) kc::launch_activation(act, f(gu), up_out, up_bias, h, f(hb), n, h, stream);
    }
    project(*w.linear(Role::down), f(hb), rows, out, pass);
    if (const float* bias = w.vector(Role::down_bias); bias && on(kPartSwiglu))
      kc::launch_add_bias(out, bias, n, c.dim, stream);
  }

  // Runs every layer's ops (family.h) over the registers x (the residual stream, buffer x) and h (the branch: the
  // buffer xb or proj, whichever the last op wrote), then the final norm and the LM head. An `add` is held back
  // and fused into the next norm of x as its residual add (every layer's last add meets the next layer's first
  // norm, or the final norm); before any other op it runs on its own. A norm of h (a post-norm) runs in place.
  // A decode step (no `pass`) runs the LM head on every row.
  void enqueue(int64_t rows, const Pass* pass) {
    const int n = static_cast<int>(rows);
    if (on(kPartNorm) && !(pass && pass->rows_given)) {
      kc::launch_embed_gather(embed.data.data(), embed.type, vocab.begin, vocab_rows(), c.dim, i(tokens),
                              desc.embed_scale, n, f(x), stream);
      if (vocab_split()) o.all_reduce(f(x), static_cast<size_t>(n) * static_cast<size_t>(c.dim), stream);
    }
    float* h = nullptr;
    bool add_pending = false;  // x += h, not launched yet
    const auto flush_add = [&] {
      if (add_pending && on(kPartNorm)) kc::launch_add(f(x), h, n, c.dim, stream);
      add_pending = false;
    };
    // h = norm(x), after the pending residual add.
    const auto norm_x = [&](NormKind kind, const float* weight, const float* bias) {
      if (on(kPartNorm))
        kc::launch_norm(norm_type(kind), f(x), add_pending ? h : nullptr, weight, bias, f(xb), n, c.dim,
                        desc.norm_eps, stream);
      add_pending = false;
      h = f(xb);
    };
    const auto other = [&](const float* p) { return p == f(xb) ? f(proj) : f(xb); };
    for (const Layer& w : layers) {
      const NormKind kind = w.desc->norm;
      for (const Op& op : w.desc->ops) {
        switch (op.kind) {
          case Op::Kind::norm:
            if (op.in == Reg::x) {
              norm_x(kind, w.vector(op.weight), w.vector(op.bias));
            } else {
              flush_add();
              if (on(kPartNorm))
                kc::launch_norm(norm_type(kind), h, nullptr, w.vector(op.weight), w.vector(op.bias), h, n, c.dim,
                                desc.norm_eps, stream);
            }
            break;
          case Op::Kind::attention: {
            flush_add();
            float* out = other(h);
            attention(w, h, out, rows, pass);
            h = out;
            break;
          }
          case Op::Kind::mlp: {
            flush_add();
            float* out = other(h);
            mlp(w, h, out, rows, pass);
            h = out;
            break;
          }
          case Op::Kind::add:
            flush_add();
            add_pending = true;
            break;
          case Op::Kind::moe: {
            flush_add();
            float* out = other(h);
            moe(w, h, out, rows);
            h = out;
            break;
          }
          case Op::Kind::all_reduce:
            o.all_reduce(h, static_cast<size_t>(n) * static_cast<size_t>(c.dim), stream);
            break;
        }
      }
    }
    norm_x(desc.final_norm, f(final_norm), as<float>(final_norm_bias));
    const Logits head = pass ? pass->head : Logits::all;
    if (head != Logits::none) {
      const int64_t out_rows = head == Logits::all ? rows : 1;
      const float* in = f(xb) + (head == Logits::all ? 0 : (rows - 1) * c.dim);
      if (!vocab_split()) {
        project(*lm_head, in, out_rows, f(logits), head == Logits::all ? pass : nullptr);
      } else {
        // The rank's vocabulary columns of zeroed rows, then their sum over the ranks: the whole logits.
        project(*lm_head, in, out_rows, f(head_out), head == Logits::all ? pass : nullptr);
        const size_t row_bytes = static_cast<size_t>(c.vocab) * sizeof(float);
        const size_t part_bytes = static_cast<size_t>(vocab_rows()) * sizeof(float);
        check(cudaMemsetAsync(logits.data(), 0, static_cast<size_t>(out_rows) * row_bytes, stream), "zero logits");
        check(cudaMemcpy2DAsync(f(logits) + vocab.begin, row_bytes, head_out.data(), part_bytes, part_bytes,
                                static_cast<size_t>(out_rows), cudaMemcpyDeviceToDevice, stream),
              "place logits");
        o.all_reduce(f(logits), static_cast<size_t>(out_rows) * static_cast<size_t>(c.vocab), stream);
      }
      if (desc.final_softcap > 0.0f) kc::launch_softcap(f(logits), out_rows * c.vocab, desc.final_softcap, stream);
    }
    kc::check_last_error("cuda_model step");
  }

  // The first step of a batch size runs eagerly (loading modules), then its graph is captured for later steps.
  void run_step(int batch) {
    if (!o.use_graphs) return enqueue(batch, nullptr);
    cudaGraphExec_t& exec = graphs[batch][distinct_slots ? 1 : 0];
    if (exec) {
      check(cudaGraphLaunch(exec, stream), "graph launch");
      return;
    }
    enqueue(batch, nullptr);
    cudaGraph_t graph = nullptr;
    check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
    try {
      enqueue(batch, nullptr);
    } catch (...) {
      cudaStreamEndCapture(stream, &graph);
      if (graph) cudaGraphDestroy(graph);
      throw;
    }
    check(cudaStreamEndCapture(stream, &graph), "end capture");
    const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    check(status, "graph instantiate");
  }

  void set_rows(std::span<const int32_t> t, std::span<const int32_t> p, std::span<const int32_t> s) {
    if (c.vocab == 0 || bidirectional)
      fail(Errc::unsupported,
           "[cuda_model] decode steps of a model without a vocabulary or with bidirectional "
           "attention (an encoder: prefill_rows)");
    const size_t n = t.size();
    if (n < 1 || n > static_cast<size_t>(o.max_batch) || p.size() != n || s.size() != n)
      fail(Errc::internal, "[cuda_model] {} tokens, {} positions, {} slots for at most {} rows", n, p.size(),
           s.size(), o.max_batch);
    for (size_t r = 0; r < n; ++r) {
      if (t[r] < 0 || t[r] >= c.vocab) fail(Errc::limit, "[cuda_model] token {} outside [0, {})", t[r], c.vocab);
      if (p[r] < 0 || p[r] >= o.capacity)
        fail(Errc::limit, "[cuda_model] position {} outside the context of {}", p[r], o.capacity);
      if (s[r] < 0 || s[r] >= o.slots) fail(Errc::internal, "[cuda_model] slot {} outside [0, {})", s[r], o.slots);
    }
    const size_t bytes = n * sizeof(int32_t);
    check(cudaMemcpyAsync(tokens.data(), t.data(), bytes, cudaMemcpyHostToDevice, stream), "upload tokens");
    check(cudaMemcpyAsync(pos.data(), p.data(), bytes, cudaMemcpyHostToDevice, stream), "upload positions");
    check(cudaMemcpyAsync(slot.data(), s.data(), bytes, cudaMemcpyHostToDevice, stream), "upload slots");
    host_pos.assign(p.begin(), p.end());
    host_slot.assign(s.begin(), s.end());
    std::vector<int32_t> sorted = host_slot;
    std::sort(sorted.begin(), sorted.end());
    distinct_slots = std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end();
    last_batch = static_cast<int>(n);
  }

  // Uploads every weight (the constructor's work; on the rank's GPU).
  void load(const ModelConfig& config, ModelDesc d, const TensorLookup& lookup, const CudaModelOptions& options,
            codec::Range vocab_held, codec::Range experts_held) {
    c = config;
    desc = std::move(d);
    o = options;
    vocab = vocab_held;
    experts = experts_held;
    if (o.slots == 0) o.slots = options.max_batch;
    if (options.max_batch < 1 || options.max_batch > kc::kMaxBatch)
      fail(Errc::usage, "[cuda_model] batch {} outside [1, {}]", options.max_batch, kc::kMaxBatch);
    if (o.slots < 1) fail(Errc::usage, "[cuda_model] {} KV slots", o.slots);
    if (options.prefill_rows < 1) fail(Errc::usage, "[cuda_model] {} prefill rows", options.prefill_rows);
    o.prefill_rows = std::min(options.prefill_rows, c.max_seq);
    row_capacity = std::max<int64_t>(o.max_batch, o.prefill_rows);
    if (c.head_dim > 256 || c.head_dim % 2 != 0)
      fail(Errc::unsupported, "[cuda_model] head_dim {} (the GPU attention takes even head_dim <= 256)", c.head_dim);
    if (!kc::norm_supports(c.dim))
      fail(Errc::unsupported, "[cuda_model] dim {} (the GPU norms take multiples of 4 up to 16384)", c.dim);
    if (std::ssize(desc.layers) != c.n_layers)
      fail(Errc::internal, "[cuda_model] {} layer descriptions for {} layers", desc.layers.size(), c.n_layers);
    if (vocab_split() && !o.all_reduce)
      fail(Errc::internal, "[cuda_model] vocabulary rows {}..{} of {} without an all-reduce", vocab.begin, vocab.end,
           c.vocab);
    bool h_written = false;
    for (int64_t l = 0; l < c.n_layers; ++l)
      check_layer(desc.layers[static_cast<size_t>(l)], desc, c, l, bool(o.all_reduce), h_written);
    std::string why;
    if (!kc::device_available(&why)) fail(Errc::unsupported, "[cuda_model] no usable CUDA device: {}", why);
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
    if (c.vocab > 0) {
      const std::string embed_name(kEmbedTensor), head_name(c.tied_embeddings ? kEmbedTensor : kLmHeadTensor);
      embed = upload_embedding(require(lookup, embed_name, {vocab_rows(), c.dim}), vocab_rows(), c.dim);
      lm_head = prepare(require(lookup, head_name, {vocab_rows(), c.dim}), head_name);
    }
    bidirectional =
        std::any_of(desc.layers.begin(), desc.layers.end(), [](const LayerDesc& l) { return !l.attention.causal; });
    final_norm = upload_floats(codec::decode_all(require(lookup, std::string(kFinalNormTensor), {c.dim})));
    const std::string final_bias_name(kFinalNormBiasTensor);
    if (desc.final_norm == NormKind::layer && lookup(final_bias_name))
      final_norm_bias = upload_floats(codec::decode_all(require(lookup, final_bias_name, {c.dim})));
    for (int64_t l = 0; l < c.n_layers; ++l)
      layers.push_back(load_layer(lookup, c, desc.layers[static_cast<size_t>(l)], l, experts));
    for (const std::vector<float>& table : desc.rope_inv_freq) rope_tables.push_back(upload_floats(table));
    bytes = lm_head ? lm_head->weight_bytes() : 0;
    for (const Layer& w : layers) bytes += layer_bytes(w);
    allocate_activations();
    const int64_t capacity = options.capacity > 0 ? options.capacity : std::min<int64_t>(c.max_seq, 256);
    o.capacity = 0;
    reserve(capacity);
    kc::synchronize("cuda_model load");
  }

  void synchronize() const {
    check(cudaStreamSynchronize(stream), "synchronize");
    kc::check_last_error("cuda_model");
  }

  // CudaModel::prefill (`ids`) or prefill_rows (`rows_in`, [n, dim]) on this rank; `out` (host) may be null: the
  // logits are computed but not copied back.
  void prefill(std::span<const int32_t> ids, std::span<const float> rows_in, int64_t first, int32_t slot_id,
               Logits which, float* out) {
    const bool given = ids.empty();
    const auto n = given ? static_cast<int64_t>(rows_in.size()) / c.dim : static_cast<int64_t>(ids.size());
    if (given && static_cast<int64_t>(rows_in.size()) != n * c.dim)
      fail(Errc::internal, "[cuda_model] {} input values are not rows of {}", rows_in.size(), c.dim);
    if (n < 1 || first < 0 || first + n > o.capacity)
      fail(Errc::limit, "[cuda_model] prefill of positions {}..{} exceeds the context of {}", first, first + n,
           o.capacity);
    if (bidirectional && (first != 0 || n > o.prefill_rows))
      fail(Errc::limit,
           "[cuda_model] bidirectional attention takes a whole sequence in one pass from position 0 (at most {} "
           "rows): {} rows from position {}",
           o.prefill_rows, n, first);
    if (slot_id < 0 || slot_id >= o.slots)
      fail(Errc::internal, "[cuda_model] slot {} outside [0, {})", slot_id, o.slots);
    if (c.vocab == 0 && which != Logits::none)
      fail(Errc::internal, "[cuda_model] logits of a model without a vocabulary");
    for (const int32_t t : ids)
      if (t < 0 || t >= c.vocab) fail(Errc::limit, "[cuda_model] token {} outside [0, {})", t, c.vocab);
    const size_t row_bytes = static_cast<size_t>(c.vocab) * sizeof(float);
    std::vector<int32_t> positions, slots;
    for (int64_t off = 0; off < n; off += o.prefill_rows) {
      const int64_t rows = std::min(o.prefill_rows, n - off);
      positions.resize(static_cast<size_t>(rows));
      std::iota(positions.begin(), positions.end(), static_cast<int32_t>(first + off));
      slots.assign(static_cast<size_t>(rows), slot_id);
      const size_t bytes_in = static_cast<size_t>(rows) * sizeof(int32_t);
      if (given) {
        check(cudaMemcpyAsync(x.data(), rows_in.data() + off * c.dim, static_cast<size_t>(rows * c.dim) * sizeof(float),
                              cudaMemcpyHostToDevice, stream),
              "upload rows");
      } else {
        check(cudaMemcpyAsync(tokens.data(), ids.data() + off, bytes_in, cudaMemcpyHostToDevice, stream),
              "upload tokens");
      }
      check(cudaMemcpyAsync(pos.data(), positions.data(), bytes_in, cudaMemcpyHostToDevice, stream),
            "upload positions");
      check(cudaMemcpyAsync(slot.data(), slots.data(), bytes_in, cudaMemcpyHostToDevice, stream), "upload slots");
      const bool final_pass = off + rows == n;
      const Pass pass{.first_pos = first + off,
                      .slot = slot_id,
                      .head = which == Logits::all ? Logits::all
                              : final_pass         ? which
                                                   : Logits::none,
                      .rows_given = given};
      enqueue(rows, &pass);
      if (pass.head == Logits::none || !out) continue;
      const int64_t copied = pass.head == Logits::all ? rows : 1;
      check(cudaMemcpyAsync(out + (pass.head == Logits::all ? off : 0) * c.vocab, logits.data(),
                            static_cast<size_t>(copied) * row_bytes, cudaMemcpyDeviceToHost, stream),
            "download logits");
      synchronize();
    }
    synchronize();
    last_rows = n - (n - 1) / o.prefill_rows * o.prefill_rows;
    // The device rows now hold the prefill's inputs: decoding starts from step() or set_rows().
    last_batch = 0;
    host_pos.clear();
    host_slot.clear();
  }

  void decode_greedy(int batch, int64_t steps) {
    if (batch < 1 || batch > last_batch)
      fail(Errc::internal, "[cuda_model] decode of {} rows after inputs for {}", batch, last_batch);
    const int64_t last = *std::max_element(host_pos.begin(), host_pos.begin() + batch);
    if (steps < 0 || last + steps > o.capacity)
      fail(Errc::limit, "[cuda_model] {} steps from position {} exceed the context of {}", steps, last, o.capacity);
    for (int64_t s = 0; s < steps; ++s) {
      run_step(batch);
      kc::launch_argmax(f(logits), c.vocab, batch, argmax_scratch(), i(next), i(tokens), i(pos), stream);
    }
    kc::check_last_error("cuda_model decode_greedy");
    for (int b = 0; b < batch; ++b) host_pos[b] += static_cast<int32_t>(steps);
  }

  void set_skipped_parts(unsigned parts) {
    if (skipped == parts) return;
    synchronize();
    drop_graphs();
    skipped = parts;
  }
};

}  // namespace

// The ranks, each driven from a host thread of its own on its GPU (one rank: the caller's thread and device).
struct CudaModel::Impl {
  ModelConfig config;  // the whole model's
  std::vector<std::unique_ptr<Rank>> ranks;
  std::vector<int> devices;  // the GPU of each rank; empty: one rank on the current device

  Rank& lead() const { return *ranks.front(); }

  // fn(rank r, r) on every rank: on the caller's thread for one rank, else on a thread per rank; the rank's GPU
  // current. The first error is rethrown after every thread has ended.
  template <class Fn>
  void each(Fn&& fn) const {
    if (ranks.size() == 1) {
      if (!devices.empty()) check(cudaSetDevice(devices.front()), "set device");
      return fn(*ranks.front(), 0);
    }
    std::vector<std::exception_ptr> errors(devices.size());
    std::vector<std::thread> threads;
    for (size_t r = 0; r < devices.size(); ++r)
      threads.emplace_back([&, r] {
        try {
          check(cudaSetDevice(devices[r]), "set device");
          fn(*ranks[r], static_cast<int>(r));
        } catch (...) {
          errors[r] = std::current_exception();
        }
      });
    for (std::thread& t : threads) t.join();
    for (const std::exception_ptr& e : errors)
      if (e) std::rethrow_exception(e);
  }

  // fn(lead rank) on the caller's thread, its GPU made current.
  template <class Fn>
  auto on_lead(Fn&& fn) const {
    if (!devices.empty()) check(cudaSetDevice(devices.front()), "set device");
    return fn(lead());
  }
};

CudaModel::CudaModel(const ModelConfig& config, const TensorLookup& lookup, const CudaModelOptions& options)
    : CudaModel(config, describe_model(config, "[cuda_model]"), lookup, options) {}

CudaModel::CudaModel(const ModelConfig& config, ModelDesc desc, const TensorLookup& lookup,
                     const CudaModelOptions& options)
    : impl_(std::make_unique<Impl>()) {
  impl_->config = config;
  impl_->ranks.push_back(std::make_unique<Rank>());
  impl_->lead().load(config, std::move(desc), lookup, options, {0, config.vocab}, {0, config.n_experts});
}

CudaModel::CudaModel(const ModelConfig& config, TensorParallel tp, const CudaModelOptions& options)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  if (tp.ranks.empty()) fail(Errc::internal, "[cuda_model] tensor parallelism over no ranks");
  m.config = config;
  for (const CudaRank& r : tp.ranks) {
    m.devices.push_back(r.device);
    m.ranks.push_back(std::make_unique<Rank>());
  }
  m.each([&](Rank& rank, int r) {
    CudaRank& mine = tp.ranks[static_cast<size_t>(r)];
    CudaModelOptions own = options;
    own.all_reduce = std::move(mine.all_reduce);
    rank.load(mine.tensors.config, tp.desc, mine.tensors.tensors, own, mine.tensors.vocab, mine.tensors.experts);
  });
}

std::unique_ptr<CudaModel> make_cuda_model(const ModelConfig& config, const ModelDesc& desc, const TensorLookup& lookup,
                                           std::span<const int> devices, const CudaModelOptions& options,
                                           std::string_view source) {
  if (devices.empty()) return std::make_unique<CudaModel>(config, desc, lookup, options);
  return std::make_unique<CudaModel>(config, tensor_parallel(config, desc, lookup, devices, source), options);
}

CudaModel::~CudaModel() {
  // A rank's graphs, stream and buffers go with its GPU current.
  for (size_t r = 0; r < impl_->devices.size(); ++r) {
    cudaSetDevice(impl_->devices[r]);
    impl_->ranks[r].reset();
  }
}

const ModelConfig& CudaModel::config() const { return impl_->config; }
const CudaModelOptions& CudaModel::options() const { return impl_->lead().o; }

uint64_t CudaModel::weight_bytes() const {
  uint64_t bytes = 0;
  for (const auto& r : impl_->ranks) bytes += r->bytes;
  return bytes;
}

void CudaModel::reserve(int64_t capacity) {
  impl_->each([&](Rank& r, int) { r.reserve(capacity); });
}

void CudaModel::set_rows(std::span<const int32_t> tokens, std::span<const int32_t> pos,
                         std::span<const int32_t> slot) {
  impl_->each([&](Rank& r, int) { r.set_rows(tokens, pos, slot); });
}

void CudaModel::step(std::span<const int32_t> tokens, std::span<const int32_t> pos, std::span<const int32_t> slot) {
  impl_->each([&](Rank& r, int) {
    r.set_rows(tokens, pos, slot);
    r.run_step(r.last_batch);
  });
}

void CudaModel::prefill(std::span<const int32_t> tokens, int64_t pos, int32_t slot, Logits which, float* logits) {
  if (tokens.empty()) fail(Errc::limit, "[cuda_model] prefill of no tokens");
  impl_->each([&](Rank& r, int rank) { r.prefill(tokens, {}, pos, slot, which, rank == 0 ? logits : nullptr); });
}

void CudaModel::prefill_rows(std::span<const float> x, int64_t pos, int32_t slot, Logits which, float* logits) {
  if (x.empty()) fail(Errc::limit, "[cuda_model] prefill of no rows");
  impl_->each([&](Rank& r, int rank) { r.prefill({}, x, pos, slot, which, rank == 0 ? logits : nullptr); });
}

void CudaModel::download_hidden(int64_t row_begin, int64_t row_end, float* out) const {
  impl_->on_lead([&](const Rank& m) {
    if (row_begin < 0 || row_begin > row_end || row_end > m.last_rows)
      fail(Errc::internal, "[cuda_model] hidden rows {}..{} of the last pass's {}", row_begin, row_end, m.last_rows);
    const size_t row_bytes = static_cast<size_t>(m.c.dim) * sizeof(float);
    check(cudaMemcpyAsync(out, m.xb.as<std::byte>() + row_begin * row_bytes,
                          static_cast<size_t>(row_end - row_begin) * row_bytes, cudaMemcpyDeviceToHost, m.stream),
          "download hidden");
    m.synchronize();
  });
}

void CudaModel::decode_greedy(int batch, int64_t steps) {
  impl_->each([&](Rank& r, int) { r.decode_greedy(batch, steps); });
}

void CudaModel::download_logits(int row_begin, int row_end, float* out) const {
  impl_->on_lead([&](const Rank& m) {
    if (row_begin < 0 || row_begin > row_end || row_end > m.row_capacity)
      fail(Errc::internal, "[cuda_model] logits rows {}..{} of {}", row_begin, row_end, m.row_capacity);
    const size_t row_bytes = static_cast<size_t>(m.c.vocab) * sizeof(float);
    check(cudaMemcpyAsync(out, m.logits.as<std::byte>() + row_begin * row_bytes, (row_end - row_begin) * row_bytes,
                          cudaMemcpyDeviceToHost, m.stream),
          "download logits");
    m.synchronize();
  });
}

void CudaModel::argmax(int batch, std::span<int32_t> out) const {
  impl_->on_lead([&](const Rank& m) {
    kc::launch_argmax(m.f(m.logits), m.c.vocab, batch, m.argmax_scratch(), m.i(m.next), nullptr, nullptr, m.stream);
    kc::check_last_error("cuda_model argmax");
    check(cudaMemcpyAsync(out.data(), m.next.data(), batch * sizeof(int32_t), cudaMemcpyDeviceToHost, m.stream),
          "download argmax");
    m.synchronize();
  });
}

void CudaModel::download_tokens(int batch, std::span<int32_t> out) const {
  impl_->on_lead([&](const Rank& m) {
    check(cudaMemcpyAsync(out.data(), m.tokens.data(), batch * sizeof(int32_t), cudaMemcpyDeviceToHost, m.stream),
          "download tokens");
    m.synchronize();
  });
}

void CudaModel::set_skipped_parts(unsigned parts) {
  impl_->each([&](Rank& r, int) { r.set_skipped_parts(parts); });
}

void CudaModel::synchronize() const {
  impl_->each([](Rank& r, int) { r.synchronize(); });
}

}  // namespace lowbit::model
