// ModelBuilder: checks every weight against the config and prepares the CPU kernels.
#include "lowbit/model/model.h"

#include <algorithm>

#include <fmt/format.h>

#include "lowbit/core/checked.h"
#include "lowbit/core/error.h"
#include "lowbit/core/progress.h"

namespace lowbit::model {

namespace {

// Loads of fewer weights finish in a blink and print no progress.
constexpr uint64_t kLoadProgressWeights = uint64_t{1} << 28;

// Hands out the tensors the description names, checking each shape, and remembers which were taken so that
// finish() can refuse the rest. With `release`, a tensor's arrays are dropped once its kernel or vector holds its
// own copy of them.
class Preparer {
 public:
  Preparer(Model& m, std::string_view source, bool release)
      : model_(m), source_(source), release_(release), used_(m.tensors.size(), false) {}

  NamedTensor& get(std::string_view name, const Shape& shape) {
    const NamedTensor* t = model_.find(name);
    if (!t) fail(Errc::format, "[load_model] {}: tensor '{}' is missing", source_, name);
    if (t->ref.shape != shape)
      fail(Errc::shape, "[load_model] {}: tensor '{}' has shape {}, expected {}", source_, name,
           shape_str(t->ref.shape), shape_str(shape));
    const auto i = static_cast<size_t>(t - model_.tensors.data());
    used_[i] = true;
    return model_.tensors[i];
  }
  std::unique_ptr<kernels::CpuLinear> linear(std::string_view name, int64_t rows, int64_t cols) {
    NamedTensor& t = get(name, {rows, cols});
    auto kernel = kernels::prepare_cpu(t.ref);
    if (!kernel->reads_stored_arrays()) copied(t);
    return kernel;
  }
  std::vector<float> vec(std::string_view name, int64_t n) {
    NamedTensor& t = get(name, {n});
    std::vector<float> values = codec::decode_all(t.ref);
    copied(t);
    return values;
  }

  // Every tensor the description did not take (a layer beyond n_layers, a bias the family has not, ...).
  void refuse_unused() const {
    for (size_t i = 0; i < used_.size(); ++i)
      if (!used_[i])
        fail(Errc::format, "[load_model] {}: tensor '{}' is not part of a {} model of {} layers", source_,
             model_.tensors[i].name, model_.config.arch, model_.config.n_layers);
  }

 private:
  // t's values now live elsewhere: its own storage goes at once; storage shared through keep_alive goes in
  // finish() once no tensor views it.
  void copied(NamedTensor& t) const {
    if (!release_) return;
    t.ref.arrays.items.clear();
    t.storage.reset();
  }

