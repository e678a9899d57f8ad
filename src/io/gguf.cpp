#include "lowbit/io/gguf.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "lowbit/core/checked.h"
#include "lowbit/core/dtype.h"
#include "lowbit/core/error.h"

namespace lowbit::io {
namespace {

constexpr GgmlTypeInfo kGgmlTypes[] = {
    {GgmlType::F32, "F32", 1, 4},
    {GgmlType::F16, "F16", 1, 2},
    {GgmlType::Q4_0, "Q4_0", 32, 18},
    {GgmlType::Q4_1, "Q4_1", 32, 20},
    {GgmlType::Q5_0, "Q5_0", 32, 22},
    {GgmlType::Q5_1, "Q5_1", 32, 24},
    {GgmlType::Q8_0, "Q8_0", 32, 34},
    {GgmlType::Q2_K, "Q2_K", 256, 84},
    {GgmlType::Q3_K, "Q3_K", 256, 110},
    {GgmlType::Q4_K, "Q4_K", 256, 144},
    {GgmlType::Q5_K, "Q5_K", 256, 176},
    {GgmlType::Q6_K, "Q6_K", 256, 210},
    {GgmlType::IQ2_XXS, "IQ2_XXS", 256, 66},
    {GgmlType::IQ2_XS, "IQ2_XS", 256, 74},
    {GgmlType::IQ3_XXS, "IQ3_XXS", 256, 98},
    {GgmlType::IQ1_S, "IQ1_S", 256, 50},
    {GgmlType::IQ4_NL, "IQ4_NL", 32, 18},
    {GgmlType::IQ3_S, "IQ3_S", 256, 110},
    {GgmlType::IQ2_S, "IQ2_S", 256, 82},
    {GgmlType::IQ4_XS, "IQ4_XS", 256, 136},
    {GgmlType::IQ1_M, "IQ1_M", 256, 56},
    {GgmlType::BF16, "BF16", 1, 2},
};

// Sequential little-endian reads that fail with Errc::truncated instead of running past the end.
class Cursor {
 public:
  Cursor(std::span<const std::byte> bytes, std::string_view source) : bytes_(bytes), source_(source) {}

  template <class T>
  T read(std::string_view what) {
    T value;
    std::memcpy(&value, take(sizeof(T), what).data(), sizeof(T));
    return value;
  }
  std::string read_string(std::string_view what, uint64_t max_length) {
    const uint64_t length = read<uint64_t>(what);
    if (length > max_length) fail(Errc::limit, "[gguf] {}: {} is {} bytes long (limit {})", source_, what, length, max_length);
    const auto span = take(length, what);
    return std::string(reinterpret_cast<const char*>(span.data()), span.size());
  }
  std::span<const std::byte> take(uint64_t n, std::string_view what) {
    if (n > bytes_.size() - pos_)
      fail(Errc::truncated, "[gguf] {}: file ends inside {} (offset {}, {} bytes needed)", source_, what, pos_, n);
    const auto span = bytes_.subspan(pos_, n);
    pos_ += n;
    return span;
  }
  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return bytes_.size() - pos_; }
  std::string_view source() const { return source_; }

