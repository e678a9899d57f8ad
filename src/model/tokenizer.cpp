#include "lowbit/model/tokenizer.h"

#include <algorithm>

namespace lowbit::model {

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  const std::optional<int32_t> bos = bos_id();
  const std::vector<int32_t> eos = eos_ids();
  std::string out;
  int32_t prev = -1;
  for (int32_t id : ids) {
    if (id != bos && std::find(eos.begin(), eos.end(), id) == eos.end()) out += token_text_after(prev, id);
    prev = id;
  }
  return out;
}

}  // namespace lowbit::model
