// Read-only memory-mapped files, opened without following symlinks, with the identity (device, inode, size,
// mtime) recorded at open so that a loader can check afterwards that the file did not change underneath it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>

namespace lowbit {

struct FileIdentity {
  uint64_t device = 0;
  uint64_t inode = 0;
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  uint64_t link_count = 0;
  bool operator==(const FileIdentity&) const = default;
};

// Identity of a regular file, without following a final symlink. Throws Errc::unsafe_path for a symlink or a
// non-regular file, Errc::missing_file when absent.
FileIdentity file_identity(const std::filesystem::path& path);

class MappedFile {
 public:
  MappedFile() = default;
  // Maps the whole file read-only. Refuses symlinks and non-regular files (Errc::unsafe_path): FIFOs, devices and
  // directories are refused without blocking, so every reader of an untrusted file opens it through here.
  static MappedFile open(const std::filesystem::path& path);

  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  std::span<const std::byte> bytes() const { return {static_cast<const std::byte*>(data_), size_}; }
  size_t size() const { return size_; }
  const FileIdentity& identity() const { return identity_; }
  const std::filesystem::path& path() const { return path_; }
  // Drops the whole pages inside `range` from the process's resident set (madvise MADV_DONTNEED): a loader that
  // has copied a tensor out of the file no longer holds its pages. They stay mapped and read the file's bytes
  // again if touched. A range outside this mapping (an in-memory image) is left alone.
  void release_pages(std::span<const std::byte> range) const;

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
  FileIdentity identity_;
  std::filesystem::path path_;
};

// Whether the file begins with `magic` (a format sniff), opened as MappedFile::open does: a FIFO, device or
// directory throws Errc::unsafe_path instead of blocking or reading endlessly.
bool file_starts_with(const std::filesystem::path& path, std::string_view magic);

}  // namespace lowbit
