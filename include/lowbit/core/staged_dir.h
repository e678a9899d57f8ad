// Atomic directory replacement, the one mechanism behind every lowbit writer (artifacts, audio8 exports, HF
// conversions): the output is written into a staging directory beside the destination
// (".<name>.lowbit-staging-<pid>-<16 hex>", held under an flock for the writer's whole life) and published by one
// rename, RENAME_EXCHANGE over an existing destination. Until publish() the destination is untouched; an
// interrupted writer leaves at most a recognisable staging directory, which the next writer into the same parent
// removes (or, for a replacement interrupted between two plain renames, puts back).
//
// An existing destination is replaced only with `force`, and only when it verifies as the kind being written
// (`Replaceable::check`): a directory that merely resembles it is refused and left as it is.
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

namespace lowbit {

struct Replaceable {
  std::string_view kind;  // "a lowbit artifact", for messages
  // True when the existing directory is that kind and holds nothing else; called before writing and again just
  // before the exchange.
  std::function<bool(const std::filesystem::path&)> check;
};

class StagedDirectory {
 public:
  // Throws Errc::exists when the destination exists and !force, or exists and is not `replaceable`; Errc::io when
  // the parent directory is missing. Cleans stale staging directories in the parent first.
  StagedDirectory(const std::filesystem::path& destination, std::string_view op, bool force, Replaceable replaceable);
  ~StagedDirectory();  // removes the staging directory unless published
  StagedDirectory(const StagedDirectory&) = delete;
  StagedDirectory& operator=(const StagedDirectory&) = delete;

  // Where the writer writes (regular files; publish() fsyncs each of them and the directory).
  const std::filesystem::path& path() const { return staging_; }
  const std::filesystem::path& destination() const { return dest_; }
  bool published() const { return published_; }

  // Puts the staging directory at the destination atomically, replacing (and then deleting) an existing one.
  void publish();

 private:
  void check_replaceable() const;
  void publish_by_two_renames(bool replace);

  std::filesystem::path dest_, parent_, staging_;
  std::string name_, op_;
  bool force_;
  Replaceable replaceable_;
  int lock_fd_ = -1;
  bool published_ = false;
};

// Removes, in `parent`, staging directories whose writer is gone (its pid is dead and nobody holds its lock), and
// restores or removes directories an interrupted replacement moved aside. Returns how many it handled. Every
// StagedDirectory calls it; exposed for tests.
size_t clean_stale_staging(const std::filesystem::path& parent);

// fsync of a directory (its entries), Errc::io naming `op` on failure.
void fsync_dir(const std::filesystem::path& dir, std::string_view op);

}  // namespace lowbit
