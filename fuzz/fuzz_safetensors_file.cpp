// libFuzzer target: a whole safetensors file through SafetensorsFile::open (the type check, the mapping, the
// header) and every tensor view it hands out, which must lie inside the file.
#include "fuzz/fuzz_input.h"
#include "lowbit/io/safetensors.h"

// Reads of each view's last byte land here, so that ASan sees them (a view past the mapping is a finding).
volatile std::byte g_last_byte{};

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lowbit;
  const auto path = fuzz::write_file("model.safetensors", fuzz::as_text(data, size));
  return fuzz::refuse_or_accept([&] {
    const auto file = io::SafetensorsFile::open(path);
    uint64_t total = 0;
    for (const auto& name : file.names()) {
      const TensorView view = file.tensor(name);
      total += view.bytes.size();
      if (!view.bytes.empty()) g_last_byte = view.bytes.back();
    }
    if (total > size) __builtin_trap();
  });
}
