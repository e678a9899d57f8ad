// Writing safetensors files the way the reference implementation does: a compact JSON header padded with
// spaces to a multiple of 8 bytes, so that the data section (and, with tensors ordered by element size, every
// tensor) is aligned for zero-copy reads.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "lowbit/core/checked.h"
#include "lowbit/core/error.h"
#include "lowbit/io/json.h"
#include "lowbit/io/safetensors.h"

namespace lowbit::io {

namespace {

constexpr std::string_view kWriteOp = "write_safetensors";
constexpr size_t kWriteBufferBytes = 1 << 20;

struct Declared {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin;
  uint64_t end;
};

// `s` as a JSON string literal; Errc::format when it is not valid UTF-8 (no JSON reader could take it back).
std::string json_string(const std::string& s, std::string_view what, const std::string& path) {
  try {
    return nlohmann::json(s).dump();
  } catch (const nlohmann::json::exception&) {
    fail(Errc::format, "[{}] {}: {} {} is not valid UTF-8", kWriteOp, path, what, quote(s));
  }
}

// Position in the reference implementation's Dtype enum, whose serializer writes tensors in descending order of
// it (then by name). Larger elements come first, so every tensor is aligned to its element size.
int reference_rank(DType t) {
  switch (t) {
    case DType::BOOL: return 0;
    case DType::U8: return 1;
    case DType::I8: return 2;
    case DType::F8_E5M2: return 3;
    case DType::F8_E4M3: return 4;
    case DType::I16: return 5;
    case DType::U16: return 6;
    case DType::F16: return 7;
    case DType::BF16: return 8;
    case DType::I32: return 9;
    case DType::U32: return 10;
    case DType::F32: return 11;
    case DType::F64: return 12;
    case DType::I64: return 13;
    case DType::U64: return 14;
  }
  return 0;
}

}  // namespace

struct SafetensorsWriter::Impl {
  std::filesystem::path path;
  std::string metadata_json;  // "" when there is no metadata
  std::vector<Declared> declared;
  std::set<std::string, std::less<>> names;
  uint64_t data_size = 0;
  size_t next = 0;  // index of the next tensor to write
  uint64_t header_size = 0;
  bool header_written = false;
  bool finished = false;
  bool broken = false;   // an I/O error left the file in an unknown state
  bool created = false;  // the file is ours to remove if the writer is abandoned
  int fd = -1;
  std::vector<std::byte> buffer;

  ~Impl() {
    if (fd >= 0) ::close(fd);
    if (created && !finished) ::unlink(path.c_str());
  }

  template <class... Args>
  [[noreturn]] void misuse(fmt::format_string<Args...> format, Args&&... args) const {
    throw Error(Errc::internal,
                fmt::format("[{}] {}: {}", kWriteOp, path.string(), fmt::format(format, std::forward<Args>(args)...)));
  }

  void check_usable() const {
    if (finished) misuse("the file is already finished");
    if (broken) misuse("an earlier write failed");
  }

  void write_raw(const std::byte* p, size_t n) {
    while (n > 0) {
      const ssize_t w = ::write(fd, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) fail_errno(kWriteOp, path.string());
      p += w;
      n -= static_cast<size_t>(w);
    }
  }

  void flush() {
    write_raw(buffer.data(), buffer.size());
    buffer.clear();
  }

  // Small tensors are gathered in the buffer; large ones go straight to the file.
  void append(std::span<const std::byte> bytes) {
    if (buffer.size() + bytes.size() > kWriteBufferBytes) flush();
    if (bytes.size() >= kWriteBufferBytes)
      write_raw(bytes.data(), bytes.size());
    else
      buffer.insert(buffer.end(), bytes.begin(), bytes.end());
  }

  // {"__metadata__":{...},"name":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},...} in declaration order,
  // exactly as the reference serializer prints it, then spaces up to a multiple of 8.
  std::string header_text() const {
    std::string text = "{";
    if (!metadata_json.empty()) text += fmt::format("\"__metadata__\":{}", metadata_json);
    for (const Declared& d : declared) {
      if (text.size() > 1) text += ',';
      text += nlohmann::json(d.name).dump();
      text += fmt::format(":{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}", dtype_name(d.dtype),
                          fmt::join(d.shape, ","), d.begin, d.end);
      if (text.size() > kSafetensorsMaxHeader)
        fail(Errc::limit, "[{}] {}: header exceeds the limit of {} bytes", kWriteOp, path.string(),
             kSafetensorsMaxHeader);
    }
    text += '}';
    text.append((8 - text.size() % 8) % 8, ' ');
    if (text.size() > kSafetensorsMaxHeader)
      fail(Errc::limit, "[{}] {}: header of {} bytes exceeds the limit of {}", kWriteOp, path.string(), text.size(),
           kSafetensorsMaxHeader);
    return text;
  }

