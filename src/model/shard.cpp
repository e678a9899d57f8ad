// Tensor parallelism from the description (shard.h): the shard plan, a rank's model cut from the full one, and the
// CPU simulation of a group of ranks.
#include "lowbit/model/shard.h"

#include <algorithm>
#include <barrier>
#include <exception>
#include <map>
#include <thread>

#include <fmt/format.h>

#include "lowbit/core/error.h"

namespace lowbit::model {

namespace {

bool split_dim(Dim d) {
  return d == Dim::q_dim || d == Dim::kv_dim || d == Dim::qkv_dim || d == Dim::hidden || d == Dim::gate_up_dim;
}

// Rank r's share [r n / R, (r + 1) n / R) of n things.
codec::Range share(int64_t n, int rank, int ranks) { return {n * rank / ranks, n * (rank + 1) / ranks}; }

// Rows [begin, end) of a [rows, ...] vector.
std::vector<float> slice_vector(const std::vector<float>& v, std::span<const codec::Range> ranges) {
  std::vector<float> out;
  for (const codec::Range& r : ranges) out.insert(out.end(), v.begin() + r.begin, v.begin() + r.end);
  return out;
}

// All-reduce by summing in rank order: every rank posts its buffer, rank 0 sums them, every rank copies the sum.
class LocalComm final : public Communicator {
 public:
  struct State {
    explicit State(int ranks) : sync(ranks), buffers(static_cast<size_t>(ranks)), sizes(static_cast<size_t>(ranks)) {}
    std::barrier<> sync;
    std::vector<float*> buffers;
    std::vector<size_t> sizes;
    std::vector<float> sum;
    bool mismatch = false;
  };
  LocalComm(std::shared_ptr<State> state, int rank) : state_(std::move(state)), rank_(rank) {}
  int rank() const override { return rank_; }
  int ranks() const override { return static_cast<int>(state_->buffers.size()); }
  void all_reduce(float* data, size_t n) override {
    State& s = *state_;
    s.buffers[static_cast<size_t>(rank_)] = data;
    s.sizes[static_cast<size_t>(rank_)] = n;
    s.sync.arrive_and_wait();
    if (rank_ == 0) {
      s.mismatch = std::any_of(s.sizes.begin(), s.sizes.end(), [n](size_t k) { return k != n; });
      if (!s.mismatch) {
        s.sum.assign(data, data + n);
        for (size_t r = 1; r < s.buffers.size(); ++r)
          for (size_t i = 0; i < n; ++i) s.sum[i] += s.buffers[r][i];
      }
    }
    s.sync.arrive_and_wait();
    const bool mismatch = s.mismatch;
    if (!mismatch) std::copy(s.sum.begin(), s.sum.end(), data);
    s.sync.arrive_and_wait();
    if (mismatch) fail(Errc::internal, "[all_reduce] rank {}: the ranks reduce buffers of different sizes", rank_);
  }

