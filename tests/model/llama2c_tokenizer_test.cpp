// The llama2.c tokenizer against a direct transcription of run.c's encode() (rescan every pair per merge).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "lowbit/model/llama2c.h"

namespace lowbit::model {
namespace {

namespace fs = std::filesystem;
const fs::path kTok = fs::path(LOWBIT_SHARED_DIR) / "models" / "stories260K" / "tok512.bin";

struct Vocab {
  std::vector<std::string> pieces;
  std::vector<float> scores;
  std::map<std::string, int> ids;
};

Vocab read_vocab() {
  std::ifstream in(kTok, std::ios::binary);
  Vocab v;
  int32_t max_len, len;
  float score;
  in.read(reinterpret_cast<char*>(&max_len), 4);
  while (in.read(reinterpret_cast<char*>(&score), 4) && in.read(reinterpret_cast<char*>(&len), 4)) {
    std::string s(static_cast<size_t>(len), '\0');
    in.read(s.data(), len);
    v.ids.emplace(s, static_cast<int>(v.pieces.size()));
    v.pieces.push_back(s);
    v.scores.push_back(score);
  }
  return v;
}

int lookup(const Vocab& v, const std::string& s) {
  const auto it = v.ids.find(s);
  return it == v.ids.end() ? -1 : it->second;
}

std::vector<int32_t> run_c_encode(const Vocab& v, const std::string& text) {
  std::vector<int32_t> t{1};
  if (!text.empty()) t.push_back(lookup(v, " "));
  std::string buf;
  for (size_t i = 0; i < text.size(); ++i) {
    if ((text[i] & 0xC0) != 0x80) buf.clear();
    buf += text[i];
    if (i + 1 < text.size() && (text[i + 1] & 0xC0) == 0x80 && buf.size() < 4) continue;
    if (const int id = lookup(v, buf); id != -1) {
      t.push_back(id);
    } else {
      for (unsigned char b : buf) t.push_back(b + 3);
    }
    buf.clear();
  }
  for (;;) {
    float best = -1e10f;
    int best_id = -1;
    size_t best_idx = 0;
    for (size_t i = 0; i + 1 < t.size(); ++i) {
      const int id = lookup(v, v.pieces[t[i]] + v.pieces[t[i + 1]]);
      if (id != -1 && v.scores[id] > best) {
        best = v.scores[id];
        best_id = id;
        best_idx = i;
      }
    }
    if (best_id == -1) break;
    t[best_idx] = best_id;
    t.erase(t.begin() + static_cast<std::ptrdiff_t>(best_idx) + 1);
  }
  return t;
}

TEST(Llama2cTokenizer, EncodesAsRunC) {
  if (!fs::exists(kTok)) GTEST_SKIP() << "../shared/models/stories260K is absent";
  const Vocab v = read_vocab();
  const auto tok = load_llama2c_tokenizer(kTok);
  std::ifstream story(fs::path(LOWBIT_SHARED_DIR) / "data" / "tinystories-valid-excerpt.txt");
  std::string excerpt(1500, '\0');
  story.read(excerpt.data(), static_cast<std::streamsize>(excerpt.size()));
  excerpt.resize(static_cast<size_t>(story.gcount()));
  for (const std::string& text : {std::string("Hello world"), std::string("  two  spaces\n\nand tabs\t!"),
                                  std::string("caf\xc3\xa9 \xf0\x9f\x98\x80 \xe4\xb8\xad\xe6\x96\x87 1234567"),
                                  std::string("aaaaaaaaaaaaaaaa"), std::string("\xff\xfe bad utf-8"), excerpt})
    EXPECT_EQ(tok->encode(text, true), run_c_encode(v, text)) << text.substr(0, 40);
}

}  // namespace
}  // namespace lowbit::model
