// Whole text files that may come gzip-compressed, such as the Debian packages' documentation
// (/usr/share/debian-reference/debian-reference.en.txt.gz, lowbit quantize's default calibration text). A file is
// taken as gzip by its magic bytes, not its name; concatenated gzip members are read one after another, as gzip -d
// does. Reading is bounded: a small compressed file can expand a thousandfold, so the decompressed size is checked
// as it grows, never trusted from the gzip trailer.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace lowbit::io {

// The file's text, decompressed when it is gzip. Errors are one line, "[op] path: ...": Errc::io when the file
// cannot be read, Errc::limit beyond `max_bytes` of text, Errc::format on corrupt gzip data (zlib's reason
// appended), Errc::truncated when the gzip data ends early.
std::string read_text_file(const std::filesystem::path& path, std::string_view op, uint64_t max_bytes);

}  // namespace lowbit::io
