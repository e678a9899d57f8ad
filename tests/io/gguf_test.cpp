// GGUF: tiny files built in memory. Every block type dequantizes to the values its block definition gives,
// computed here element by element (not in the reader's loop order); corrupt files are rejected with the
// right error code and never read out of bounds.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <optional>
#include <random>

#include "lowbit/core/dtype.h"
#include "lowbit/core/error.h"
#include "io/gguf_builder.h"
#include "lowbit/io/gguf.h"

namespace lowbit::io {
namespace {

std::span<const std::byte> as_bytes(const std::vector<uint8_t>& v) { return std::as_bytes(std::span(v)); }

Errc rejection(const std::vector<uint8_t>& image) {
  try {
    parse_gguf(as_bytes(image), "test.gguf");
  } catch (const Error& e) {
    return e.code();
  }
  return Errc::internal;  // accepted
}

// Random block bytes with the f16 fields at `half_offsets` set to the given values (so no NaN/Inf).
std::vector<uint8_t> random_blocks(size_t n_blocks, size_t block_bytes, std::vector<std::pair<size_t, float>> halves,
                                   uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> out(n_blocks * block_bytes);
  for (auto& b : out) b = static_cast<uint8_t>(rng());
  for (size_t blk = 0; blk < n_blocks; ++blk)
    for (auto [offset, value] : halves) {
      const uint16_t h = f32_to_f16(value * static_cast<float>(blk + 1));
      std::memcpy(&out[blk * block_bytes + offset], &h, 2);
    }
  return out;
}

float half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// Element e of one block, straight from each format's definition.
using Expected = float (*)(const uint8_t* b, int e);

float q4_0(const uint8_t* b, int e) {
  const uint8_t byte = b[2 + e % 16];
  const int q = e < 16 ? byte & 15 : byte >> 4;
  return static_cast<float>(q - 8) * half(b);
}
float q4_1(const uint8_t* b, int e) {
  const uint8_t byte = b[4 + e % 16];
  const int q = e < 16 ? byte & 15 : byte >> 4;
  return static_cast<float>(q) * half(b) + half(b + 2);
}
int q5_value(const uint8_t* qh, const uint8_t* qs, int e) {
  uint32_t bits;
  std::memcpy(&bits, qh, 4);
  const int low = e < 16 ? qs[e % 16] & 15 : qs[e % 16] >> 4;
  return low | static_cast<int>(((bits >> e) & 1) << 4);
}
float q5_0(const uint8_t* b, int e) { return static_cast<float>(q5_value(b + 2, b + 6, e) - 16) * half(b); }
float q5_1(const uint8_t* b, int e) { return static_cast<float>(q5_value(b + 4, b + 8, e)) * half(b) + half(b + 2); }
float q8_0(const uint8_t* b, int e) { return static_cast<float>(static_cast<int8_t>(b[2 + e])) * half(b); }

// K-quants: 256 elements in 128-element halves n; within a half, 32-element groups g, each in two runs of 16.
float q2_k(const uint8_t* b, int e) {
  const int n = e / 128, g = (e % 128) / 32, l = e % 32;
  const int q = (b[16 + 32 * n + l] >> (2 * g)) & 3;
  const uint8_t sc = b[e / 16];
  return half(b + 80) * static_cast<float>(sc & 15) * static_cast<float>(q) - half(b + 82) * static_cast<float>(sc >> 4);
}
float q3_k(const uint8_t* b, int e) {
  const int n = e / 128, g = (e % 128) / 32, l = e % 32;
  const int low2 = (b[32 + 32 * n + l] >> (2 * g)) & 3;
  const bool high = (b[l] >> (4 * n + g)) & 1;
  // 16 six-bit scales: bits 0-3 are nibbles of bytes 0..7 (low nibbles first), bits 4-5 are the 2-bit fields
  // of bytes 8..11, field k of byte 8 + s % 4 for scale s = 4k + s % 4.
  const uint8_t* packed = b + 96;
  const int s = e / 16;
  const int nibble = s < 8 ? packed[s] & 15 : packed[s - 8] >> 4;
  const int top = (packed[8 + s % 4] >> (2 * (s / 4))) & 3;
  const int scale = (nibble | top << 4) - 32;
  return half(b + 108) * static_cast<float>(scale) * static_cast<float>(low2 - (high ? 0 : 4));
}
// Q4_K / Q5_K scales: sub-blocks 0..3 keep 6 bits in bytes 0..3 (scale) and 4..7 (min); sub-blocks 4..7 take
// their low 4 bits from the nibbles of bytes 8..11 and their top 2 bits from the top bits of bytes 0..7.
std::pair<int, int> k4_scale_min(const uint8_t* s, int j) {
  if (j < 4) return {s[j] & 63, s[j + 4] & 63};
  return {(s[j + 4] & 15) | (s[j - 4] >> 6) << 4, (s[j + 4] >> 4) | (s[j] >> 6) << 4};
}
float q4_k(const uint8_t* b, int e) {
  const int sub = e / 32, l = e % 32;
  const uint8_t byte = b[16 + 32 * (sub / 2) + l];
  const int q = sub % 2 ? byte >> 4 : byte & 15;
  const auto [sc, m] = k4_scale_min(b + 4, sub);
  return half(b) * static_cast<float>(sc) * static_cast<float>(q) - half(b + 2) * static_cast<float>(m);
}
float q5_k(const uint8_t* b, int e) {
  const int sub = e / 32, l = e % 32;
  const uint8_t byte = b[48 + 32 * (sub / 2) + l];
  const int q = (sub % 2 ? byte >> 4 : byte & 15) + (((b[16 + l] >> sub) & 1) ? 16 : 0);
  const auto [sc, m] = k4_scale_min(b + 4, sub);
  return half(b) * static_cast<float>(sc) * static_cast<float>(q) - half(b + 2) * static_cast<float>(m);
}
float q6_k(const uint8_t* b, int e) {
  const int n = e / 128, quarter = (e % 128) / 32, l = e % 32;
  const uint8_t low_byte = b[64 * n + l + (quarter % 2) * 32];
  const int low = quarter < 2 ? low_byte & 15 : low_byte >> 4;
  const int high = (b[128 + 32 * n + l] >> (2 * quarter)) & 3;
  const auto scale = static_cast<int8_t>(b[192 + 8 * n + l / 16 + 2 * quarter]);
  return half(b + 208) * static_cast<float>(scale) * static_cast<float>((low | high << 4) - 32);
}

struct BlockCase {
  GgmlType type;
  std::vector<std::pair<size_t, float>> halves;  // f16 field offsets and base values
  Expected expected;
};

TEST(Gguf, EveryBlockTypeDequantizesByItsDefinition) {
  const std::vector<BlockCase> cases = {
      {GgmlType::Q4_0, {{0, 0.25f}}, q4_0},
      {GgmlType::Q4_1, {{0, 0.125f}, {2, -1.5f}}, q4_1},
      {GgmlType::Q5_0, {{0, 0.0625f}}, q5_0},
      {GgmlType::Q5_1, {{0, 0.03125f}, {2, 0.75f}}, q5_1},
      {GgmlType::Q8_0, {{0, 0.01f}}, q8_0},
      {GgmlType::Q2_K, {{80, 0.02f}, {82, 0.01f}}, q2_k},
      {GgmlType::Q3_K, {{108, 0.003f}}, q3_k},
      {GgmlType::Q4_K, {{0, 0.004f}, {2, 0.002f}}, q4_k},
      {GgmlType::Q5_K, {{0, 0.0015f}, {2, 0.001f}}, q5_k},
      {GgmlType::Q6_K, {{208, 0.0007f}}, q6_k},
  };
  for (const auto& c : cases) {
    const GgmlTypeInfo* info = ggml_type_info(static_cast<uint32_t>(c.type));
    ASSERT_NE(info, nullptr);
    const size_t n_blocks = 4;
    const auto data = random_blocks(n_blocks, info->block_bytes, c.halves, static_cast<uint32_t>(c.type) + 7);
    GgufBuilder g;
    g.tensor("w", {2ull * info->block_elems, 2}, c.type, data);  // two rows of two blocks
    const auto image = g.build();
    auto file = GgufFile::from_bytes(as_bytes(image), "test.gguf");
    const auto* t = file.tensor("w");
    ASSERT_NE(t, nullptr);
    const auto values = file.dequantize(*t);
    ASSERT_EQ(values.size(), n_blocks * info->block_elems);
    for (size_t blk = 0; blk < n_blocks; ++blk)
      for (uint32_t e = 0; e < info->block_elems; ++e)
        ASSERT_EQ(values[blk * info->block_elems + e], c.expected(&data[blk * info->block_bytes], static_cast<int>(e)))
            << info->name << " block " << blk << " element " << e;
  }
}

TEST(Gguf, Q4_0KnownValues) {
  std::vector<uint8_t> block(18);
  const uint16_t d = f32_to_f16(0.5f);
  std::memcpy(block.data(), &d, 2);
  for (int j = 0; j < 16; ++j) block[2 + j] = static_cast<uint8_t>(j | (15 - j) << 4);
  std::vector<float> out(32);
  dequantize_ggml(GgmlType::Q4_0, std::as_bytes(std::span(block)), out);
  EXPECT_EQ(out[0], -4.0f);   // (0 - 8) * 0.5
  EXPECT_EQ(out[15], 3.5f);   // (15 - 8) * 0.5
  EXPECT_EQ(out[16], 3.5f);   // high nibble of byte 0 is 15
  EXPECT_EQ(out[31], -4.0f);
}

// IQ4_NL and IQ4_XS against gguf-py's dequantize (gguf/quants.py, an independent numpy implementation, of the
// llama-cpp-python 0.3.36 sdist): blocks of bytes (i * m + a) & 0xff with d set, the values it gave.
TEST(Gguf, Iq4KnownValuesFromGgufPy) {
  const auto block = [](size_t bytes, int m, int a, float d) {
    std::vector<uint8_t> b(bytes);
    for (size_t i = 0; i < bytes; ++i) b[i] = static_cast<uint8_t>((i * m + a) & 0xff);
    const uint16_t h = f32_to_f16(d);
    std::memcpy(b.data(), &h, 2);
    return b;
  };
  const auto sum = [](const std::vector<float>& v) {
    double s = 0;
    for (float x : v) s += x;
    return s;
  };
  const auto nl = block(18, 53, 7, -0.25f);
  std::vector<float> out(32);
  dequantize_ggml(GgmlType::IQ4_NL, std::as_bytes(std::span(nl)), out);
  EXPECT_EQ(out[0], 26.0f);
  EXPECT_EQ(out[1], 5.5f);
  EXPECT_EQ(out[16], 2.5f);
  EXPECT_EQ(out[31], -0.25f);
  EXPECT_EQ(sum(out), 50.25);

  const auto xs = block(136, 37, 11, 0.5f);
  out.resize(256);
  dequantize_ggml(GgmlType::IQ4_XS, std::as_bytes(std::span(xs)), out);
  const std::pair<int, float> spots[] = {{0, 32.5f},   {1, -0.5f},   {17, 17.5f},  {31, 17.5f},
                                         {32, 227.5f}, {100, 20.0f}, {200, 570.0f}, {255, -8.0f}};
  for (const auto& [i, v] : spots) EXPECT_EQ(out[i], v) << i;
  EXPECT_EQ(sum(out), -5502.5);
}

// The grid types IQ2_XXS .. IQ1_M against gguf-py's dequantize the same way (blocks of bytes (i * m + a) & 0xff,
// d set where the type has a plain f16 d; IQ1_M spreads its d over the scales' top nibbles). The values were
// printed by quants.dequantize of the llama-cpp-python 0.3.36 sdist's gguf-py.
TEST(Gguf, IqGridTypesKnownValuesFromGgufPy) {
  struct Case {
    GgmlType type;
    int m, a;
    std::optional<float> d;
    std::array<float, 8> spots;  // elements 0, 1, 9, 31, 32, 100, 200, 255
    double sum;
  };
  const Case cases[] = {
      {GgmlType::IQ2_XXS,
       37,
       11,
       0.5f,
       {-29.5625f, 29.5625f, 5.5f, 17.1875f, -26.5625f, 13.5f, -4.5f, -40.3125f},
       381.875},
      {GgmlType::IQ2_XS,
       53,
       7,
       -0.25f,
       {0.75f, 0.75f, -2.34375f, -5.75f, 10.15625f, -1.34375f, -24.21875f, 1.25f},
       -250.0},
      {GgmlType::IQ2_S,
       29,
       3,
       0.125f,
       {-1.375f, 4.296875f, -1.375f, 1.625f, -0.625f, -16.796875f, 2.734375f, 0.875f},
       23.28125},
      {GgmlType::IQ3_XXS, 41, 5, 0.75f, {-6.75f, -2.25f, 6.75f, 11.25f, -86.25f, 255.75f, 21.75f, -63.75f}, 769.5},
      {GgmlType::IQ3_S, 23, 9, -0.5f, {15.5f, 170.5f, 15.5f, 201.5f, 127.5f, -10.5f, -13.5f, -202.5f}, 451.0},
      {GgmlType::IQ1_S,
       59,
       13,
       0.25f,
       {-0.65625f, 0.84375f, 0.09375f, 0.84375f, -0.09375f, 0.21875f, -0.40625f, 0.34375f},
       -60.75},
      {GgmlType::IQ1_M,
       31,
       17,
       std::nullopt,
       {-0.16845703125f, -0.16845703125f, 0.16845703125f, 3.53759765625f, 3.53759765625f, 0.05615234375f,
        -3.53759765625f, 0.61767578125f},
       83.10546875},
  };
  for (const Case& c : cases) {
    const GgmlTypeInfo* info = ggml_type_info(static_cast<uint32_t>(c.type));
    ASSERT_NE(info, nullptr);
    ASSERT_EQ(info->block_elems, 256u) << info->name;
    std::vector<uint8_t> block(info->block_bytes);
    for (size_t i = 0; i < block.size(); ++i) block[i] = static_cast<uint8_t>((i * c.m + c.a) & 0xff);
    if (c.d) {
      const uint16_t h = f32_to_f16(*c.d);
      std::memcpy(block.data(), &h, 2);
    }
    std::vector<float> out(256);
    dequantize_ggml(c.type, std::as_bytes(std::span(block)), out);
    const int at[] = {0, 1, 9, 31, 32, 100, 200, 255};
    for (size_t k = 0; k < 8; ++k) EXPECT_EQ(out[at[k]], c.spots[k]) << info->name << " element " << at[k];
    double sum = 0;
    for (float x : out) sum += x;
    EXPECT_EQ(sum, c.sum) << info->name;
    // One byte short or long is refused before any read.
    block.push_back(0);
    EXPECT_THROW(dequantize_ggml(c.type, std::as_bytes(std::span(block)), out), Error) << info->name;
    block.resize(block.size() - 2);
    EXPECT_THROW(dequantize_ggml(c.type, std::as_bytes(std::span(block)), out), Error) << info->name;
  }
}

TEST(Gguf, FloatTensorsAndMatrixShape) {
  std::vector<uint8_t> f32(6 * 4), f16(6 * 2), bf16(6 * 2);
  for (int i = 0; i < 6; ++i) {
    const float v = static_cast<float>(i) - 2.5f;
    std::memcpy(&f32[4 * i], &v, 4);
    const uint16_t h = f32_to_f16(v), b = f32_to_bf16(v);
    std::memcpy(&f16[2 * i], &h, 2);
    std::memcpy(&bf16[2 * i], &b, 2);
  }
  GgufBuilder g;
  g.tensor("a", {3, 2}, GgmlType::F32, f32);
  g.tensor("b", {3, 2}, GgmlType::F16, f16);
  g.tensor("c", {3, 2}, GgmlType::BF16, bf16);
  const auto image = g.build();
  auto file = GgufFile::from_bytes(as_bytes(image), "test.gguf");
  for (const char* name : {"a", "b", "c"}) {
    const auto* t = file.tensor(name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->shape(), (Shape{2, 3})) << name;
    const auto v = file.dequantize(*t);
    for (int i = 0; i < 6; ++i) EXPECT_EQ(v[i], static_cast<float>(i) - 2.5f) << name;
  }
}

TEST(Gguf, MetadataOfEveryType) {
  for (uint32_t version : {2u, 3u}) {
    GgufBuilder g(version);
    g.kv_scalar<uint8_t>("u8", GgufValueType::u8, 200);
    g.kv_scalar<int8_t>("i8", GgufValueType::i8, -5);
    g.kv_scalar<uint16_t>("u16", GgufValueType::u16, 60000);
    g.kv_scalar<int16_t>("i16", GgufValueType::i16, -300);
    g.kv_scalar<uint32_t>("u32", GgufValueType::u32, 4000000000u);
    g.kv_scalar<int32_t>("i32", GgufValueType::i32, -7);
    g.kv_scalar<float>("f32", GgufValueType::f32, 1e-5f);
    g.kv_scalar<uint8_t>("bool", GgufValueType::boolean, 1);
    g.kv_scalar<uint64_t>("u64", GgufValueType::u64, 1ull << 40);
    g.kv_scalar<int64_t>("i64", GgufValueType::i64, -(1ll << 40));
    g.kv_scalar<double>("f64", GgufValueType::f64, 0.25);
    g.kv_string("general.architecture", "llama");
    g.kv_strings("tokens", {"<s>", "a", ""});
    std::vector<uint8_t> floats;
    GgufBuilder::put<uint32_t>(floats, static_cast<uint32_t>(GgufValueType::f32));
    GgufBuilder::put<uint64_t>(floats, 2);
    GgufBuilder::put<float>(floats, -1.0f);
    GgufBuilder::put<float>(floats, 0.5f);
    g.kv("scores", GgufValueType::array, floats);
    g.kv_scalar<uint32_t>("general.alignment", GgufValueType::u32, 64);
    g.alignment = 64;
    g.tensor("t", {32}, GgmlType::F32, std::vector<uint8_t>(128, 0));
    const auto image = g.build();
    auto f = GgufFile::from_bytes(as_bytes(image), "test.gguf");
    EXPECT_EQ(f.header().version, version);
    EXPECT_EQ(f.header().alignment, 64u);
    EXPECT_EQ(f.header().data_start % 64, 0u);
    EXPECT_EQ(f.get_uint("u8"), 200u);
    EXPECT_EQ(f.get_float("i8"), -5.0);
    EXPECT_EQ(f.get_uint("u16"), 60000u);
    EXPECT_EQ(f.get_float("i16"), -300.0);
    EXPECT_EQ(f.get_uint("u32"), 4000000000u);
    EXPECT_EQ(f.get_float("f32"), static_cast<double>(1e-5f));
    EXPECT_EQ(f.get_bool("bool"), true);
    EXPECT_EQ(f.get_uint("u64"), 1ull << 40);
    EXPECT_EQ(f.get_float("i64"), -static_cast<double>(1ll << 40));
    EXPECT_EQ(f.get_float("f64"), 0.25);
    EXPECT_EQ(f.get_string("general.architecture"), "llama");
    EXPECT_EQ(f.get_strings("tokens"), (std::vector<std::string>{"<s>", "a", ""}));
    EXPECT_EQ(f.get_floats("scores"), (std::vector<double>{-1.0, 0.5}));
    EXPECT_FALSE(f.get_string("absent").has_value());
    EXPECT_THROW(f.get_string("u8"), Error);
    EXPECT_THROW(f.get_uint("i8"), Error);
  }
}

GgufBuilder valid_builder() {
  GgufBuilder g;
  g.kv_string("general.architecture", "llama");
  g.tensor("a", {32}, GgmlType::Q8_0, std::vector<uint8_t>(34, 1));
  g.tensor("b", {4}, GgmlType::F32, std::vector<uint8_t>(16, 0));
  return g;
}

TEST(Gguf, EveryTruncationIsRejected) {
  const auto image = valid_builder().build();
  ASSERT_NO_THROW(parse_gguf(as_bytes(image), "test.gguf"));
  for (size_t n = 0; n < image.size(); ++n) {
    const std::vector<uint8_t> cut(image.begin(), image.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_NE(rejection(cut), Errc::internal) << "prefix of " << n << " bytes accepted";
  }
}

TEST(Gguf, CorruptHeadersAreRejected) {
  auto image = valid_builder().build();
  auto bad = image;
  bad[0] = 'X';
  EXPECT_EQ(rejection(bad), Errc::format);
  for (uint32_t version : {1u, 4u}) {
    bad = image;
    std::memcpy(&bad[4], &version, 4);
    EXPECT_EQ(rejection(bad), Errc::version);
  }
  bad = image;
  const uint64_t many = 1ull << 40;
  std::memcpy(&bad[8], &many, 8);  // tensor count
  EXPECT_EQ(rejection(bad), Errc::limit);
  bad = image;
  std::memcpy(&bad[16], &many, 8);  // key count
  EXPECT_EQ(rejection(bad), Errc::limit);
  bad = image;
  const uint64_t huge_string = 1ull << 62;
  std::memcpy(&bad[24], &huge_string, 8);  // first key's length
  EXPECT_EQ(rejection(bad), Errc::limit);
}

TEST(Gguf, BadMetadataIsRejected) {
  GgufBuilder dup;
  dup.kv_string("k", "a");
  dup.kv_string("k", "b");
  EXPECT_EQ(rejection(dup.build()), Errc::duplicate);

  GgufBuilder type;
  type.kv("k", static_cast<GgufValueType>(13), {});
  EXPECT_EQ(rejection(type.build()), Errc::format);

  GgufBuilder nested;
  std::vector<uint8_t> v;
  GgufBuilder::put<uint32_t>(v, static_cast<uint32_t>(GgufValueType::array));
  GgufBuilder::put<uint64_t>(v, 1);
  nested.kv("k", GgufValueType::array, v);
  EXPECT_EQ(rejection(nested.build()), Errc::unsupported);

  GgufBuilder long_array;
  v.clear();
  GgufBuilder::put<uint32_t>(v, static_cast<uint32_t>(GgufValueType::u32));
  GgufBuilder::put<uint64_t>(v, 1000000);  // far more than the file holds
  long_array.kv("k", GgufValueType::array, v);
  EXPECT_EQ(rejection(long_array.build()), Errc::truncated);

  GgufBuilder boolean;
  boolean.kv_scalar<uint8_t>("k", GgufValueType::boolean, 2);
  EXPECT_EQ(rejection(boolean.build()), Errc::format);

  GgufBuilder alignment;
  alignment.kv_scalar<uint32_t>("general.alignment", GgufValueType::u32, 48);
  EXPECT_EQ(rejection(alignment.build()), Errc::format);
}

TEST(Gguf, BadTensorsAreRejected) {
  auto one = [](auto&& add) {
    GgufBuilder g;
    add(g);
    return rejection(g.build());
  };
  const std::vector<uint8_t> block(34, 0);
  EXPECT_EQ(one([&](GgufBuilder& g) { g.tensor("a", {32}, GgmlType::Q8_0, block); g.tensor("a", {32}, GgmlType::Q8_0, block); }),
            Errc::duplicate);
  // 34 is TQ1_0 (ternary), which lowbit does not read.
  EXPECT_EQ(one([&](GgufBuilder& g) { g.tensor("a", {32}, static_cast<GgmlType>(34), block); }), Errc::unsupported);
  EXPECT_EQ(one([&](GgufBuilder& g) { g.tensor("a", {16}, GgmlType::Q8_0, block); }), Errc::shape);
  EXPECT_EQ(one([&](GgufBuilder& g) { g.tensor("a", {32, 1, 1, 1, 1}, GgmlType::Q8_0, block); }), Errc::limit);
  EXPECT_EQ(one([&](GgufBuilder& g) { g.tensor("a", {0}, GgmlType::F32, {}); }), Errc::shape);
  EXPECT_EQ(one([&](GgufBuilder& g) { g.tensor("a", {32}, GgmlType::Q8_0, block, 8); }), Errc::layout);
  EXPECT_EQ(one([&](GgufBuilder& g) {
              g.tensor("a", {32}, GgmlType::Q8_0, block);
              g.tensor("b", {32}, GgmlType::Q8_0, block, 32);  // a occupies [0, 34)
            }),
            Errc::layout);
  EXPECT_EQ(one([&](GgufBuilder& g) { g.tensor("a", {64}, GgmlType::Q8_0, block); }), Errc::truncated);
  EXPECT_EQ(one([&](GgufBuilder& g) { g.tensor("a", {1ull << 40, 1ull << 40}, GgmlType::F32, {}); }), Errc::overflow);
}

}  // namespace
}  // namespace lowbit::io
