// libFuzzer target: config.json of a Hugging Face checkpoint, through the strict JSON reader and the config parser.
#include "fuzz/fuzz_input.h"
#include "lowbit/io/json.h"
#include "lowbit/model/family.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lowbit;
  return fuzz::refuse_or_accept(
      [&] { model::parse_hf_config(io::parse_json(fuzz::as_text(data, size), "fuzz", "config.json"), "config.json"); });
}
