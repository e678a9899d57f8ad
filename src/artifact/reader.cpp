#include "lowbit/artifact/reader.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "lowbit/artifact/records.h"
#include "lowbit/core/error.h"
#include "lowbit/core/mapped_file.h"
#include "lowbit/core/progress.h"
#include "lowbit/core/sha256.h"
#include "lowbit/core/thread_pool.h"
#include "lowbit/io/json.h"
#include "lowbit/io/safetensors.h"

namespace lowbit::artifact {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kOp = "[verify]";
// Artifacts of fewer payload bytes open in a blink and print no progress.
constexpr uint64_t kProgressBytes = uint64_t{256} << 20;
constexpr size_t kHashPieceBytes = size_t{16} << 20;

// One declared file as opened: its identity when checked and, for payloads, the mapping and the parsed header.
struct OpenFile {
  const FileEntry* entry = nullptr;
  fs::path path;
  FileIdentity identity;
  MappedFile map;                              // payloads only
  io::SafetensorsHeader header;                // payloads only
  std::map<std::string, size_t, std::less<>> index;  // key -> header.entries position
  std::vector<bool> used;                      // per header entry: declared by the manifest
  std::string text;                            // quality and recipe records: the bytes hashed, then parsed
};

bool is_record(FileRole role) { return role == FileRole::quality || role == FileRole::recipe; }

// A regular, not symlinked, not hard-linked file. Errc::missing_file, unsafe_path.
FileIdentity checked_identity(const fs::path& path) {
  const FileIdentity id = file_identity(path);
  if (id.link_count != 1)
    fail(Errc::unsafe_path, "{} {}: has {} hard links; artifact files must have exactly one", kOp, path.string(),
         id.link_count);
  return id;
}

void check_size(const fs::path& path, uint64_t actual, uint64_t declared) {
  if (actual < declared)
    fail(Errc::truncated, "{} {}: {} bytes, the manifest declares {}", kOp, path.string(), actual, declared);
  if (actual > declared)
    fail(Errc::size_mismatch, "{} {}: {} bytes, the manifest declares {}", kOp, path.string(), actual, declared);
}

void check_hash(const fs::path& path, const std::string& actual, const std::string& declared, Errc code) {
  if (actual != declared)
    fail(code, "{} {}: SHA-256 is {}, the manifest declares {}", kOp, path.string(), actual, declared);
}

// Every entry of the directory must be the manifest or a declared file.
void check_no_extra_files(const fs::path& dir, const Manifest& m) {
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name != kManifestName && !m.find_file(name))
      fail(Errc::extra_file, "{} {}: {} is not declared in the manifest", kOp, dir.string(), io::quote(name));
  }
}

}  // namespace

struct Artifact::Impl {
  fs::path dir;
  fs::path manifest_path;
  FileIdentity manifest_identity;
  std::string manifest_sha;
  Manifest manifest;
  std::vector<OpenFile> files;  // in manifest order
  std::map<std::string, codec::TensorRef, std::less<>> tensors;
  nlohmann::json quality, recipe;  // checked records, null when absent

  void read_manifest() {
    manifest_path = dir / kManifestName;
    manifest_identity = checked_identity(manifest_path);
    if (manifest_identity.size > kMaxManifestBytes)
      fail(Errc::limit, "{} {}: {} bytes, more than the limit {}", kOp, manifest_path.string(), manifest_identity.size,
           kMaxManifestBytes);
    const MappedFile map = MappedFile::open(manifest_path);
    if (map.identity() != manifest_identity)
      fail(Errc::changed, "{} {}: changed while it was being opened", kOp, manifest_path.string());
    manifest_sha = sha256_hex(map.bytes());
    const std::string_view text(reinterpret_cast<const char*>(map.bytes().data()), map.size());
    manifest = Manifest::parse(text, manifest_path.string());
  }

