// libFuzzer target: a llama2.c checkpoint (.bin) through load_llama2c.
#include "fuzz/fuzz_input.h"
#include "lowbit/model/llama2c.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lowbit;
  const auto path = fuzz::write_file("model.bin", fuzz::as_text(data, size));
  return fuzz::refuse_or_accept([&] { model::load_llama2c(path); });
}