 private:
  std::span<const std::byte> bytes_;
  std::string_view source_;
  uint64_t pos_ = 0;
};

// The smallest encoded size of one value of a type (bounds array counts by the bytes left).
uint64_t min_value_size(GgufValueType type) {
  switch (type) {
    case GgufValueType::u8: case GgufValueType::i8: case GgufValueType::boolean: return 1;
    case GgufValueType::u16: case GgufValueType::i16: return 2;
    case GgufValueType::u32: case GgufValueType::i32: case GgufValueType::f32: return 4;
    case GgufValueType::string: case GgufValueType::u64: case GgufValueType::i64: case GgufValueType::f64: return 8;
    case GgufValueType::array: return 12;
  }
  return 1;
}

GgufValueType read_value_type(Cursor& in, const std::string& key) {
  const auto raw = in.read<uint32_t>("value type");
  if (raw > static_cast<uint32_t>(GgufValueType::f64))
    fail(Errc::format, "[gguf] {}: key '{}' has unknown value type {}", in.source(), key, raw);
  return static_cast<GgufValueType>(raw);
}

GgufScalar read_scalar(Cursor& in, GgufValueType type, const std::string& key) {
  switch (type) {
    case GgufValueType::u8: return uint64_t{in.read<uint8_t>(key)};
    case GgufValueType::i8: return int64_t{in.read<int8_t>(key)};
    case GgufValueType::u16: return uint64_t{in.read<uint16_t>(key)};
    case GgufValueType::i16: return int64_t{in.read<int16_t>(key)};
    case GgufValueType::u32: return uint64_t{in.read<uint32_t>(key)};
    case GgufValueType::i32: return int64_t{in.read<int32_t>(key)};
    case GgufValueType::u64: return in.read<uint64_t>(key);
    case GgufValueType::i64: return in.read<int64_t>(key);
    case GgufValueType::f32: return double{in.read<float>(key)};
    case GgufValueType::f64: return in.read<double>(key);
    case GgufValueType::boolean: {
      const auto b = in.read<uint8_t>(key);
      if (b > 1) fail(Errc::format, "[gguf] {}: key '{}' has boolean value {}", in.source(), key, b);
      return b == 1;
    }
    case GgufValueType::string: return in.read_string(key, kGgufMaxStringLength);
    case GgufValueType::array: break;
  }
  fail(Errc::unsupported, "[gguf] {}: key '{}' nests arrays", in.source(), key);
}

GgufValue read_value(Cursor& in, const std::string& key) {
  GgufValue value;
  value.type = read_value_type(in, key);
  if (value.type != GgufValueType::array) {
    value.scalar = read_scalar(in, value.type, key);
    return value;
  }
  value.element_type = read_value_type(in, key);
  if (value.element_type == GgufValueType::array)
    fail(Errc::unsupported, "[gguf] {}: key '{}' nests arrays", in.source(), key);
  const auto count = in.read<uint64_t>(key);
  if (count > kGgufMaxArrayLength)
    fail(Errc::limit, "[gguf] {}: key '{}' has {} elements (limit {})", in.source(), key, count, kGgufMaxArrayLength);
  if (checked_mul(count, min_value_size(value.element_type), key) > in.remaining())
    fail(Errc::truncated, "[gguf] {}: key '{}' declares {} elements past the end of the file", in.source(), key, count);
  value.array.reserve(count);
  for (uint64_t i = 0; i < count; ++i) value.array.push_back(read_scalar(in, value.element_type, key));
  return value;
}

uint32_t read_alignment(const GgufHeader& h, std::string_view source) {
  const auto it = h.metadata.find("general.alignment");
  if (it == h.metadata.end()) return kGgufDefaultAlignment;
  const auto* v = std::get_if<uint64_t>(&it->second.scalar);
  if (it->second.type != GgufValueType::u32 || !v || *v == 0 || (*v & (*v - 1)) != 0)
    fail(Errc::format, "[gguf] {}: general.alignment must be a power of two u32", source);
  return static_cast<uint32_t>(*v);
}

GgufTensorInfo read_tensor_info(Cursor& in) {
  GgufTensorInfo t;
  t.name = in.read_string("tensor name", kGgufMaxKeyLength);
  const auto n_dims = in.read<uint32_t>("tensor dims");
  if (n_dims == 0 || n_dims > kGgufMaxDims)
    fail(Errc::limit, "[gguf] {}: tensor '{}' has {} dims (1..{})", in.source(), t.name, n_dims, kGgufMaxDims);
  for (uint32_t d = 0; d < n_dims; ++d) {
    const auto ne = in.read<uint64_t>("tensor dim");
    if (ne == 0 || ne > (1ull << 40)) fail(Errc::shape, "[gguf] {}: tensor '{}' has dim {}", in.source(), t.name, ne);
    t.ne.push_back(ne);
  }
  const auto raw_type = in.read<uint32_t>("tensor type");
  const GgmlTypeInfo* info = ggml_type_info(raw_type);
  if (!info) fail(Errc::unsupported, "[gguf] {}: tensor '{}' has ggml type {} that lowbit does not read", in.source(), t.name, raw_type);
  t.type = info->type;
  t.offset = in.read<uint64_t>("tensor offset");
  const std::string what = fmt::format("[gguf] {}: tensor '{}'", in.source(), t.name);
  t.numel = 1;
  for (auto ne : t.ne) t.numel = checked_mul(t.numel, ne, what);
  if (t.ne[0] % info->block_elems != 0)
    fail(Errc::shape, "{}: row of {} elements is not a whole number of {} blocks of {}", what, t.ne[0], info->name,
         info->block_elems);
  t.bytes = checked_mul(t.numel / info->block_elems, info->block_bytes, what);
  return t;
}

// Every tensor inside the data section, aligned, and no two overlapping.
void check_layout(GgufHeader& h, uint64_t file_size, std::string_view source) {
  std::vector<const GgufTensorInfo*> order;
  for (const auto& t : h.tensors) {
    if (t.offset % h.alignment != 0)
      fail(Errc::layout, "[gguf] {}: tensor '{}' offset {} is not a multiple of {}", source, t.name, t.offset, h.alignment);
    const uint64_t end = checked_add(checked_add(h.data_start, t.offset, source), t.bytes, source);
    if (end > file_size)
      fail(Errc::truncated, "[gguf] {}: tensor '{}' ends at {} past the end of the file ({})", source, t.name, end, file_size);
    order.push_back(&t);
  }
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < order.size(); ++i)
    if (order[i - 1]->offset + order[i - 1]->bytes > order[i]->offset)
      fail(Errc::layout, "[gguf] {}: tensors '{}' and '{}' overlap", source, order[i - 1]->name, order[i]->name);
}

}  // namespace