  void write_header() {
    const std::string text = header_text();
    std::array<std::byte, 8> length;
    for (size_t i = 0; i < 8; ++i) length[i] = static_cast<std::byte>((text.size() >> (8 * i)) & 0xff);
    append(length);
    append(std::as_bytes(std::span(text)));
    header_size = text.size();
    header_written = true;
  }
};

SafetensorsWriter::SafetensorsWriter(std::filesystem::path path, std::map<std::string, std::string> metadata)
    : impl_(std::make_unique<Impl>()) {
  impl_->path = std::move(path);
  const std::string& p = impl_->path.string();
  if (!metadata.empty()) {
    std::string text = "{";
    for (const auto& [key, value] : metadata) {
      if (text.size() > 1) text += ',';
      text += json_string(key, "metadata key", p) + ":" + json_string(value, "metadata value", p);
    }
    impl_->metadata_json = text + "}";
  }
  impl_->buffer.reserve(kWriteBufferBytes);
  impl_->fd = ::open(impl_->path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (impl_->fd < 0) fail_errno(kWriteOp, p);
  impl_->created = true;
}

SafetensorsWriter::~SafetensorsWriter() = default;

void SafetensorsWriter::declare(std::string name, DType dtype, Shape shape) {
  Impl& w = *impl_;
  w.check_usable();
  if (w.header_written) w.misuse("tensor {} declared after writing started", quote(name));
  const std::string p = w.path.string();
  if (name == "__metadata__") fail(Errc::format, "[{}] {}: \"__metadata__\" is reserved, not a tensor name", kWriteOp, p);
  json_string(name, "tensor name", p);
  if (w.names.contains(name)) fail(Errc::duplicate, "[{}] {}: tensor {} declared twice", kWriteOp, p, quote(name));
  if (w.declared.size() >= kSafetensorsMaxTensors)
    fail(Errc::limit, "[{}] {}: more than {} tensors", kWriteOp, p, kSafetensorsMaxTensors);
  if (shape.size() > kSafetensorsMaxRank)
    fail(Errc::limit, "[{}] {}: tensor {}: {} dimensions, more than the {} allowed", kWriteOp, p, quote(name),
         shape.size(), kSafetensorsMaxRank);
  const std::string what = fmt::format("[{}] {}: tensor {}", kWriteOp, p, quote(name));
  const uint64_t nbytes = checked_mul(checked_numel(shape, what), dtype_size(dtype), what);
  const uint64_t end = checked_add(w.data_size, nbytes, what);
  w.names.insert(name);
  w.declared.push_back({std::move(name), dtype, std::move(shape), w.data_size, end});
  w.data_size = end;
}

void SafetensorsWriter::write(std::string_view name, std::span<const std::byte> bytes) {
  Impl& w = *impl_;
  w.check_usable();
  if (w.next == w.declared.size()) w.misuse("tensor {} written, but every declared tensor is already written", quote(name));
  const Declared& d = w.declared[w.next];
  if (d.name != name) w.misuse("tensor {} written, but {} is next in declaration order", quote(name), quote(d.name));
  if (bytes.size() != d.end - d.begin)
    w.misuse("tensor {}: {} bytes written, but shape {} of {} needs {}", quote(name), bytes.size(),
             shape_str(d.shape), dtype_name(d.dtype), d.end - d.begin);
  w.broken = true;
  if (!w.header_written) w.write_header();
  w.append(bytes);
  w.broken = false;
  ++w.next;
}

uint64_t SafetensorsWriter::finish() {
  Impl& w = *impl_;
  w.check_usable();
  if (w.next != w.declared.size())
    w.misuse("finished with {} of {} declared tensors written; next is {}", w.next, w.declared.size(),
             quote(w.declared[w.next].name));
  w.broken = true;
  if (!w.header_written) w.write_header();
  w.flush();
  if (::fsync(w.fd) != 0) fail_errno(kWriteOp, w.path.string());
  const int fd = std::exchange(w.fd, -1);
  if (::close(fd) != 0) fail_errno(kWriteOp, w.path.string());
  w.broken = false;
  w.finished = true;
  return 8 + w.header_size + w.data_size;
}

void write_safetensors(const std::filesystem::path& path, const std::vector<std::pair<std::string, TensorView>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<const std::pair<std::string, TensorView>*> order;
  order.reserve(tensors.size());
  for (const auto& t : tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    const int ra = reference_rank(a->second.dtype), rb = reference_rank(b->second.dtype);
    return ra != rb ? ra > rb : a->first < b->first;
  });
  SafetensorsWriter writer(path, metadata);
  for (const auto* t : order) writer.declare(t->first, t->second.dtype, t->second.shape);
  for (const auto* t : order) writer.write(t->first, t->second.bytes);
  writer.finish();
}

}  // namespace lowbit::io
