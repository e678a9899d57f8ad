#include "lowbit/artifact/writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <functional>
#include <span>
#include <utility>

#include "lowbit/artifact/reader.h"
#include "lowbit/artifact/records.h"
#include "lowbit/core/checked.h"
#include "lowbit/core/error.h"
#include "lowbit/core/mapped_file.h"
#include "lowbit/core/sha256.h"
#include "lowbit/core/staged_dir.h"
#include "lowbit/io/safetensors.h"

namespace lowbit::artifact {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kOp = "write_artifact";
// mlx-lm loads every "model*.safetensors" of a directory, so payloads carry that prefix.
constexpr std::string_view kPayloadPrefix = "model-";

// An open file descriptor, closed on scope exit.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    reset();
    fd_ = std::exchange(other.fd_, -1);
    return *this;
  }
  ~Fd() { reset(); }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

void write_all(int fd, const std::byte* data, size_t size, const fs::path& path) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail_errno(kOp, path.string());
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
}

Fd create_exclusive(const fs::path& path) {
  Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (fd.get() < 0) fail_errno(kOp, path.string());
  return fd;
}

void finish_file(Fd& fd, const fs::path& path) {
  if (::fsync(fd.get()) != 0) fail_errno(kOp, path.string());
  if (::close(fd.release()) != 0) fail_errno(kOp, path.string());
}

// The element sizes a payload's arrays are grouped by, largest first: the order they are written in.
constexpr std::array<size_t, 4> kSizeClasses = {8, 4, 2, 1};

// A dense tensor's parameters for a stored dtype.
codec::Params dense_params(DType dtype) {
  switch (dtype) {
    case DType::F32: return {{"dtype", "f32"}};
    case DType::F16: return {{"dtype", "f16"}};
    case DType::BF16: return {{"dtype", "bf16"}};
    default: fail(Errc::dtype, "[{}] dense tensors are F32, F16 or BF16, not {}", kOp, dtype_name(dtype));
  }
}

// The key of a stored array inside its payload: the tensor's own name for a codec's single "data" array, so that
// other safetensors tools see dense tensors under their names; MLX's names for a "<module>.weight" tensor's codes,
// scales and biases ("<module>.weight", "<module>.scales", "<module>.biases"), so that an all-affine artifact is
// an mlx-lm checkpoint; "<name>:<role>" otherwise.
std::string array_key(const std::string& tensor, const std::string& role) {
  if (role == "data") return tensor;
  if (tensor.ends_with(".weight") && (role == "codes" || role == "scales" || role == "biases")) {
    const std::string module = tensor.substr(0, tensor.size() - 7);
    return module + (role == "codes" ? ".weight" : "." + role);
  }
  return tensor + ":" + role;
}