  Model& model_;
  std::string_view source_;
  bool release_;
  std::vector<bool> used_;
};

void prepare_layer(Preparer& p, const ModelConfig& c, const LayerDesc& desc, int64_t l, LayerWeights& w) {
  for (const TensorSpec& t : desc.tensors) {
    const std::string name = hf_tensor_name(l, t);
    const int64_t rows = dim_size(t.rows, c);
    const size_t role = static_cast<size_t>(t.role);
    if (t.expert >= 0) {
      if (w.experts.size() <= static_cast<size_t>(t.expert)) w.experts.resize(static_cast<size_t>(t.expert) + 1);
      w.linear_slot(t.role, t.expert) = p.linear(name, rows, dim_size(t.cols, c));
    } else if (t.linear())
      w.linears[role] = p.linear(name, rows, dim_size(t.cols, c));
    else
      w.vectors[role] = p.vec(name, rows);
  }
}

}  // namespace

const NamedTensor* Model::find(std::string_view name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors[it->second];
}

void Model::release_pages(const NamedTensor& t) const {
  for (const auto& [role, view] : t.ref.arrays.items)
    for (const MappedFile* f : mapped_files) f->release_pages(view.bytes);  // only the file holding it acts
}

void Model::require_stored_arrays(std::string_view user) const {
  if (stored_arrays_released)
    fail(Errc::usage,
         "[{}] the model was loaded for the CPU kernels only (LoadOptions::cpu_only): its stored "
         "arrays are released",
         user);
}

codec::TensorRef dense_f32_ref(Shape shape, std::span<const float> values) {
  codec::TensorRef ref;
  ref.codec = &codec::codec_or_throw("dense", "dense_f32_ref");
  ref.params = {{"dtype", "f32"}};
  ref.arrays.items.emplace_back(
      "data", TensorView{DType::F32, shape, std::as_bytes(values)});
  ref.shape = std::move(shape);
  return ref;
}

void ModelBuilder::add_f32(std::string name, Shape shape, std::vector<float> values) {
  if (checked_numel(shape, name) != values.size())
    fail(Errc::internal, "[load_model] {}: {} values for shape {}", name, values.size(), shape_str(shape));
  auto stored = std::make_shared<const std::vector<float>>(std::move(values));
  codec::TensorRef ref = dense_f32_ref(std::move(shape), *stored);
  add(std::move(name), std::move(ref), std::move(stored));
}

void ModelBuilder::add(std::string name, codec::TensorRef ref) { add(std::move(name), std::move(ref), nullptr); }

void ModelBuilder::add(std::string name, codec::TensorRef ref, std::shared_ptr<const void> storage) {
  if (!model_->index_.emplace(name, model_->tensors.size()).second)
    fail(Errc::duplicate, "[load_model] tensor '{}' appears twice", name);
  // Kernels read arrays as their element type (uint32 code words, bf16 scales, ...), but a file need not place a
  // tensor at an offset aligned for it (safetensors does not require it; mlx-lm's files of stacked experts do not);
  // such an array is copied into memory the tensor's storage then holds (operator new aligns for every type).
  auto copies = std::make_shared<std::vector<std::vector<std::byte>>>();
  for (auto& [array, view] : ref.arrays.items) {
    if (reinterpret_cast<uintptr_t>(view.bytes.data()) % dtype_size(view.dtype) == 0) continue;
    view.bytes = std::span<const std::byte>(copies->emplace_back(view.bytes.begin(), view.bytes.end()));
  }
  if (!copies->empty())
    storage = std::make_shared<std::pair<std::shared_ptr<const void>, decltype(copies)>>(std::move(storage),
                                                                                         std::move(copies));
  model_->tensors.push_back({std::move(name), std::move(ref), std::move(storage)});
}

void ModelBuilder::keep_alive(std::shared_ptr<const void> owner) { model_->keep_alive.push_back(std::move(owner)); }

void ModelBuilder::keep_alive(std::shared_ptr<const void> owner, std::vector<const MappedFile*> files) {
  keep_alive(std::move(owner));
  model_->mapped_files.insert(model_->mapped_files.end(), files.begin(), files.end());
}

bool ModelBuilder::contains(std::string_view name) const { return model_->find(name) != nullptr; }

std::unique_ptr<Model> ModelBuilder::finish(const ModelConfig& config, std::string_view source,
                                            const LoadOptions& options) {
  validate_config(config, source);
  Model& m = *model_;
  m.config = config;
  m.desc = describe_model(config, source);
  {
    // The value checks read every weight: a mapped tensor's pages are released once checked, so a checkpoint
    // larger than memory loads, and its pages come back only where a reader uses them.
    uint64_t weights = 0;
    for (const auto& t : m.tensors) weights += checked_numel(t.ref.shape, t.name);
    std::optional<Progress> progress;
    if (weights >= kLoadProgressWeights) progress.emplace("load", weights, "weights");
    for (const auto& t : m.tensors) {
      codec::validate_tensor(t.ref, fmt::format("{}: {}", source, t.name));
      m.release_pages(t);
      if (progress) progress->advance(checked_numel(t.ref.shape, t.name));
    }
  }
  Preparer p(m, source, options.cpu_only);
  const auto& c = config;
  m.embed = p.linear(kEmbedTensor, c.vocab, c.dim);
  if (c.tied_embeddings && m.find(kLmHeadTensor))
    fail(Errc::format, "[load_model] {}: tied embeddings but an {} tensor is present", source, kLmHeadTensor);
  m.lm_head = c.tied_embeddings ? m.embed : p.linear(kLmHeadTensor, c.vocab, c.dim);
  m.final_norm = p.vec(kFinalNormTensor, c.dim);
  if (m.desc.final_norm == NormKind::layer) m.final_norm_bias = p.vec(kFinalNormBiasTensor, c.dim);
  m.layers.resize(static_cast<size_t>(c.n_layers));
  for (int64_t l = 0; l < c.n_layers; ++l) prepare_layer(p, c, m.desc.layers[l], l, m.layers[l]);
  p.refuse_unused();
  if (options.cpu_only) {
    m.stored_arrays_released = true;
    // The mapped files and buffers the tensors shared go once every kernel holds its own copy.
    if (std::all_of(m.tensors.begin(), m.tensors.end(),
                    [](const NamedTensor& t) { return t.ref.arrays.items.empty(); }))
      m.keep_alive.clear();
  }
  return std::move(model_);
}

std::vector<float> permute_rope_rows(std::span<const float> w, int64_t n_heads, int64_t head_dim, int64_t cols,
                                     RopeStyle from, RopeStyle to) {
  if (static_cast<uint64_t>(n_heads * head_dim * cols) != w.size() || head_dim % 2 != 0)
    fail(Errc::shape, "[permute_rope_rows] {} values do not form {} heads of {} rows of {}", w.size(), n_heads,
         head_dim, cols);
  if (from == to) return {w.begin(), w.end()};
  std::vector<float> out(w.size());
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < n_heads; ++h)
    for (int64_t i = 0; i < half; ++i)
      for (int64_t j = 0; j < 2; ++j) {
        const int64_t interleaved = h * head_dim + 2 * i + j;
        const int64_t halves = h * head_dim + j * half + i;
        const int64_t src = from == RopeStyle::interleaved ? interleaved : halves;
        const int64_t dst = from == RopeStyle::interleaved ? halves : interleaved;
        std::copy_n(w.begin() + src * cols, cols, out.begin() + dst * cols);
      }
  return out;
}