  // Maps and hashes a file whose identity and size were checked.
  void open_file(OpenFile& f, bool verify_hash, Progress* progress) {
    if (is_record(f.entry->role)) {  // read once: the bytes hashed are the bytes parsed
      if (f.identity.size > kMaxRecordBytes)
        fail(Errc::limit, "{} {}: {} bytes, more than the limit {}", kOp, f.path.string(), f.identity.size,
             kMaxRecordBytes);
      const MappedFile map = MappedFile::open(f.path);
      if (map.identity() != f.identity)
        fail(Errc::changed, "{} {}: changed while it was being opened", kOp, f.path.string());
      if (verify_hash) check_hash(f.path, sha256_hex(map.bytes()), f.entry->sha256, Errc::hash_mismatch);
      f.text.assign(reinterpret_cast<const char*>(map.bytes().data()), map.size());
      return;
    }
    if (f.entry->role != FileRole::payload) {
      if (verify_hash) check_hash(f.path, sha256_file(f.path), f.entry->sha256, Errc::hash_mismatch);
      return;
    }
    f.map = MappedFile::open(f.path);
    if (f.map.identity() != f.identity)
      fail(Errc::changed, "{} {}: changed while it was being opened", kOp, f.path.string());
    if (verify_hash) {
      // In pieces, each released once hashed: the hash holds one piece of the file, and each tensor's reader
      // faults back in only what it reads.
      Sha256 hash;
      const auto bytes = f.map.bytes();
      for (size_t at = 0; at < bytes.size(); at += kHashPieceBytes) {
        const auto piece = bytes.subspan(at, std::min(kHashPieceBytes, bytes.size() - at));
        hash.update(piece);
        f.map.release_pages(piece);
        if (progress) progress->advance(piece.size());
      }
      check_hash(f.path, hash.hex(), f.entry->sha256, Errc::hash_mismatch);
    }
    f.header = io::parse_safetensors_header(f.map.bytes(), f.path.string());
    for (size_t i = 0; i < f.header.entries.size(); ++i) f.index.emplace(f.header.entries[i].name, i);
    f.used.assign(f.header.entries.size(), false);
  }

  OpenFile& payload(const std::string& name) {
    for (OpenFile& f : files)
      if (f.entry->name == name) return f;
    fail(Errc::internal, "{} {}: payload '{}' not opened", kOp, dir.string(), name);
  }

  // The stored array a manifest entry declares, checked against the payload's header.
  TensorView array_view(const TensorEntry& t, const ArrayEntry& a) {
    OpenFile& f = payload(a.file);
    const auto it = f.index.find(a.key);
    if (it == f.index.end())
      fail(Errc::format, "{} {}: tensor '{}' array '{}': key '{}' is not in the payload", kOp, f.path.string(), t.name,
           a.role, a.key);
    const io::SafetensorsEntry& e = f.header.entries[it->second];
    if (e.dtype != a.dtype)
      fail(Errc::dtype, "{} {}: '{}' is {}, the manifest declares {}", kOp, f.path.string(), a.key,
           dtype_name(e.dtype), dtype_name(a.dtype));
    if (e.shape != a.shape)
      fail(Errc::shape, "{} {}: '{}' has shape {}, the manifest declares {}", kOp, f.path.string(), a.key,
           shape_str(e.shape), shape_str(a.shape));
    const uint64_t offset = f.header.data_start + e.begin;
    if (offset % dtype_size(e.dtype) != 0)
      fail(Errc::layout, "{} {}: '{}' starts at byte {}, not aligned to its {}-byte elements", kOp, f.path.string(),
           a.key, offset, dtype_size(e.dtype));
    f.used[it->second] = true;
    return {e.dtype, e.shape, f.map.bytes().subspan(offset, e.end - e.begin)};
  }

  void build_tensors() {
    for (const TensorEntry& t : manifest.tensors) {
      codec::TensorRef ref{&codec::codec_or_throw(t.codec, kOp), t.params, t.shape, {}};
      for (const ArrayEntry& a : t.arrays) ref.arrays.items.emplace_back(a.role, array_view(t, a));
      tensors.emplace(t.name, std::move(ref));
    }
    for (const OpenFile& f : files)
      for (size_t i = 0; i < f.used.size(); ++i)
        if (f.entry->role == FileRole::payload && !f.used[i])
          fail(Errc::layout, "{} {}: array '{}' is not declared in the manifest", kOp, f.path.string(),
               f.header.entries[i].name);
  }

  // After the tensors: the records restate facts about them.
  void check_records(uint64_t artifact_bytes) {
    for (const OpenFile& f : files) {
      if (f.entry->role == FileRole::quality) quality = check_quality(f.text, manifest, artifact_bytes, f.path.string());
      if (f.entry->role == FileRole::recipe) recipe = check_recipe(f.text, manifest, f.path.string());
    }
  }

  // Checks every tensor's content, releasing its pages once checked (a reader faults back in what it uses).
  void validate_tensors() {
    std::vector<const std::pair<const std::string, codec::TensorRef>*> list;
    uint64_t bytes = 0;
    for (const auto& item : tensors) {
      list.push_back(&item);
      for (const auto& [role, view] : item.second.arrays.items) bytes += view.bytes.size();
    }
    std::optional<Progress> progress;
    if (bytes >= kProgressBytes) progress.emplace("check tensors", bytes, "B");
    default_pool().parallel_for(list.size(), 1, [&](size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i) {
        const codec::TensorRef& ref = list[i]->second;
        codec::validate_tensor(ref, fmt::format("{} {}: tensor '{}'", kOp, manifest_path.string(), list[i]->first));
        for (const auto& [role, view] : ref.arrays.items) {
          for (const OpenFile& f : files) f.map.release_pages(view.bytes);  // only the mapping holding it acts
          if (progress) progress->advance(view.bytes.size());
        }
      }
    });
  }
};

