// libFuzzer target: an audio8 bundle's manifest.json through audio8::open, beside a fixed 4 KiB weights.bin.
#include "fuzz/fuzz_input.h"
#include "lowbit/artifact/audio8_bundle.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lowbit;
  static const auto dir = [] {
    fuzz::write_file("audio8/weights.bin", std::string(4096, '\x01'));
    return fuzz::work_dir() / "audio8";
  }();
  fuzz::write_file("audio8/manifest.json", fuzz::as_text(data, size));
  return fuzz::refuse_or_accept([&] { artifact::audio8::open(dir, {.verify_hash = false}); });
}
