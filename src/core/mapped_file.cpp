#include "lowbit/core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "lowbit/core/error.h"

namespace lowbit {

namespace {

FileIdentity identity_of(const struct stat& st) {
  return {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino), static_cast<uint64_t>(st.st_size),
          static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec,
          static_cast<uint64_t>(st.st_nlink)};
}

}  // namespace

FileIdentity file_identity(const std::filesystem::path& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) fail(Errc::missing_file, "[file_identity] {}: file is missing", path.string());
    fail_errno("file_identity", path.string());
  }
  if (S_ISLNK(st.st_mode)) fail(Errc::unsafe_path, "[file_identity] {}: is a symlink", path.string());
  if (!S_ISREG(st.st_mode)) fail(Errc::unsafe_path, "[file_identity] {}: is not a regular file", path.string());
  return identity_of(st);
}

MappedFile MappedFile::open(const std::filesystem::path& path) {
  // O_NONBLOCK: opening a FIFO for reading otherwise waits for a writer, forever; with it the open returns at once
  // and the type check below refuses the FIFO (the flag changes nothing for a regular file).
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ELOOP) fail(Errc::unsafe_path, "[mmap] {}: is a symlink", path.string());
    if (errno == ENOENT) fail(Errc::missing_file, "[mmap] {}: file is missing", path.string());
    fail_errno("mmap", path.string());
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    fail_errno("mmap", path.string());
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(Errc::unsafe_path, "[mmap] {}: is not a regular file", path.string());
  }
  MappedFile file;
  file.identity_ = identity_of(st);
  file.size_ = static_cast<size_t>(st.st_size);
  file.path_ = path;
  if (file.size_ > 0) {
    void* p = ::mmap(nullptr, file.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      fail_errno("mmap", path.string());
    }
    file.data_ = p;
  }
  ::close(fd);
  return file;
}

bool file_starts_with(const std::filesystem::path& path, std::string_view magic) {
  const MappedFile file = MappedFile::open(path);
  const auto bytes = file.bytes();
  return bytes.size() >= magic.size() && std::memcmp(bytes.data(), magic.data(), magic.size()) == 0;
}

MappedFile::MappedFile(MappedFile&& other) noexcept { *this = std::move(other); }

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (data_) ::munmap(data_, size_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    identity_ = other.identity_;
    path_ = std::move(other.path_);
  }
  return *this;
}

void MappedFile::release_pages(std::span<const std::byte> range) const {
  const auto begin = reinterpret_cast<uintptr_t>(data_), at = reinterpret_cast<uintptr_t>(range.data());
  if (!data_ || at < begin || at - begin > size_ || range.size() > size_ - (at - begin)) return;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = (at + page - 1) / page * page, last = (at + range.size()) / page * page;
  // Advice only: a failure leaves the pages resident, as they were.
  if (first < last) static_cast<void>(::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED));
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(data_, size_);
}

}  // namespace lowbit
