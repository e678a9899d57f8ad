#include "lowbit/core/error.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace lowbit {

std::string_view errc_name(Errc code) {
  switch (code) {
    case Errc::usage: return "usage";
    case Errc::format: return "format";
    case Errc::version: return "version";
    case Errc::unknown_codec: return "unknown_codec";
    case Errc::codec_params: return "codec_params";
    case Errc::dtype: return "dtype";
    case Errc::shape: return "shape";
    case Errc::overflow: return "overflow";
    case Errc::missing_file: return "missing_file";
    case Errc::extra_file: return "extra_file";
    case Errc::truncated: return "truncated";
    case Errc::size_mismatch: return "size_mismatch";
    case Errc::hash_mismatch: return "hash_mismatch";
    case Errc::unsafe_path: return "unsafe_path";
    case Errc::limit: return "limit";
    case Errc::duplicate: return "duplicate";
    case Errc::non_finite: return "non_finite";
    case Errc::reserved_code: return "reserved_code";
    case Errc::layout: return "layout";
    case Errc::changed: return "changed";
    case Errc::unsupported: return "unsupported";
    case Errc::io: return "io";
    case Errc::exists: return "exists";
    case Errc::internal: return "internal";
  }
  return "internal";
}

bool is_invalid_input(Errc code) {
  return code != Errc::usage && code != Errc::io && code != Errc::exists && code != Errc::internal;
}

int exit_code(Errc code) {
  if (code == Errc::usage) return 2;
  return is_invalid_input(code) ? 3 : 1;
}

std::string printable(std::string_view text, size_t max_bytes) {
  std::string out;
  size_t keep = std::min(text.size(), max_bytes);
  // A cut falls before a UTF-8 sequence, not inside one.
  if (keep < text.size())
    while (keep > 0 && (static_cast<unsigned char>(text[keep]) & 0xC0) == 0x80) --keep;
  const std::string_view kept = text.substr(0, keep);
  out.reserve(kept.size());
  for (const char c : kept) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '\n')
      out += "\\n";
    else if (c == '\t')
      out += "\\t";
    else if (byte < 0x20 || byte == 0x7f)
      out += fmt::format("\\x{:02x}", byte);
    else
      out += c;
  }
  if (text.size() > max_bytes) out += fmt::format("... ({} bytes)", text.size());
  return out;
}

void fail_errno(std::string_view op, std::string_view path) {
  const int saved = errno;
  fail(Errc::io, "[{}] {}: {}", op, path, std::strerror(saved));
}

}  // namespace lowbit