const GgmlTypeInfo* ggml_type_info(uint32_t type) {
  for (const auto& row : kGgmlTypes)
    if (static_cast<uint32_t>(row.type) == type) return &row;
  return nullptr;
}

Shape GgufTensorInfo::shape() const {
  Shape s;
  for (auto it = ne.rbegin(); it != ne.rend(); ++it) s.push_back(static_cast<int64_t>(*it));
  return s;
}

GgufHeader parse_gguf(std::span<const std::byte> file, std::string_view source) {
  Cursor in(file, source);
  const auto magic = in.take(4, "magic");
  if (std::memcmp(magic.data(), "GGUF", 4) != 0) fail(Errc::format, "[gguf] {}: not a GGUF file (bad magic)", source);
  GgufHeader h;
  h.version = in.read<uint32_t>("version");
  if (h.version != 2 && h.version != 3)
    fail(Errc::version, "[gguf] {}: version {} is not supported (2 or 3)", source, h.version);
  const auto n_tensors = in.read<uint64_t>("tensor count");
  const auto n_keys = in.read<uint64_t>("metadata count");
  if (n_tensors > kGgufMaxTensors) fail(Errc::limit, "[gguf] {}: {} tensors (limit {})", source, n_tensors, kGgufMaxTensors);
  if (n_keys > kGgufMaxKeys) fail(Errc::limit, "[gguf] {}: {} metadata keys (limit {})", source, n_keys, kGgufMaxKeys);
  for (uint64_t k = 0; k < n_keys; ++k) {
    std::string key = in.read_string("metadata key", kGgufMaxKeyLength);
    GgufValue value = read_value(in, key);
    if (!h.metadata.emplace(key, std::move(value)).second)
      fail(Errc::duplicate, "[gguf] {}: metadata key '{}' appears twice", source, key);
  }
  h.alignment = read_alignment(h, source);
  std::map<std::string_view, int> names;
  h.tensors.reserve(std::min<uint64_t>(n_tensors, in.remaining() / 24));
  for (uint64_t t = 0; t < n_tensors; ++t) h.tensors.push_back(read_tensor_info(in));
  for (const auto& t : h.tensors)
    if (++names[t.name] > 1) fail(Errc::duplicate, "[gguf] {}: tensor '{}' appears twice", source, t.name);
  const uint64_t pad = (h.alignment - in.pos() % h.alignment) % h.alignment;
  h.data_start = checked_add(in.pos(), pad, source);
  if (h.data_start > file.size() && !h.tensors.empty())
    fail(Errc::truncated, "[gguf] {}: data section starts past the end of the file", source);
  check_layout(h, file.size(), source);
  return h;
}

