// libFuzzer target: a llama2.c tokenizer.bin through load_llama2c_tokenizer, then encoding and decoding text.
#include "fuzz/fuzz_input.h"
#include "lowbit/model/llama2c.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lowbit;
  const auto path = fuzz::write_file("tokenizer.bin", fuzz::as_text(data, size));
  return fuzz::refuse_or_accept([&] { fuzz::exercise(*model::load_llama2c_tokenizer(path)); });
}
