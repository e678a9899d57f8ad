// libFuzzer target: a SentencePiece tokenizer.model through lowbit's checks and then libsentencepiece (which
// trusts its tables: whatever lowbit lets through must not crash it), then encoding and decoding text.
#include "fuzz/fuzz_input.h"
#include "lowbit/model/tokenizers.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lowbit;
  const auto path = fuzz::write_file("tokenizer.model", fuzz::as_text(data, size));
  return fuzz::refuse_or_accept([&] { fuzz::exercise(*model::load_sentencepiece(path)); });
}