GgufFile GgufFile::open(const std::filesystem::path& path) {
  GgufFile f;
  f.file_ = MappedFile::open(path);
  f.bytes_ = f.file_.bytes();
  f.source_ = path.string();
  f.header_ = parse_gguf(f.bytes_, f.source_);
  for (size_t i = 0; i < f.header_.tensors.size(); ++i) f.index_[f.header_.tensors[i].name] = i;
  return f;
}

GgufFile GgufFile::from_bytes(std::span<const std::byte> bytes, std::string source) {
  GgufFile f;
  f.bytes_ = bytes;
  f.source_ = std::move(source);
  f.header_ = parse_gguf(f.bytes_, f.source_);
  for (size_t i = 0; i < f.header_.tensors.size(); ++i) f.index_[f.header_.tensors[i].name] = i;
  return f;
}

const GgufValue* GgufFile::find(std::string_view key) const {
  const auto it = header_.metadata.find(key);
  return it == header_.metadata.end() ? nullptr : &it->second;
}

namespace {

[[noreturn]] void wrong_type(std::string_view source, std::string_view key, std::string_view wanted) {
  fail(Errc::format, "[gguf] {}: metadata '{}' is not {}", source, key, wanted);
}

std::optional<double> scalar_number(const GgufScalar& s) {
  if (const auto* u = std::get_if<uint64_t>(&s)) return static_cast<double>(*u);
  if (const auto* i = std::get_if<int64_t>(&s)) return static_cast<double>(*i);
  if (const auto* d = std::get_if<double>(&s)) return *d;
  return std::nullopt;
}

}  // namespace

std::optional<std::string> GgufFile::get_string(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != GgufValueType::string) wrong_type(source_, key, "a string");
  return std::get<std::string>(v->scalar);
}

std::optional<uint64_t> GgufFile::get_uint(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (const auto* u = std::get_if<uint64_t>(&v->scalar); u && v->type != GgufValueType::array) return *u;
  if (const auto* i = std::get_if<int64_t>(&v->scalar); i && *i >= 0 && v->type != GgufValueType::array)
    return static_cast<uint64_t>(*i);
  wrong_type(source_, key, "a non-negative integer");
}

std::optional<double> GgufFile::get_float(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  const auto number = v->type == GgufValueType::array ? std::nullopt : scalar_number(v->scalar);
  if (!number) wrong_type(source_, key, "a number");
  return number;
}

std::optional<bool> GgufFile::get_bool(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != GgufValueType::boolean) wrong_type(source_, key, "a boolean");
  return std::get<bool>(v->scalar);
}

std::optional<std::vector<std::string>> GgufFile::get_strings(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != GgufValueType::array || v->element_type != GgufValueType::string)
    wrong_type(source_, key, "an array of strings");
  std::vector<std::string> out;
  out.reserve(v->array.size());
  for (const auto& s : v->array) out.push_back(std::get<std::string>(s));
  return out;
}

std::optional<std::vector<double>> GgufFile::get_floats(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != GgufValueType::array) wrong_type(source_, key, "a numeric array");
  std::vector<double> out;
  out.reserve(v->array.size());
  for (const auto& s : v->array) {
    const auto number = scalar_number(s);
    if (!number) wrong_type(source_, key, "a numeric array");
    out.push_back(*number);
  }
  return out;
}

const GgufTensorInfo* GgufFile::tensor(std::string_view name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

std::span<const std::byte> GgufFile::tensor_bytes(const GgufTensorInfo& info) const {
  return bytes_.subspan(header_.data_start + info.offset, info.bytes);  // bounds checked at parse
}

void GgufFile::release_pages(const GgufTensorInfo& info) const { file_.release_pages(tensor_bytes(info)); }

std::vector<float> GgufFile::dequantize(const GgufTensorInfo& info) const {
  std::vector<float> out(info.numel);
  dequantize_ggml(info.type, tensor_bytes(info), out);
  return out;
}

}  // namespace lowbit::io
