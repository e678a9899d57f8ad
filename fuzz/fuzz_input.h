// Shared by the fuzz targets for file readers. Readers take paths, so the input is written to a file in a
// per-process directory; the rule every target enforces is that bad input ends in a lowbit::Error, so any other
// exception escapes LLVMFuzzerTestOneInput and libFuzzer reports it, as it does a crash or a sanitizer error.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "lowbit/core/error.h"
#include "lowbit/model/tokenizer.h"

namespace lowbit::fuzz {

inline const std::filesystem::path& work_dir() {
  static const std::filesystem::path dir = [] {
    auto p = std::filesystem::temp_directory_path() / ("lowbit-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(p);
    return p;
  }();
  return dir;
}

// Writes `bytes` to work_dir()/relative (parents created) and returns the path.
inline std::filesystem::path write_file(const std::string& relative, std::string_view bytes) {
  const auto path = work_dir() / relative;
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
}

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// Runs `read`; a lowbit::Error is the expected way to refuse input.
template <class Read>
int refuse_or_accept(Read&& read) {
  try {
    read();
  } catch (const Error&) {
  }
  return 0;
}

// Exercises an accepted tokenizer the way generation does: encode text, then turn every id back into text.
inline void exercise(const model::Tokenizer& tok) {
  for (const char* text : {"Hello, world! AB \xEF\xBC\xA1 123\n<s> </s> \xF0\x9F\xA6\x99", ""}) {
    int32_t prev = -1;
    for (const int32_t id : tok.encode(text, true, true)) {
      if (id < 0 || id >= tok.vocab_size()) __builtin_trap();  // encode produced an id outside the vocabulary
      tok.token_text_after(prev, id);
      prev = id;
    }
  }
}

}  // namespace lowbit::fuzz
