// The depth decoder's fixtures (tests/model/fixtures/depth/<variant>/, written by scripts/make_depth_fixtures.py on
// the seed's own code on MLX): the model and the inputs made here by the script's counter-based generator (the
// same bytes; nothing large is committed), and the bitwise comparison with the seed's outputs. Shared by the CPU
// test (depth_decoder_test.cpp) and the GPU one (tests/cuda/depth_cuda_test.cpp).
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <string>
#include <vector>

#include "lowbit/core/dtype.h"
#include "lowbit/core/sha256.h"
#include "lowbit/core/tensor.h"
#include "lowbit/io/json.h"
#include "lowbit/io/safetensors.h"
#include "lowbit/model/depth_decoder.h"
#include "model/counter_rng.h"

namespace lowbit::model::testing {

namespace fs = std::filesystem;
inline const fs::path kFixtures = fs::path(LOWBIT_SOURCE_DIR) / "tests/model/fixtures/depth";
inline constexpr int64_t kD = 128, kFfn = 256, kRank = 32, kHidden = 128;

// scripts/make_depth_fixtures.py's generator.
inline const CounterRng kRng(0x5EED0004);

struct Spec {
  std::string name;
  Shape shape;
  char kind;  // w, g (gain), b (bias)
  double amp;
};

inline std::vector<Spec> specs() {
  std::vector<Spec> s = {{"in_proj.weight", {kD, kHidden}, 'w', 0},
                         {"level_emb.weight", {32, kD}, 'w', 1},
                         {"code_lo.weight", {31 * 2048, kRank}, 'w', 1},
                         {"code_up.weight", {kD, kRank}, 'w', 0},
                         {"norm.weight", {kD}, 'g', 0},
                         {"norm.bias", {kD}, 'b', 0},
                         {"null_mem.weight", {1, kD}, 'w', 1},
                         {"audio_in.table", {65536, kHidden}, 'w', 1},
                         {"audio_in.norm.weight", {kHidden}, 'g', 0}};
  for (int g = 0; g < 11; ++g)
    for (int l = 0; l < 4; ++l) {
      const std::string p = fmt::format("groups.{}.{}.", g, l);
      s.push_back({p + "n1.weight", {kD}, 'g', 0});
      s.push_back({p + "n1.bias", {kD}, 'b', 0});
      s.push_back({p + "n2.weight", {kD}, 'g', 0});
      s.push_back({p + "n2.bias", {kD}, 'b', 0});
      s.push_back({p + "qkv.weight", {3 * kD, kD}, 'w', 0});
      s.push_back({p + "o.weight", {kD, kD}, 'w', 0});
      s.push_back({p + "f1.weight", {kFfn, kD}, 'w', 0});
      s.push_back({p + "f2.weight", {kD, kFfn}, 'w', 0});
    }
  for (int i = 0; i < 31; ++i)
    s.push_back({fmt::format("heads.{}.weight", i), {2048, kD}, 'w', 3 * std::sqrt(3.0 / kD)});
  for (int l = 0; l < 4; ++l) {
    s.push_back({fmt::format("cross.{}.kv.weight", l), {2 * kD, kD}, 'w', 0});
    s.push_back({fmt::format("cross.{}.o.weight", l), {kD, kD}, 'w', 0});
  }
  return s;
}

struct QuantRule {
  const char* pattern;
  int bits, group;
};
inline constexpr QuantRule kQuant[] = {{R"(in_proj\.weight)", 4, 64},
                                       {R"(code_lo\.weight)", 8, 32},
                                       {R"(code_up\.weight)", 4, 32},
                                       {R"(groups\.\d+\.\d+\.qkv\.weight)", 4, 64},
                                       {R"(groups\.\d+\.\d+\.o\.weight)", 5, 32},
                                       {R"(groups\.\d+\.\d+\.f1\.weight)", 3, 64},
                                       {R"(groups\.\d+\.\d+\.f2\.weight)", 4, 128},
                                       {R"(heads\.\d+\.weight)", 8, 64},
                                       {R"(cross\.\d+\.kv\.weight)", 6, 32},
                                       {R"(cross\.\d+\.o\.weight)", 2, 32},
                                       {R"(audio_in\.table)", 4, 64}};

inline TensorBuffer floats(DType dt, Shape shape, const std::function<float(uint64_t)>& value) {
  TensorBuffer b = make_buffer(dt, std::move(shape));
  const uint64_t n = b.bytes.size() / dtype_size(dt);
  for (uint64_t i = 0; i < n; ++i) store_float(dt, b.bytes.data(), i, value(i));
  return b;
}

inline void write_named(const fs::path& path, std::vector<std::pair<std::string, TensorBuffer>>& buffers) {
  std::vector<std::pair<std::string, TensorView>> views;
  views.reserve(buffers.size());
  for (auto& [name, b] : buffers) views.emplace_back(name, b.view());
  io::write_safetensors(path, views);
}

using Tensors = std::vector<std::pair<std::string, TensorBuffer>>;
using Edit = std::function<void(Tensors&, nlohmann::json&)>;

// The model directory of scripts/make_depth_fixtures.py's write_model; `edit` may spoil it before it is written.
inline void write_model(const fs::path& dir, bool quantized, DType dt, const Edit& edit = {}) {
  fs::create_directories(dir);
  std::vector<std::pair<std::string, TensorBuffer>> out;
  nlohmann::json recipe = nlohmann::json::object();
  for (const Spec& s : specs()) {
    const double amp = s.amp != 0 ? s.amp : std::sqrt(3.0 / static_cast<double>(s.shape.back()));
    const QuantRule* rule = nullptr;
    for (const auto& r : kQuant)
      if (quantized && std::regex_match(s.name, std::regex(r.pattern))) rule = &r;
    if (rule) {
      const int64_t rows = s.shape[0], cols = s.shape[1];
      const DType sdt = s.name.starts_with("audio_in.") ? DType::BF16 : dt;
      TensorBuffer q = make_buffer(DType::U32, {rows, cols * rule->bits / 32});
      for (int64_t i = 0; i < rows * cols * rule->bits / 32; ++i)
        q.as<uint32_t>()[i] = static_cast<uint32_t>(kRng.at(s.name + ".q", i) >> 32);
      const auto sc = static_cast<float>(2 * amp / ((1 << rule->bits) - 1));
      const auto neg = static_cast<float>(-amp);
      out.emplace_back(s.name + ".q", std::move(q));
      out.emplace_back(s.name + ".scales", floats(sdt, {rows, cols / rule->group}, [&](uint64_t i) {
                         return sc * (0.5f + kRng.unif(s.name + ".scales", i));
                       }));
      out.emplace_back(s.name + ".biases", floats(sdt, {rows, cols / rule->group}, [&](uint64_t i) {
                         return neg * (0.5f + kRng.unif(s.name + ".biases", i));
                       }));
      recipe[s.name] = {{"bits", rule->bits}, {"group_size", rule->group}, {"shape", s.shape}};
      continue;
    }
    const auto a = static_cast<float>(amp);
    out.emplace_back(s.name, floats(DType::BF16, s.shape, [&](uint64_t i) {
                       if (s.kind == 'g') return kRng.sym(s.name, i, 0.5f) + 1.0f;
                       if (s.kind == 'b') return kRng.sym(s.name, i, 0.2f);
                       return kRng.sym(s.name, i, a);
                     }));
  }
  if (edit) edit(out, recipe);
  write_named(dir / "depth.safetensors", out);
  if (!recipe.empty()) std::ofstream(dir / "quant.json") << nlohmann::json{{"tensors", recipe}}.dump();
}

inline Tensors make_inputs(const std::string& variant, int64_t frames, bool speaker, bool force) {
  const std::string p = variant + ".";
  Tensors in;
  in.emplace_back("h", floats(DType::BF16, {frames, kHidden}, [&](uint64_t i) { return kRng.sym(p + "h", i, 1.0f); }));
  TensorBuffer cb0 = make_buffer(DType::I32, {frames});
  for (int64_t i = 0; i < frames; ++i) cb0.as<int32_t>()[i] = static_cast<int32_t>(kRng.at(p + "cb0", i) % 2048);
  in.emplace_back("cb0", std::move(cb0));
  in.emplace_back("uniform",
                  floats(DType::F32, {frames, 31, 2048}, [&](uint64_t i) { return kRng.unif(p + "uniform", i); }));
  if (force) {
    TensorBuffer f = make_buffer(DType::I32, {frames, 32});
    for (int64_t i = 0; i < frames * 32; ++i) f.as<int32_t>()[i] = static_cast<int32_t>(kRng.at(p + "force", i) % 2048);
    in.emplace_back("force", std::move(f));
  }
  if (speaker)
    in.emplace_back("speaker", floats(DType::F32, {kD}, [&](uint64_t i) { return kRng.sym(p + "speaker", i, 1.0f); }));
  return in;
}

inline DType dtype_of(const std::string& name) {
  return name == "float16" ? DType::F16 : name == "bfloat16" ? DType::BF16 : DType::F32;
}

// Runs the fixture `variant` (its model and inputs written here) on the CPU or the GPU and checks codes,
// feedback and logits against the seed's bit for bit.
inline void expect_matches_fixture(const std::string& variant, bool cuda) {
  const fs::path fixture = kFixtures / variant;
  const auto info = io::read_json_file(fixture / "expected.json", "test", 1 << 20);
  const DType dt = dtype_of(info["dtype"].get<std::string>());
  const int64_t frames = info["frames"].get<int64_t>();
  ASSERT_GE(frames, 64);
  const fs::path dir =
      fs::temp_directory_path() / fmt::format("lowbit_depth_{}_{}_{}", variant, cuda ? "cuda" : "cpu", ::getpid());
  write_model(dir, info["quantized"].get<bool>(), dt);
  auto in = make_inputs(variant, frames, info["speaker"].get<bool>(), info["force"].get<bool>());
  write_named(dir / "in.safetensors", in);
  auto model = DepthDecoder::load(dir, {.dtype = dt, .cuda = cuda});
  run_depth_file(model, dir / "in.safetensors", dir / "out.safetensors", true);

  const auto expected = io::SafetensorsFile::open(fixture / "expected.safetensors");
  const auto got = io::SafetensorsFile::open(dir / "out.safetensors");
  const TensorView codes = got.tensor("codes"), want_codes = expected.tensor("codes");
  ASSERT_EQ(codes.shape, (Shape{frames, 32}));
  int differing = 0;
  std::vector<int32_t> a(static_cast<size_t>(frames * 32)), b(a.size());  // MLX's writer does not align
  std::memcpy(a.data(), codes.bytes.data(), a.size() * 4);
  std::memcpy(b.data(), want_codes.bytes.data(), b.size() * 4);
  for (size_t i = 0; i < a.size(); ++i) differing += a[i] != b[i];
  EXPECT_EQ(differing, 0) << "codes differing from the seed's";
  const TensorView fb = got.tensor("feedback"), want_fb = expected.tensor("feedback");
  ASSERT_EQ(fb.dtype, DType::BF16);
  EXPECT_TRUE(std::equal(fb.bytes.begin(), fb.bytes.end(), want_fb.bytes.begin(), want_fb.bytes.end()))
      << "feedback not bit-identical";
  const TensorView logits = got.tensor("logits");
  ASSERT_EQ(logits.dtype, dt);
  ASSERT_EQ(logits.shape, (Shape{frames, 31, 2048}));
  const size_t per_frame = logits.bytes.size() / static_cast<size_t>(frames);
  int identical = 0;
  for (int64_t t = 0; t < frames; ++t)
    identical += sha256_hex(logits.bytes.subspan(static_cast<size_t>(t) * per_frame, per_frame)) ==
                 info["logits_sha256"][static_cast<size_t>(t)].get<std::string>();
  EXPECT_EQ(identical, frames) << "frames whose logits are bit-identical to the seed's";
  const TensorView l0 = expected.tensor("logits0");
  EXPECT_TRUE(std::equal(l0.bytes.begin(), l0.bytes.end(), logits.bytes.begin())) << "frame 0's logits";
  fs::remove_all(dir);
}

}  // namespace lowbit::model::testing
