// libFuzzer target: any byte string given to Manifest::parse as manifest.json text must be accepted or rejected
// with a lowbit::Error; anything else (another exception, a crash, a sanitizer report) is a finding. An accepted
// manifest must survive its own round trip: serialize() parses back to the same document.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "lowbit/artifact/manifest.h"
#include "lowbit/core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const auto manifest = lowbit::artifact::Manifest::parse(text, "fuzz/manifest.json");
    if (lowbit::artifact::Manifest::parse(manifest.serialize()).to_json() != manifest.to_json()) __builtin_trap();
  } catch (const lowbit::Error&) {
  }
  return 0;
}
