// SHA-256 (OpenSSL libcrypto), streaming and one-shot, as lowercase hex.
#pragma once

#include <cstddef>
#include <filesystem>
#include <memory>
#include <span>
#include <string>

namespace lowbit {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(std::span<const std::byte> data);
  void update(const void* data, size_t size) { update({static_cast<const std::byte*>(data), size}); }
  std::string hex();  // finishes the digest

 private:
  struct State;
  std::unique_ptr<State> state_;
};

std::string sha256_hex(std::span<const std::byte> data);
// Hashes a file by streaming it; does not follow a final symlink.
class Progress;
// Advances `progress` (when given) by the bytes read.
std::string sha256_file(const std::filesystem::path& path, Progress* progress = nullptr);

}  // namespace lowbit
