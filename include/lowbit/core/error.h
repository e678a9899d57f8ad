// Errors: every failure lowbit reports is a lowbit::Error carrying a code. The code decides the process exit
// status (usage 2, invalid input 3, anything else 1) and lets tests assert *why* something was rejected.
// Messages are one line, prefixed with the operation: "[read_safetensors] model.safetensors: ...".
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

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

// Text from a file made safe for a one-line message: control characters (newline, escape, ...) become \n, \t or
// \xNN, and text longer than `max_bytes` is cut with a note of its full length. Printable text passes unchanged,
// so applying it twice changes nothing.
inline constexpr size_t kMaxShownBytes = 300;
std::string printable(std::string_view text, size_t max_bytes = kMaxShownBytes);

// Every message passes through printable() once more (with a larger bound), so no path, name or library message
// can put a raw control character or an unbounded string into an error, whichever way the Error was built.
class Error : public std::runtime_error {
 public:
  Error(Errc code, std::string_view message) : std::runtime_error(printable(message, kMaxMessageBytes)), code_(code) {}
  static constexpr size_t kMaxMessageBytes = 4096;
  Errc code() const { return code_; }

 private:
  Errc code_;
};

namespace detail {

// A string argument of fail() as it is shown: escaped and cut to kMaxShownBytes; other arguments as they are.
template <class T>
decltype(auto) shown(const T& arg) {
  if constexpr (std::is_convertible_v<const T&, std::string_view>)
    return printable(std::string_view(arg));
  else
    return (arg);
}

template <class... Shown>
std::string format_shown(fmt::string_view format, const Shown&... shown) {
  return fmt::vformat(format, fmt::make_format_args(shown...));
}

}  // namespace detail

// Formats and throws. Each string argument (names, paths, values read from files) goes through printable(), so
// one over-long name cannot crowd out the rest of the message.
template <class... Args>
[[noreturn]] void fail(Errc code, fmt::format_string<Args...> format, Args&&... args) {
  throw Error(code, detail::format_shown(static_cast<fmt::string_view>(format), detail::shown(args)...));
}

// Throws errno's message as an Errc::io error: "[op] path: No such file or directory".
[[noreturn]] void fail_errno(std::string_view op, std::string_view path);

}  // namespace lowbit
