#include "lowbit/core/sha256.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "lowbit/core/error.h"
#include "lowbit/core/progress.h"

namespace lowbit {

struct Sha256::State {
  EVP_MD_CTX* ctx = nullptr;
};

Sha256::Sha256() : state_(std::make_unique<State>()) {
  state_->ctx = EVP_MD_CTX_new();
  if (!state_->ctx || EVP_DigestInit_ex(state_->ctx, EVP_sha256(), nullptr) != 1)
    fail(Errc::internal, "[sha256] cannot initialize OpenSSL digest");
}

Sha256::~Sha256() { EVP_MD_CTX_free(state_->ctx); }

void Sha256::update(std::span<const std::byte> data) {
  if (!data.empty() && EVP_DigestUpdate(state_->ctx, data.data(), data.size()) != 1)
    fail(Errc::internal, "[sha256] digest update failed");
}

std::string Sha256::hex() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_DigestFinal_ex(state_->ctx, digest, &len) != 1) fail(Errc::internal, "[sha256] digest final failed");
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(2 * len, '0');
  for (unsigned i = 0; i < len; ++i) {
    out[2 * i] = kHex[digest[i] >> 4];
    out[2 * i + 1] = kHex[digest[i] & 15];
  }
  return out;
}

std::string sha256_hex(std::span<const std::byte> data) {
  Sha256 h;
  h.update(data);
  return h.hex();
}

std::string sha256_file(const std::filesystem::path& path, Progress* progress) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ELOOP) fail(Errc::unsafe_path, "[sha256] {}: is a symlink", path.string());
    if (errno == ENOENT) fail(Errc::missing_file, "[sha256] {}: file is missing", path.string());
    fail_errno("sha256", path.string());
  }
  Sha256 h;
  std::vector<std::byte> buffer(1 << 20);
  for (;;) {
    const ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      ::close(fd);
      fail_errno("sha256", path.string());
    }
    if (n == 0) break;
    h.update(std::span(buffer.data(), static_cast<size_t>(n)));
    if (progress) progress->advance(static_cast<uint64_t>(n));
  }
  ::close(fd);
  return h.hex();
}

}  // namespace lowbit
