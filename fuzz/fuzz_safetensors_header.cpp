// libFuzzer target: any byte string given to parse_safetensors_header must be rejected with a lowbit::Error or
// parsed; anything else (another exception, a crash, a sanitizer report, a read outside the input) is a finding.
#include <cstddef>
#include <cstdint>
#include <span>

#include "lowbit/core/error.h"
#include "lowbit/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto header = lowbit::io::parse_safetensors_header(
        std::span(reinterpret_cast<const std::byte*>(data), size), "fuzz.safetensors");
    // An accepted header must describe exactly the input: its entries tile the data section.
    uint64_t covered = 0;
    for (const auto& e : header.entries) {
      if (e.begin != covered || e.end < e.begin) __builtin_trap();
      covered = e.end;
    }
    if (header.data_start + covered != size) __builtin_trap();
  } catch (const lowbit::Error&) {
  }
  return 0;
}
