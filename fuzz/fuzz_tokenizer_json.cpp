// libFuzzer target: a tokenizer.json through load_hf_tokenizer, then encoding and decoding text with it.
#include "fuzz/fuzz_input.h"
#include "lowbit/model/tokenizers.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lowbit;
  const auto path = fuzz::write_file("hf/tokenizer.json", fuzz::as_text(data, size));
  return fuzz::refuse_or_accept([&] { fuzz::exercise(*model::load_hf_tokenizer(path)); });
}