 private:
  std::shared_ptr<State> state_;
  int rank_;
};

}  // namespace

Split split_of(const TensorSpec& t, const LayerDesc& layer) {
  if (t.expert >= 0) return Split::by_expert;
  if (split_dim(t.rows)) return Split::rows;
  if (t.linear() && split_dim(t.cols)) return Split::cols;
  // A [dim] vector no norm op reads is the bias added after a row-parallel linear (o_bias, down_bias): once.
  const bool norm_reads = std::any_of(layer.ops.begin(), layer.ops.end(), [&](const Op& op) {
    return op.kind == Op::Kind::norm && (op.weight == t.role || op.bias == t.role);
  });
  if (!t.linear() && t.rows == Dim::dim && !norm_reads) return Split::first_rank;
  return Split::replicated;
}

std::vector<codec::Range> dim_ranges(Dim d, const ModelConfig& c, int rank, int ranks) {
  const auto heads = [&](int64_t n, int64_t offset) {
    const codec::Range h = share(n, rank, ranks);
    return codec::Range{offset + h.begin * c.head_dim, offset + h.end * c.head_dim};
  };
  const codec::Range hidden = share(c.hidden_dim, rank, ranks);
  switch (d) {
    case Dim::q_dim: return {heads(c.n_heads, 0)};
    case Dim::kv_dim: return {heads(c.n_kv_heads, 0)};
    case Dim::qkv_dim:
      return {heads(c.n_heads, 0), heads(c.n_kv_heads, c.q_dim()), heads(c.n_kv_heads, c.q_dim() + c.kv_dim())};
    case Dim::hidden: return {hidden};
    case Dim::gate_up_dim: return {hidden, {c.hidden_dim + hidden.begin, c.hidden_dim + hidden.end}};
    default: return {{0, dim_size(d, c)}};
  }
}

void check_shardable(const ModelConfig& c, int ranks, std::string_view source) {
  if (ranks < 1) fail(Errc::usage, "[shard_model] {}: {} ranks", source, ranks);
  if (c.n_kv_heads % ranks != 0)
    fail(Errc::usage, "[shard_model] {}: {} KV heads do not split over {} devices", source, c.n_kv_heads, ranks);
  if (c.hidden_dim % ranks != 0)
    fail(Errc::usage, "[shard_model] {}: the MLP width {} does not split over {} devices", source, c.hidden_dim, ranks);
  if (c.vocab < ranks)
    fail(Errc::usage, "[shard_model] {}: a vocabulary of {} does not split over {} devices", source, c.vocab, ranks);
}

ModelConfig shard_config(const ModelConfig& c, int rank, int ranks) {
  ModelConfig r = c;
  const auto width = [&](int64_t n) {
    const codec::Range s = share(n, rank, ranks);
    return s.end - s.begin;
  };
  r.n_heads = width(c.n_heads);
  r.n_kv_heads = width(c.n_kv_heads);
  r.hidden_dim = width(c.hidden_dim);
  return r;
}

ModelDesc shard_desc(const ModelDesc& d) {
  ModelDesc out = d;
  for (LayerDesc& layer : out.layers) {
    std::vector<Op> ops;
    for (const Op& op : layer.ops) {
      ops.push_back(op);
      if (op.kind == Op::Kind::attention || op.kind == Op::Kind::mlp || op.kind == Op::Kind::moe)
        ops.push_back({Op::Kind::all_reduce});
    }
    layer.ops = std::move(ops);
  }
  return out;
}

std::unique_ptr<Model> shard_model(const Model& full, int rank, int ranks, std::shared_ptr<Communicator> comm,
                                   std::string_view source) {
  full.require_stored_arrays("shard_model");
  const ModelConfig& c = full.config;
  check_shardable(c, ranks, source);
  if (rank < 0 || rank >= ranks || !comm || comm->rank() != rank || comm->ranks() != ranks)
    fail(Errc::internal, "[shard_model] rank {} of {} with a communicator of rank {} of {}", rank, ranks,
         comm ? comm->rank() : -1, comm ? comm->ranks() : 0);
  // The rank's linears come from rank_tensors, as the GPU ranks' do, copied for the CPU kernels (the source keeps
  // a layer's slices only until the next layer's).
  const RankTensors rt = rank_tensors(
      c, full.desc,
      [&full](const std::string& name) {
        const NamedTensor* t = full.find(name);
        return t ? &t->ref : nullptr;
      },
      rank, ranks, source);
  const auto prepare = [&](const std::string& name) -> std::unique_ptr<kernels::CpuLinear> {
    const codec::TensorRef* t = rt.tensors(name);
    if (!t) fail(Errc::internal, "[shard_model] {}: tensor '{}' is missing", source, name);
    const codec::Range all{0, codec::matrix_dims(t->shape).first};
    codec::SlicedTensor copy = codec::slice_tensor(*t, codec::Axis::rows, std::span(&all, 1),
                                                   fmt::format("[shard_model] {}: {}", source, name));
    return kernels::prepare_cpu_owned(*t->codec, copy.shape, std::move(copy.tensor));
  };
  auto m = std::make_unique<Model>();
  m->config = rt.config;
  m->desc = shard_desc(full.desc);
  m->shard = {.rank = rank, .ranks = ranks, .vocab_begin = rt.vocab.begin, .comm = std::move(comm)};
  m->embed = prepare(std::string(kEmbedTensor));
  m->lm_head = c.tied_embeddings ? m->embed : std::shared_ptr<kernels::CpuLinear>(prepare(std::string(kLmHeadTensor)));
  m->final_norm = full.final_norm;
  m->final_norm_bias = full.final_norm_bias;
  m->layers.resize(full.layers.size());
  for (size_t l = 0; l < full.layers.size(); ++l) {
    const LayerDesc& desc = full.desc.layers[l];
    LayerWeights& w = m->layers[l];
    if (c.n_experts > 0) w.experts.resize(full.layers[l].experts.size());
    for (const TensorSpec& t : desc.tensors) {
      const std::string name = hf_tensor_name(static_cast<int64_t>(l), t);
      const Split split = split_of(t, desc);
      if (!t.linear()) {
        const std::vector<float>& v = full.layers[l].vector(t.role);
        w.vectors[static_cast<size_t>(t.role)] = split == Split::rows
                                                     ? slice_vector(v, dim_ranges(t.rows, c, rank, ranks))
                                                 : split == Split::first_rank && rank != 0 ? std::vector<float>{}
                                                                                           : v;
        continue;
      }
      if (split == Split::by_expert && (t.expert < rt.experts.begin || t.expert >= rt.experts.end)) continue;
      w.linear_slot(t.role, t.expert) = prepare(name);
    }
  }
  return m;
}

RankTensors rank_tensors(const ModelConfig& c, const ModelDesc& d, TensorSource full, int rank, int ranks,
                         std::string_view source) {
  check_shardable(c, ranks, source);
  if (rank < 0 || rank >= ranks) fail(Errc::internal, "[shard_model] rank {} of {}", rank, ranks);
  RankTensors out{shard_config(c, rank, ranks), share(c.vocab, rank, ranks), share(c.n_experts, rank, ranks), {}};
  if (ranks == 1) {
    out.tensors = std::move(full);
    return out;
  }
  struct Layered {
    int64_t layer;
    const TensorSpec* spec;
    Split split;
  };
  // By name, each layer tensor's spec (in a copy of the description the source keeps) and split.
  auto desc = std::make_shared<const ModelDesc>(d);
  auto specs = std::make_shared<std::map<std::string, Layered, std::less<>>>();
  for (size_t l = 0; l < desc->layers.size(); ++l)
    for (const TensorSpec& t : desc->layers[l].tensors)
      specs->emplace(hf_tensor_name(static_cast<int64_t>(l), t),
                     Layered{static_cast<int64_t>(l), &t, split_of(t, desc->layers[l])});
  // The slices handed out for the layer asked for last (-1: the embedding and head), with their storage.
  struct Held {
    codec::TensorRef ref;
    std::shared_ptr<const void> storage;
  };
  struct Cache {
    int64_t layer = -2;
    std::map<std::string, Held, std::less<>> held;
  };
  auto cache = std::make_shared<Cache>();
  const std::string what(source);
  out.tensors = [c, desc, full = std::move(full), specs, cache, rank, ranks, vocab = out.vocab, experts = out.experts,
                 what](const std::string& name) -> const codec::TensorRef* {
    const bool table = name == kEmbedTensor || name == kLmHeadTensor;
    const auto it = specs->find(name);
    if (!table && it == specs->end()) return full(name);  // the final norm: replicated
    const Layered* spec = table ? nullptr : &it->second;
    if (spec && (spec->split == Split::replicated || (spec->split == Split::first_rank && rank == 0)))
      return full(name);
    if (spec && spec->split == Split::by_expert)
      return spec->spec->expert >= experts.begin && spec->spec->expert < experts.end ? full(name) : nullptr;
    const int64_t layer = spec ? spec->layer : -1;
    if (cache->layer != layer) cache->held.clear(), cache->layer = layer;
    if (const auto h = cache->held.find(name); h != cache->held.end()) return &h->second.ref;
    const codec::TensorRef* whole = full(name);
    if (!whole) return nullptr;
    const std::string context = fmt::format("[shard_model] {}: {}", what, name);
    Held held;
    if (spec && !spec->spec->linear()) {  // a vector: zeros (first rank's) or its rows
      auto kept = std::make_shared<std::vector<float>>(codec::decode_all(*whole));
      if (spec->split == Split::first_rank)
        std::fill(kept->begin(), kept->end(), 0.0f);
      else
        *kept = slice_vector(*kept, dim_ranges(spec->spec->rows, c, rank, ranks));
      held = {dense_f32_ref({static_cast<int64_t>(kept->size())}, *kept), kept};
    } else {
      const bool cols = spec && spec->split == Split::cols;
      const std::vector<codec::Range> ranges =
          !spec ? std::vector<codec::Range>{vocab}
                : dim_ranges(cols ? spec->spec->cols : spec->spec->rows, c, rank, ranks);
      auto sliced = std::make_shared<codec::SlicedTensor>(
          codec::slice_tensor(*whole, cols ? codec::Axis::cols : codec::Axis::rows, ranges, context));
      held = {codec::TensorRef{whole->codec, sliced->tensor.params, sliced->shape, sliced->tensor.views()}, sliced};
    }
    return &cache->held.emplace(name, std::move(held)).first->second.ref;
  };
  return out;
}

std::vector<std::shared_ptr<Communicator>> local_group(int ranks) {
  if (ranks < 1) fail(Errc::usage, "[local_group] {} ranks", ranks);
  auto state = std::make_shared<LocalComm::State>(ranks);
  std::vector<std::shared_ptr<Communicator>> out;
  out.reserve(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) out.push_back(std::make_shared<LocalComm>(state, r));
  return out;
}

void forward_ranks(std::span<const Model* const> ranks, std::span<KvCache* const> caches,
                   std::span<ThreadPool* const> pools, std::span<const int32_t> tokens, int64_t pos, float* logits,
                   bool all_logits) {
  if (ranks.empty() || caches.size() != ranks.size() || pools.size() != ranks.size())
    fail(Errc::internal, "[forward_ranks] {} ranks, {} caches, {} pools", ranks.size(), caches.size(), pools.size());
  const size_t n = (all_logits ? tokens.size() : 1) * static_cast<size_t>(ranks[0]->config.vocab);
  std::vector<std::vector<float>> rank_logits(ranks.size() - 1, std::vector<float>(n));
  std::vector<std::exception_ptr> errors(ranks.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < ranks.size(); ++r)
    threads.emplace_back([&, r] {
      try {
        forward(*ranks[r], *caches[r], tokens, pos, r == 0 ? logits : rank_logits[r - 1].data(), all_logits, *pools[r]);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace lowbit::model