// What --force may replace: an empty directory, or one that opens as a lowbit artifact (manifest valid, every file
// declared and of its declared size, no undeclared file). A user's directory that merely holds a manifest.json is
// not one, and is left alone. Hashes are not checked (that would read every byte of what is about to be deleted).
bool is_lowbit_artifact(const fs::path& dir) {
  if (fs::is_empty(dir)) return true;
  try {
    Artifact::open(dir, {.verify_hash = false});
    return true;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace

struct ArtifactWriter::Impl {
  Impl(const fs::path& destination, WriterOptions options)
      : options(options),
        dir(destination, kOp, options.force, {"a lowbit artifact", is_lowbit_artifact}),
        dest(dir.destination()),
        staging(dir.path()) {}

  WriterOptions options;
  StagedDirectory dir;
  const fs::path& dest;
  const fs::path& staging;
  Manifest manifest;
  // The current payload's arrays go to disk as they come, one scratch file per element size (kSizeClasses), so
  // memory holds their header entries only; flush_shard() joins them into the payload file.
  struct Pending {
    std::string key;
    DType dtype;
    Shape shape;
    uint64_t bytes;
  };
  std::array<std::vector<Pending>, kSizeClasses.size()> pending;
  std::array<Fd, kSizeClasses.size()> scratch;
  uint64_t shard_bytes = 0;
  size_t shards_written = 0;
  std::string recipe_text;  // as written to recipe.json, checked again at commit

  uint64_t files_bytes() const {  // every file written so far, the manifest not included
    uint64_t total = 0;
    for (const FileEntry& f : manifest.files) total += f.size;
    return total;
  }

  std::string shard_name() const { return fmt::format("{}{:05d}.safetensors", kPayloadPrefix, shards_written + 1); }

  fs::path scratch_path(size_t size_class) const {
    return staging / fmt::format("{}.part{}", shard_name(), kSizeClasses[size_class]);
  }

  bool shard_empty() const {
    return std::all_of(pending.begin(), pending.end(), [](const auto& p) { return p.empty(); });
  }

  void append(std::string key, const TensorBuffer& array) {
    const size_t size_class = static_cast<size_t>(
        std::find(kSizeClasses.begin(), kSizeClasses.end(), dtype_size(array.dtype)) - kSizeClasses.begin());
    if (size_class == kSizeClasses.size())
      fail(Errc::internal, "[{}] array '{}': element size {}", kOp, key, dtype_size(array.dtype));
    Fd& fd = scratch[size_class];
    if (fd.get() < 0) fd = create_exclusive(scratch_path(size_class));
    write_all(fd.get(), array.bytes.data(), array.bytes.size(), scratch_path(size_class));
    pending[size_class].push_back({std::move(key), array.dtype, array.shape, array.bytes.size()});
  }

  // Writes the payload file: the header, then the scratch files' arrays, larger elements first (with the header
  // padded to 8 bytes every array is then aligned to its element size), each array's pages of the scratch file
  // released once copied, so the copy holds one array at a time.
  void flush_shard() {
    if (shard_empty()) return;
    const std::string file = shard_name();
    const fs::path path = staging / file;
    io::SafetensorsWriter writer(path, {{"format", "lowbit"}});
    for (const auto& arrays : pending)
      for (const Pending& a : arrays) writer.declare(a.key, a.dtype, a.shape);
    for (size_t c = 0; c < kSizeClasses.size(); ++c) {
      if (pending[c].empty()) continue;
      const fs::path part = scratch_path(c);
      if (::fsync(scratch[c].get()) != 0 || ::close(scratch[c].release()) != 0) fail_errno(kOp, part.string());
      const MappedFile map = MappedFile::open(part);
      uint64_t at = 0;
      for (const Pending& a : pending[c]) {
        const auto bytes = map.bytes().subspan(at, a.bytes);
        writer.write(a.key, bytes);
        map.release_pages(bytes);
        at += a.bytes;
      }
      std::error_code ec;
      if (!fs::remove(part, ec)) fail(Errc::io, "[{}] {}: cannot remove: {}", kOp, part.string(), ec.message());
      pending[c].clear();
    }
    const uint64_t size = writer.finish();
    manifest.files.push_back({file, FileRole::payload, size, sha256_file(path)});
    shard_bytes = 0;
    ++shards_written;
  }

  void check_new_file(const std::string& file) const {
    check_file_name(file, fmt::format("[{}] {}", kOp, dest.string()));
    if (file == kManifestName || file.starts_with(kPayloadPrefix))
      fail(Errc::usage, "[{}] {}: file name '{}' is reserved for the manifest and payloads", kOp, dest.string(), file);
    if (manifest.find_file(file)) fail(Errc::duplicate, "[{}] {}: file '{}' added twice", kOp, dest.string(), file);
    if (manifest.files.size() >= kMaxFiles) fail(Errc::limit, "[{}] {}: more than {} files", kOp, dest.string(), kMaxFiles);
  }

  // Writes a non-payload file from chunks `next` returns until an empty one, fsynced and hashed.
  void write_file(std::string file, FileRole role, const std::function<std::span<const std::byte>()>& next) {
    if (role == FileRole::payload)
      fail(Errc::usage, "[{}] {}: payload files are written by the writer, not copied", kOp, file);
    check_new_file(file);
    const fs::path path = staging / file;
    Fd out = create_exclusive(path);
    Sha256 hash;
    uint64_t size = 0;
    for (auto chunk = next(); !chunk.empty(); chunk = next()) {
      hash.update(chunk);
      write_all(out.get(), chunk.data(), chunk.size(), path);
      size += chunk.size();
    }
    finish_file(out, path);
    manifest.files.push_back({std::move(file), role, size, hash.hex()});
  }
};

ArtifactWriter::ArtifactWriter(fs::path destination, WriterOptions options) {
  if (options.shard_bytes == 0) fail(Errc::usage, "[{}] the shard size must be at least 1 byte", kOp);
  impl_ = std::make_unique<Impl>(destination, options);
  impl_->manifest.provenance.tool = "lowbit " LOWBIT_VERSION;
}

ArtifactWriter::~ArtifactWriter() = default;

void ArtifactWriter::add(std::string name, const Shape& shape, std::string_view codec_id, codec::EncodedTensor tensor) {
  Impl& w = *impl_;
  const std::string context = fmt::format("[{}] tensor '{}'", kOp, name);
  check_tensor_name(name, context);
  if (w.manifest.find_tensor(name)) fail(Errc::duplicate, "{}: added twice", context);
  if (w.manifest.tensors.size() >= kMaxTensors) fail(Errc::limit, "{}: more than {} tensors", context, kMaxTensors);
  checked_shape_numel(shape, context);
  const codec::Codec& c = codec::codec_or_throw(codec_id, context);
  codec::validate_tensor({&c, tensor.params, shape, tensor.views()}, context);

  uint64_t bytes = 0;
  for (const auto& [role, array] : tensor.arrays) bytes = checked_add(bytes, array.bytes.size(), context);
  if (!w.shard_empty() && w.shard_bytes + bytes > w.options.shard_bytes) w.flush_shard();

  TensorEntry entry{name, shape, std::string(codec_id), std::move(tensor.params), {}};
  for (auto& [role, array] : tensor.arrays) {
    std::string key = array_key(name, role);
    entry.arrays.push_back({role, w.shard_name(), key, array.dtype, array.shape});
    w.append(std::move(key), array);
  }
  w.shard_bytes += bytes;
  w.manifest.tensors.push_back(std::move(entry));
  if (w.shard_bytes >= w.options.shard_bytes) w.flush_shard();
}

void ArtifactWriter::add_dense(std::string name, const TensorView& tensor) {
  codec::EncodedTensor encoded;
  encoded.params = dense_params(tensor.dtype);
  TensorBuffer data{tensor.dtype, tensor.shape, {tensor.bytes.begin(), tensor.bytes.end()}};
  encoded.arrays.emplace_back("data", std::move(data));
  add(std::move(name), tensor.shape, "dense", std::move(encoded));
}

void ArtifactWriter::add_file(const fs::path& source, FileRole role, std::string name) {
  if (name.empty()) name = source.filename().string();
  Fd in(::open(source.c_str(), O_RDONLY | O_CLOEXEC));
  if (in.get() < 0) fail_errno(kOp, source.string());
  std::vector<std::byte> buffer(1 << 20);
  impl_->write_file(std::move(name), role, [&]() -> std::span<const std::byte> {
    for (;;) {
      const ssize_t n = ::read(in.get(), buffer.data(), buffer.size());
      if (n >= 0) return {buffer.data(), static_cast<size_t>(n)};
      if (errno != EINTR) fail_errno(kOp, source.string());
    }
  });
}

void ArtifactWriter::add_file_contents(std::string name, FileRole role, std::string_view contents) {
  auto bytes = std::as_bytes(std::span(contents));
  impl_->write_file(std::move(name), role, [&] { return std::exchange(bytes, {}); });
}

void ArtifactWriter::set_config(nlohmann::json config) {
  if (!config.is_object()) fail(Errc::usage, "[{}] the model config must be a JSON object", kOp);
  impl_->manifest.config = std::move(config);
}

void ArtifactWriter::set_provenance(Provenance provenance) {
  if (provenance.tool.empty()) provenance.tool = impl_->manifest.provenance.tool;
  impl_->manifest.provenance = std::move(provenance);
}

void ArtifactWriter::set_recipe(const nlohmann::json& recipe) {
  impl_->recipe_text = recipe.dump(2) + "\n";
  add_file_contents(std::string(kRecipeFileName), FileRole::recipe, impl_->recipe_text);
}

const Manifest& ArtifactWriter::commit(const std::function<nlohmann::json(uint64_t artifact_bytes)>& quality) {
  Impl& w = *impl_;
  if (w.dir.published()) fail(Errc::internal, "[{}] {}: committed twice", kOp, w.dest.string());
  w.flush_shard();
  std::string quality_text;
  if (quality) {
    // The record states the artifact's size, which includes the record and the manifest listing it: iterate until
    // the size stated is the size made (a digit more in the number may lengthen both).
    const uint64_t files = w.files_bytes();
    for (uint64_t stated = files, made = 0;; stated = made) {
      quality_text = quality(stated).dump(2) + "\n";
      Manifest trial = w.manifest;
      trial.files.push_back({std::string(kQualityFileName), FileRole::quality, quality_text.size(),
                             sha256_hex(std::as_bytes(std::span(quality_text)))});
      made = files + quality_text.size() + trial.serialize().size();
      if (made == stated) break;
    }
    add_file_contents(std::string(kQualityFileName), FileRole::quality, quality_text);
  }
  const std::string text = w.manifest.serialize();
  // Never publish what a reader rejects.
  const Manifest written = Manifest::parse(text, fmt::format("{} (as written)", kManifestName));
  if (quality) check_quality(quality_text, written, w.files_bytes() + text.size(), kQualityFileName);
  if (!w.recipe_text.empty()) check_recipe(w.recipe_text, written, kRecipeFileName);
  const fs::path path = w.staging / kManifestName;
  Fd out = create_exclusive(path);
  write_all(out.get(), reinterpret_cast<const std::byte*>(text.data()), text.size(), path);
  finish_file(out, path);
  w.dir.publish();
  return w.manifest;
}

const fs::path& ArtifactWriter::staging_dir() const { return impl_->staging; }

}  // namespace lowbit::artifact
