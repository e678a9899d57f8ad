// libFuzzer target: a GGUF file as load_model and load_tokenizer read it: the header and metadata, every tensor
// dequantized and re-expressed in its packed codec (validated as the loader does), the model config and the
// embedded tokenizer.
#include <optional>

#include "fuzz/fuzz_input.h"
#include "lowbit/codec/codec.h"
#include "lowbit/io/gguf.h"
#include "lowbit/model/family.h"
#include "lowbit/model/gguf_model.h"
#include "lowbit/model/gguf_tensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lowbit;
  const auto file = [&] {
    try {
      return std::optional(io::GgufFile::from_bytes(std::as_bytes(std::span(data, size)), "fuzz.gguf"));
    } catch (const Error&) {
      return std::optional<io::GgufFile>();
    }
  }();
  if (!file) return 0;
  fuzz::refuse_or_accept([&] {
    for (const auto& t : file->header().tensors)
      if (t.bytes <= (1u << 20)) file->dequantize(t);
  });
  for (const auto& t : file->header().tensors)
    if (t.bytes <= (1u << 20))
      fuzz::refuse_or_accept([&] {
        if (auto packed = model::gguf_packed_tensor(*file, t))
          codec::validate_tensor({packed->codec, packed->tensor.params, t.shape(), packed->tensor.views()}, t.name);
      });
  fuzz::refuse_or_accept([&] { model::parse_gguf_config(*file); });
  fuzz::refuse_or_accept([&] { fuzz::exercise(*model::gguf_tokenizer(*file)); });
  return 0;
}
