// Errors: every failure lowbit reports is a lowbit::Error carrying a code. The code decides the process exit
// status (usage 2, invalid input 3, anything else 1) and lets tests assert *why* something was rejected.
// Messages are one line, prefixed with the operation: "[read_safetensors] model.safetensors: ...".
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <string_view>

namespace lowbit {

enum class Errc {
  // Usage errors (exit 2).
  usage,
  // Invalid input or artifact (exit 3). Fine-grained so tests can check the reason for a rejection.
  format,          // not the expected format: bad magic, malformed JSON, wrong field type
  version,         // unsupported format version
  unknown_codec,   // codec id not in the registry
  codec_params,    // codec parameters outside the codec's allowed set
  dtype,           // array dtype inconsistent with codec, or unknown dtype name
  shape,           // array or logical shape inconsistent
  overflow,        // arithmetic on sizes overflowed
  missing_file,    // a declared file is absent
  extra_file,      // a file present but not declared
  truncated,       // a file or span is shorter than declared
  size_mismatch,   // a file's size differs from the declared one
  hash_mismatch,   // SHA-256 differs from the declared one
  unsafe_path,     // path separators, "..", absolute paths, symlinks, hard links
  limit,           // a bound exceeded: header size, tensor count, dimension
  duplicate,       // duplicate names
  non_finite,      // NaN or Inf where forbidden
  reserved_code,   // a packed code outside the codec's alphabet
  layout,          // offsets with holes, overlaps or trailing bytes
  changed,         // a file changed while it was being loaded
  unsupported,     // valid input of a kind lowbit does not run (e.g. an unknown architecture)
  // Everything else (exit 1).
  io,
  exists,  // destination exists and --force was not given
  internal,
};

std::string_view errc_name(Errc code);
int exit_code(Errc code);
bool is_invalid_input(Errc code);

class Error : public std::runtime_error {
 public:
  Error(Errc code, std::string message) : std::runtime_error(std::move(message)), code_(code) {}
  Errc code() const { return code_; }

 private:
  Errc code_;
};

template <class... Args>
[[noreturn]] void fail(Errc code, fmt::format_string<Args...> format, Args&&... args) {
  throw Error(code, fmt::format(format, std::forward<Args>(args)...));
}

// Throws errno's message as an Errc::io error: "[op] path: No such file or directory".
[[noreturn]] void fail_errno(std::string_view op, std::string_view path);

}  // namespace lowbit