Artifact::Artifact(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Artifact::Artifact(Artifact&&) noexcept = default;
Artifact& Artifact::operator=(Artifact&&) noexcept = default;
Artifact::~Artifact() = default;

Artifact Artifact::open(const fs::path& dir, const ReadOptions& options) {
  auto impl = std::make_unique<Impl>();
  Impl& a = *impl;
  a.dir = dir;
  if (!fs::is_directory(dir)) fail(Errc::missing_file, "{} {}: not a directory", kOp, dir.string());
  a.read_manifest();
  check_no_extra_files(dir, a.manifest);
  a.files.resize(a.manifest.files.size());
  for (size_t i = 0; i < a.files.size(); ++i) {
    a.files[i].entry = &a.manifest.files[i];
    a.files[i].path = dir / a.manifest.files[i].name;
  }
  // Checked in order first (cheap and deterministic), then hashed and parsed in parallel.
  for (OpenFile& f : a.files) {
    f.identity = checked_identity(f.path);
    check_size(f.path, f.identity.size, f.entry->size);
  }
  uint64_t payload_bytes = 0;
  for (const OpenFile& f : a.files)
    if (f.entry->role == FileRole::payload) payload_bytes += f.entry->size;
  {
    std::optional<Progress> progress;
    if (options.verify_hash && payload_bytes >= kProgressBytes) progress.emplace("hash", payload_bytes, "B");
    default_pool().parallel_for(a.files.size(), 1, [&](size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i)
        a.open_file(a.files[i], options.verify_hash, progress ? &*progress : nullptr);
    });
  }
  a.build_tensors();
  a.validate_tensors();
  uint64_t artifact_bytes = a.manifest_identity.size;
  for (const FileEntry& f : a.manifest.files) artifact_bytes += f.size;
  a.check_records(artifact_bytes);
  if (options.before_recheck) options.before_recheck();
  Artifact artifact(std::move(impl));
  artifact.recheck(options.paranoid);
  return artifact;
}

void Artifact::recheck(bool rehash) const {
  const Impl& a = *impl_;
  auto same = [&](const fs::path& path, const FileIdentity& expected, const std::string& sha) {
    std::optional<FileIdentity> now;
    try {
      now = file_identity(path);
    } catch (const Error&) {
    }
    if (!now || *now != expected) fail(Errc::changed, "{} {}: changed while the artifact was loaded", kOp, path.string());
    if (rehash && sha256_file(path) != sha)
      fail(Errc::changed, "{} {}: content changed while the artifact was loaded", kOp, path.string());
  };
  same(a.manifest_path, a.manifest_identity, a.manifest_sha);
  for (const OpenFile& f : a.files) same(f.path, f.identity, f.entry->sha256);
}

const Manifest& Artifact::manifest() const { return impl_->manifest; }
const nlohmann::json& Artifact::quality() const { return impl_->quality; }
const nlohmann::json& Artifact::recipe() const { return impl_->recipe; }
const fs::path& Artifact::dir() const { return impl_->dir; }

std::vector<std::string> Artifact::tensor_names() const {
  std::vector<std::string> names;
  for (const TensorEntry& t : impl_->manifest.tensors) names.push_back(t.name);
  return names;
}

bool Artifact::contains(std::string_view name) const { return impl_->tensors.find(name) != impl_->tensors.end(); }

const codec::TensorRef& Artifact::tensor(std::string_view name) const {
  const auto it = impl_->tensors.find(name);
  if (it == impl_->tensors.end())
    fail(Errc::format, "[artifact] {}: no tensor '{}'", impl_->dir.string(), name);
  return it->second;
}

void Artifact::release_pages(std::string_view name) const {
  for (const auto& [role, view] : tensor(name).arrays.items)
    for (const OpenFile& f : impl_->files) f.map.release_pages(view.bytes);  // only the mapping holding it acts
}

fs::path Artifact::file_path(std::string_view name) const {
  if (!impl_->manifest.find_file(name))
    fail(Errc::missing_file, "[artifact] {}: no file '{}' declared", impl_->dir.string(), name);
  return impl_->dir / name;
}

std::vector<fs::path> Artifact::files_with_role(FileRole role) const {
  std::vector<fs::path> paths;
  for (const FileEntry& f : impl_->manifest.files)
    if (f.role == role) paths.push_back(impl_->dir / f.name);
  return paths;
}

uint64_t Artifact::total_bytes() const {
  uint64_t total = impl_->manifest_identity.size;
  for (const FileEntry& f : impl_->manifest.files) total += f.size;
  return total;
}

}  // namespace lowbit::artifact