std::vector<float> decode_half_rope(const Model& model, const NamedTensor& t) {
  std::vector<float> values = codec::decode_all(t.ref);
  const ModelConfig& c = model.config;
  if (c.rope_style == RopeStyle::half) return values;
  const auto layer = find_layer_tensor(model.desc, t.name);
  if (!layer) return values;
  const int64_t cols = t.ref.shape.size() == 2 ? t.ref.shape[1] : 1;
  // Permutes `heads` heads of rows starting at row `first` in place.
  const auto permute = [&](int64_t first, int64_t heads) {
    const auto rows =
        std::span(values).subspan(static_cast<size_t>(first * cols), static_cast<size_t>(heads * c.head_dim * cols));
    const std::vector<float> half = permute_rope_rows(rows, heads, c.head_dim, cols, c.rope_style, RopeStyle::half);
    std::copy(half.begin(), half.end(), rows.begin());
  };
  switch (layer->spec->role) {
    case Role::q: case Role::q_bias: permute(0, c.n_heads); break;
    case Role::k: case Role::k_bias: permute(0, c.n_kv_heads); break;
    case Role::qkv:
      permute(0, c.n_heads);
      permute(c.q_dim(), c.n_kv_heads);
      break;
    default: break;
  }
  return values;
}

KvCache::KvCache(const ModelConfig& config, int64_t capacity) : capacity_(capacity), kv_dim_(config.kv_dim()) {
  if (capacity < 1 || capacity > config.max_seq)
    fail(Errc::limit, "[kv_cache] capacity {} outside [1, {}]", capacity, config.max_seq);
  const uint64_t n = checked_mul(checked_mul(static_cast<uint64_t>(config.n_layers), static_cast<uint64_t>(capacity), "kv cache"),
                                 static_cast<uint64_t>(kv_dim_), "kv cache");
  keys_.resize(n);
  values_.resize(n);
}

}  // namespace lowbit::model
