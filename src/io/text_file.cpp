#include "lowbit/io/text_file.h"

#include <zlib.h>

#include <cstdio>
#include <memory>
#include <vector>

#include "lowbit/core/error.h"

namespace lowbit::io {

namespace {

constexpr size_t kChunk = size_t{1} << 16;

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

// Reads up to kChunk bytes; false at the end of the file.
bool read_chunk(std::FILE* f, std::vector<unsigned char>& buffer, size_t& n, std::string_view op,
                const std::string& path) {
  n = std::fread(buffer.data(), 1, buffer.size(), f);
  if (std::ferror(f)) fail_errno(op, path);
  return n > 0;
}

void check_size(uint64_t size, uint64_t max_bytes, std::string_view op, const std::string& path, bool gzip) {
  if (size > max_bytes)
    fail(Errc::limit, "[{}] {}: more than the {} bytes of text allowed{}", op, path, max_bytes,
         gzip ? " once decompressed" : "");
}

class Inflater {
 public:
  Inflater() {
    // 16 + MAX_WBITS: gzip framing only (header, CRC-32 and length checked by zlib), no raw or zlib streams.
    if (inflateInit2(&z_, 16 + MAX_WBITS) != Z_OK) fail(Errc::internal, "[gzip] inflateInit2 failed");
  }
  ~Inflater() { inflateEnd(&z_); }
  Inflater(const Inflater&) = delete;
  Inflater& operator=(const Inflater&) = delete;
  z_stream* operator->() { return &z_; }
  z_stream* get() { return &z_; }

 private:
  z_stream z_{};
};

std::string inflate_file(std::FILE* f, std::vector<unsigned char>& in, size_t n, std::string_view op,
                         const std::string& path, uint64_t max_bytes) {
  Inflater z;
  std::string text;
  std::vector<unsigned char> out(kChunk);
  bool in_member = true;  // inside a gzip member: the input must not end here
  z->next_in = in.data();
  z->avail_in = static_cast<uInt>(n);
  for (;;) {
    if (z->avail_in == 0) {
      if (!read_chunk(f, in, n, op, path)) break;
      z->next_in = in.data();
      z->avail_in = static_cast<uInt>(n);
    }
    if (!in_member) {
      // Another member follows the one that ended.
      if (inflateReset(z.get()) != Z_OK) fail(Errc::internal, "[{}] {}: inflateReset failed", op, path);
      in_member = true;
    }
    z->next_out = out.data();
    z->avail_out = static_cast<uInt>(out.size());
    const int rc = inflate(z.get(), Z_NO_FLUSH);
    if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR)
      fail(Errc::format, "[{}] {}: corrupt gzip data ({})", op, path, z->msg ? z->msg : zError(rc));
    const size_t produced = out.size() - z->avail_out;
    check_size(text.size() + produced, max_bytes, op, path, true);
    text.append(reinterpret_cast<const char*>(out.data()), produced);
    if (rc == Z_STREAM_END) in_member = false;
  }
  if (in_member) fail(Errc::truncated, "[{}] {}: the gzip data ends early", op, path);
  return text;
}

}  // namespace

std::string read_text_file(const std::filesystem::path& path, std::string_view op, uint64_t max_bytes) {
  const std::string name = path.string();
  const File f(std::fopen(name.c_str(), "rb"));
  if (!f) fail_errno(op, name);
  std::vector<unsigned char> buffer(kChunk);
  size_t n = 0;
  if (!read_chunk(f.get(), buffer, n, op, name)) return {};
  if (n >= 2 && buffer[0] == 0x1f && buffer[1] == 0x8b) return inflate_file(f.get(), buffer, n, op, name, max_bytes);
  std::string text;
  do {
    check_size(text.size() + n, max_bytes, op, name, false);
    text.append(reinterpret_cast<const char*>(buffer.data()), n);
  } while (read_chunk(f.get(), buffer, n, op, name));
  return text;
}

}  // namespace lowbit::io
