// The llama2.c checkpoint reader: bounds come from the header, checked against the file size exactly.
#include "lowbit/model/llama2c.h"

#include <array>
#include <cstring>

#include <fmt/format.h>

#include "lowbit/core/checked.h"
#include "lowbit/core/error.h"
#include "lowbit/core/mapped_file.h"
#include "lowbit/model/family.h"

namespace lowbit::model {

namespace {

ModelConfig config_from_header(const std::array<int32_t, 7>& h, const std::string& source) {
  for (int32_t v : h)
    if (v == 0 || v == INT32_MIN) fail(Errc::format, "[load_llama2c] {}: header field is {}", source, v);
  ModelConfig c;
  c.arch = "llama";
  c.dim = h[0];
  c.hidden_dim = h[1];
  c.n_layers = h[2];
  c.n_heads = h[3];
  c.n_kv_heads = h[4];
  c.vocab = h[5] < 0 ? -static_cast<int64_t>(h[5]) : h[5];
  c.tied_embeddings = h[5] > 0;
  c.max_seq = h[6];
  c.head_dim = c.n_heads > 0 ? c.dim / c.n_heads : 0;
  if (c.n_heads > 0 && c.dim % c.n_heads != 0)
    fail(Errc::format, "[load_llama2c] {}: dim {} is not a multiple of n_heads {}", source, c.dim, c.n_heads);
  c.rope_theta = 10000.0;
  c.rope_style = RopeStyle::interleaved;
  c.norm_eps = 1e-5f;
  c.bos_id = 1;
  c.eos_ids = {2};
  validate_config(c, source);
  return c;
}

// Walks the f32 tensors in file order, handing out zero-copy views.
class Cursor {
 public:
  Cursor(std::span<const std::byte> data, std::string source) : data_(data), source_(std::move(source)) {}
  std::span<const float> take(uint64_t count, std::string_view what) {
    const uint64_t bytes = checked_mul(count, sizeof(float), what);
    if (bytes > data_.size() - offset_)
      fail(Errc::truncated, "[load_llama2c] {}: file ends inside {}", source_, what);
    const auto* p = reinterpret_cast<const float*>(data_.data() + offset_);
    offset_ += bytes;
    return {p, static_cast<size_t>(count)};
  }
  void skip(uint64_t count, std::string_view what) { take(count, what); }
  size_t remaining() const { return data_.size() - offset_; }

 private:
  std::span<const std::byte> data_;
  size_t offset_ = 0;
  std::string source_;
};

// Adds the tensor of one role, stored stacked [n_layers, rows, cols] in the file, for every layer.
void add_stacked(ModelBuilder& b, Cursor& cur, const ModelConfig& c, const ModelDesc& d, Role role) {
  const TensorSpec& spec = *d.layers.front().find(role);
  const int64_t rows = dim_size(spec.rows, c), cols = spec.linear() ? dim_size(spec.cols, c) : 1;
  const Shape shape = spec.linear() ? Shape{rows, cols} : Shape{rows};
  const uint64_t per_layer = static_cast<uint64_t>(rows * cols);
  const auto all = cur.take(checked_mul(per_layer, static_cast<uint64_t>(c.n_layers), spec.hf), spec.hf);
  for (int64_t l = 0; l < c.n_layers; ++l)
    b.add(hf_tensor_name(l, spec), dense_f32_ref(shape, all.subspan(l * per_layer, per_layer)));
}

}  // namespace

std::unique_ptr<Model> load_llama2c(const std::filesystem::path& path, const LoadOptions& options) {
  const std::string source = path.string();
  auto file = std::make_shared<MappedFile>(MappedFile::open(path));
  const auto bytes = file->bytes();
  std::array<int32_t, 7> header;
  if (bytes.size() < sizeof(header)) fail(Errc::truncated, "[load_llama2c] {}: shorter than its header", source);
  std::memcpy(header.data(), bytes.data(), sizeof(header));
  ModelConfig c = config_from_header(header, source);
  if (options.max_seq) c.max_seq = std::min(c.max_seq, *options.max_seq);

  ModelBuilder b;
  b.keep_alive(file);
  Cursor cur(bytes.subspan(sizeof(header)), source);
  const int64_t dim = c.dim;
  const auto embed = cur.take(static_cast<uint64_t>(c.vocab * dim), "token embedding");
  b.add(std::string(kEmbedTensor), dense_f32_ref({c.vocab, dim}, embed));
  // run.c's TransformerWeights order: rms_att, wq, wk, wv, wo, rms_ffn, w1 (gate), w2 (down), w3 (up)
  const ModelDesc d = describe_model(c, source);
  for (Role role : {Role::attn_norm, Role::q, Role::k, Role::v, Role::o, Role::ffn_norm, Role::gate, Role::down, Role::up})
    add_stacked(b, cur, c, d, role);
  b.add(std::string(kFinalNormTensor), dense_f32_ref({dim}, cur.take(static_cast<uint64_t>(dim), "final norm")));
  const auto rope_table = static_cast<uint64_t>(header[6]) * static_cast<uint64_t>(c.head_dim / 2);
  cur.skip(rope_table, "freq_cis_real");
  cur.skip(rope_table, "freq_cis_imag");
  if (!c.tied_embeddings)
    b.add(std::string(kLmHeadTensor), dense_f32_ref({c.vocab, dim}, cur.take(static_cast<uint64_t>(c.vocab * dim), "classifier")));
  if (cur.remaining() != 0)
    fail(Errc::layout, "[load_llama2c] {}: {} trailing bytes after the last tensor", source, cur.remaining());
  return b.finish(c, source, options);
}

}  // namespace lowbit::model
