// Tokenizer files for an artifact whose source carries its tokenizer inside itself (GGUF): what `lowbit quantize`
// stores in OUT so that the runtime reads the tokenizer back from the artifact without --tokenizer.
#pragma once

#include <string>
#include <vector>

#include "lowbit/io/gguf.h"

namespace lowbit::model {

struct TokenizerFile {
  std::string name;
  std::string contents;
};

// For a GGUF source with an embedded tokenizer: "tokenizer.gguf", a GGUF (version 3, no tensors) holding the
// source's "tokenizer.*" metadata unchanged, which load_tokenizer reads as it reads the source; and, when the source
// has a chat template, "tokenizer_config.json" with it ({"chat_template": ...}), where chat looks for it beside an
// artifact. Empty when the file has no tokenizer metadata.
std::vector<TokenizerFile> gguf_tokenizer_files(const io::GgufFile& file);

}  // namespace lowbit::model
