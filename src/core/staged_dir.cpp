#include "lowbit/core/staged_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <random>
#include <regex>
#include <system_error>

#include <fmt/format.h>

#include "lowbit/core/error.h"

namespace lowbit {

namespace fs = std::filesystem;

namespace {

std::string random_hex() {
  std::random_device rd;
  const uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return fmt::format("{:016x}", v);
}

bool pid_alive(long pid) { return pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM); }

// ".<name>.lowbit-staging-<pid>-<16 hex>" (a writer's staging directory) or ".<name>.lowbit-old-<pid>-<16 hex>"
// (a destination moved aside during a replacement without RENAME_EXCHANGE).
const std::regex& leftover_pattern() {
  static const std::regex re(R"(^\.(.+)\.lowbit-(staging|old)-([0-9]{1,10})-[0-9a-f]{16}$)");
  return re;
}

std::string leftover_name(const std::string& name, std::string_view kind) {
  return fmt::format(".{}.lowbit-{}-{}-{}", name, kind, ::getpid(), random_hex());
}

// True when nobody holds the staging directory's lock (its writer holds it for its whole life).
bool lock_is_free(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return false;
  const bool free = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
  ::close(fd);
  return free;
}

}  // namespace

void fsync_dir(const fs::path& dir, std::string_view op) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail_errno(op, dir.string());
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) fail_errno(op, dir.string());
}

size_t clean_stale_staging(const fs::path& parent) {
  size_t handled = 0;
  std::error_code ec;
  for (fs::directory_iterator it(parent, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::smatch m;
    if (name.empty() || name.front() != '.' || !std::regex_match(name, m, leftover_pattern())) continue;
    if (!it->is_directory(ec) || it->is_symlink(ec) || pid_alive(std::stol(m[3].str()))) continue;
    std::error_code ignored;
    if (m[2] == "staging") {
      if (!lock_is_free(it->path())) continue;
      fs::remove_all(it->path(), ignored);
    } else if (!fs::exists(fs::symlink_status(parent / m[1].str()))) {
      fs::rename(it->path(), parent / m[1].str(), ignored);  // the replacement never happened: put it back
    } else {
      fs::remove_all(it->path(), ignored);
    }
    ++handled;
  }
  return handled;
}

StagedDirectory::StagedDirectory(const fs::path& destination, std::string_view op, bool force, Replaceable replaceable)
    : op_(op), force_(force), replaceable_(std::move(replaceable)) {
  dest_ = fs::absolute(destination).lexically_normal();
  if (!dest_.has_filename()) dest_ = dest_.parent_path();  // "dir/" names dir
  parent_ = dest_.parent_path();
  name_ = dest_.filename().string();
  if (!fs::is_directory(parent_)) fail(Errc::io, "[{}] {}: parent directory does not exist", op_, parent_.string());
  clean_stale_staging(parent_);
  if (fs::exists(fs::symlink_status(dest_))) check_replaceable();
  staging_ = parent_ / leftover_name(name_, "staging");
  if (::mkdir(staging_.c_str(), 0755) != 0) fail_errno(op_, staging_.string());
  lock_fd_ = ::open(staging_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (lock_fd_ < 0 || ::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    const int saved = errno;
    std::error_code ignored;
    fs::remove_all(staging_, ignored);
    errno = saved;
    fail_errno(op_, staging_.string());
  }
}

StagedDirectory::~StagedDirectory() {
  if (!published_) {
    std::error_code ignored;
    fs::remove_all(staging_, ignored);
  }
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

void StagedDirectory::check_replaceable() const {
  if (!force_) fail(Errc::exists, "[{}] {}: exists (use --force to replace it)", op_, dest_.string());
  const auto st = fs::symlink_status(dest_);
  if (!fs::is_directory(st) || !replaceable_.check(dest_))
    fail(Errc::exists, "[{}] {}: is not {}; refusing to replace it", op_, dest_.string(), replaceable_.kind);
}

void StagedDirectory::publish() {
  if (published_) fail(Errc::internal, "[{}] {}: published twice", op_, dest_.string());
  // Every file reaches the disk before the rename makes it visible, whichever way its writer wrote it.
  for (const fs::directory_entry& e : fs::directory_iterator(staging_)) {
    if (!e.is_regular_file() || e.is_symlink()) continue;
    const int fd = ::open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
    const bool ok = fd >= 0 && ::fsync(fd) == 0;
    if (fd >= 0) ::close(fd);
    if (!ok) fail_errno(op_, e.path().string());
  }
  fsync_dir(staging_, op_);
  const int flags = fs::exists(fs::symlink_status(dest_)) ? RENAME_EXCHANGE : RENAME_NOREPLACE;
  if (flags == RENAME_EXCHANGE) check_replaceable();
  if (::renameat2(AT_FDCWD, staging_.c_str(), AT_FDCWD, dest_.c_str(), flags) == 0) {
    published_ = true;
    fsync_dir(parent_, op_);
    std::error_code ignored;
    if (flags == RENAME_EXCHANGE) fs::remove_all(staging_, ignored);  // now holds the old destination
    return;
  }
  if (errno == EEXIST) fail(Errc::exists, "[{}] {}: appeared while writing", op_, dest_.string());
  if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) fail_errno(op_, dest_.string());
  publish_by_two_renames(flags == RENAME_EXCHANGE);
}

// For filesystems without renameat2 flags. Between the two renames the destination is absent; the old one waits
// under ".<name>.lowbit-old-<pid>-<hex>", which clean_stale_staging() renames back if we die there.
void StagedDirectory::publish_by_two_renames(bool replace) {
  const fs::path old = parent_ / leftover_name(name_, "old");
  if (replace) fs::rename(dest_, old);
  fs::rename(staging_, dest_);
  published_ = true;
  fsync_dir(parent_, op_);
  std::error_code ignored;
  if (replace) fs::remove_all(old, ignored);
}

}  // namespace lowbit
