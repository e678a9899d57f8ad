// The affine codec: MLX bit layouts written out by hand, MLX's RTN parameters, error bounds per width, the
// clipping search, padding, parameter validation and content checks.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "codec/codec_test_util.h"
#include "lowbit/codec/affine.h"
#include "lowbit/codec/codec.h"
#include "lowbit/core/error.h"

namespace lowbit::codec {
namespace {

Params affine_params(int bits, int group_size = 32, const char* scale_dtype = "f32") {
  return {{"bits", bits}, {"group_size", group_size}, {"scale_dtype", scale_dtype}};
}

const Codec& affine_codec() { return codec_or_throw("affine", "test"); }

TensorRef ref_of(const EncodedTensor& t, const Shape& shape) { return {&affine_codec(), t.params, shape, t.views()}; }

std::vector<uint32_t> codes_of(const EncodedTensor& t) {
  const TensorBuffer& b = t.arrays.at(0).second;
  const auto* p = reinterpret_cast<const uint32_t*>(b.bytes.data());
  return {p, p + b.bytes.size() / 4};
}

// Weights whose MLX RTN codes are exactly `codes` (one group of 32 with codes 0 and 2^b-1 present): MLX puts
// the larger-magnitude endpoint (here max = 2^b - 1) at bias with scale -1, so code = (2^b - 1) - w.
std::vector<float> weights_for_codes(const std::vector<uint32_t>& codes, int bits) {
  std::vector<float> w;
  w.reserve(codes.size());
  for (uint32_t q : codes) w.push_back(static_cast<float>((1u << bits) - 1u - q));
  return w;
}

struct Golden {
  int bits;
  std::vector<uint32_t> codes;  // 32 codes: one group
  std::vector<uint32_t> words;  // the little-endian, LSB-first stream, written out by hand
};

// Each case sets a few codes; every other code is 0. Straddling codes are the point for 3, 5 and 6 bits.
std::vector<Golden> goldens() {
  auto codes = [](std::initializer_list<std::pair<int, uint32_t>> set) {
    std::vector<uint32_t> c(32, 0);
    for (auto [i, q] : set) c[static_cast<size_t>(i)] = q;
    return c;
  };
  return {
      // 2 bits: 16 codes per word. codes 0..3 = 1, 2, 3, 0 -> 0b00'11'10'01 = 0x39; code 31 = 3 -> word 1 bits 30-31.
      {2, codes({{0, 1}, {1, 2}, {2, 3}, {31, 3}}), {0x00000039u, 0xC0000000u}},
      // 3 bits: code 10 = 7 occupies bits 30..32 (straddles words 0 and 1); code 21 = 5 = 0b101 occupies bits
      // 63..65: bit 63 (word 1 bit 31) and bit 65 (word 2 bit 1).
      {3, codes({{10, 7}, {21, 5}}), {0xC0000000u, 0x80000001u, 0x00000002u}},
      // 3 bits: the worked example of docs/CODECS.md; code 10 = 6 = 0b110 straddles: bit 30 = 0, bits 31 and
      // 32 = 1; code 11 = 3 continues at bit 33.
      {3, codes({{0, 5}, {1, 3}, {2, 7}, {3, 1}, {5, 6}, {6, 2}, {7, 4}, {8, 7}, {9, 7}, {10, 6}, {11, 3}}),
       {0xBF8B03DDu, 0x00000007u, 0u}},
      // 4 bits: codes 0..7 = 0..7 -> 0x76543210; codes 8..15 = 8..15 -> 0xFEDCBA98; code 31 = 15.
      {4,
       codes({{1, 1}, {2, 2}, {3, 3}, {4, 4}, {5, 5}, {6, 6}, {7, 7}, {8, 8}, {9, 9}, {10, 10}, {11, 11}, {12, 12},
              {13, 13}, {14, 14}, {15, 15}, {31, 15}}),
       {0x76543210u, 0xFEDCBA98u, 0u, 0xF0000000u}},
      // 5 bits: code 6 = 31 occupies bits 30..34 -> word 0 bits 30-31, word 1 bits 0-2.
      {5, codes({{6, 31}, {31, 1}}), {0xC0000000u, 0x00000007u, 0u, 0u, 0x08000000u}},
      // 6 bits: code 5 = 63 occupies bits 30..35 -> word 0 bits 30-31, word 1 bits 0-3; code 10 = 0b100001
      // occupies bits 60..65 -> word 1 bit 28, word 2 bit 1.
      {6, codes({{5, 63}, {10, 33}}), {0xC0000000u, 0x1000000Fu, 0x00000002u, 0u, 0u, 0u}},
      // 8 bits: one code per byte, first code in the lowest byte.
      {8, codes({{0, 1}, {1, 2}, {2, 3}, {3, 4}, {31, 255}}), {0x04030201u, 0, 0, 0, 0, 0, 0, 0xFF000000u}},
  };
}

TEST(Affine, MlxBitLayoutsWrittenByHand) {
  for (const Golden& g : goldens()) {
    ASSERT_EQ(g.words.size(), static_cast<size_t>(g.bits));  // 32 codes x b bits = b words
    for (size_t i = 0; i < g.codes.size(); ++i)
      EXPECT_EQ(affine::read_code(g.words.data(), static_cast<int64_t>(i), g.bits), g.codes[i])
          << g.bits << " bits, code " << i;
    std::vector<uint32_t> written(g.words.size(), 0);
    for (size_t i = 0; i < g.codes.size(); ++i)
      affine::write_code(written.data(), static_cast<int64_t>(i), g.bits, g.codes[i]);
    EXPECT_EQ(written, g.words) << g.bits << " bits";
  }
}

TEST(Affine, RtnEncoderPacksTheGoldenStreams) {
  for (const Golden& g : goldens()) {
    const auto w = weights_for_codes(g.codes, g.bits);
    const EncodedTensor t = affine_codec().encode(affine_params(g.bits), {1, 32}, w.data(), {});
    EXPECT_EQ(codes_of(t), g.words) << g.bits << " bits";
    std::vector<float> decoded(32);
    affine_codec().decode_rows(t.params, {1, 32}, t.views(), 0, 1, decoded.data());
    for (size_t i = 0; i < 32; ++i) EXPECT_EQ(decoded[i], w[i]) << g.bits << " bits, element " << i;
  }
}

TEST(Affine, MlxRtnParameters) {
  // |min| > |max|: positive scale, bias = min, min exactly representable.
  auto p = affine::mlx_group_params(-1.0f, 0.5f, 4);
  EXPECT_FLOAT_EQ(p.scale, 0.1f);
  EXPECT_EQ(p.bias, -1.0f);
  // |max| >= |min|: negative scale, bias = max.
  p = affine::mlx_group_params(-0.5f, 1.0f, 4);
  EXPECT_FLOAT_EQ(p.scale, -0.1f);
  EXPECT_EQ(p.bias, 1.0f);
  // A constant zero group: scale clamps to eps, bias 0.
  p = affine::mlx_group_params(0.0f, 0.0f, 3);
  EXPECT_EQ(p.scale, -1e-7f);
  EXPECT_EQ(p.bias, 0.0f);
}

double max_abs_error(const std::vector<float>& a, const std::vector<float>& b) {
  double e = 0;
  for (size_t i = 0; i < a.size(); ++i) e = std::max(e, static_cast<double>(std::abs(a[i] - b[i])));
  return e;
}

std::vector<float> random_weights(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> w(n);
  for (float& f : w) f = normal(rng);
  return w;
}

// RTN puts every weight on the nearest point of its group's grid {scale * q + bias}; MLX's exact endpoint makes
// the grid cover up to half a step less than [min, max], so the error stays within one step = range / (2^b - 1).
// (f32 scales: no storage rounding.)
TEST(Affine, RtnPicksTheNearestGridPointWithinAStep) {
  const int64_t rows = 7, cols = 96, G = 32;
  const auto w = random_weights(static_cast<size_t>(rows * cols), 3);
  double previous = 1e9;
  for (int bits : {2, 3, 4, 5, 6, 8}) {
    const EncodedTensor t = affine_codec().encode(affine_params(bits, G), {rows, cols}, w.data(), {});
    const auto d = decode_all(ref_of(t, {rows, cols}));
    const auto* scales = reinterpret_cast<const float*>(t.arrays.at(1).second.bytes.data());
    const auto* biases = reinterpret_cast<const float*>(t.arrays.at(2).second.bytes.data());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t g = 0; g < cols / G; ++g) {
        const float* wg = w.data() + r * cols + g * G;
        const auto [lo, hi] = std::minmax_element(wg, wg + G);
        const double step = (*hi - *lo) / ((1 << bits) - 1);
        const float s = scales[r * (cols / G) + g], b = biases[r * (cols / G) + g];
        for (int64_t i = 0; i < G; ++i) {
          const double err = std::abs(d[r * cols + g * G + i] - wg[i]);
          EXPECT_LE(err, step * (1 + 1e-4)) << bits << " bits";
          for (uint32_t q = 0; q < (1u << bits); ++q)
            EXPECT_LE(err, std::abs(s * static_cast<float>(q) + b - wg[i]) + 1e-6) << bits << " bits, code " << q;
        }
      }
    const double err = max_abs_error(w, d);
    EXPECT_LT(err, previous) << "more bits must not be worse: " << bits;
    previous = err;
  }
}

TEST(Affine, Bf16ScalesStayNearRtn) {
  const auto w = random_weights(64 * 4, 4);
  const EncodedTensor t = affine_codec().encode(affine_params(4, 64, "bf16"), {4, 64}, w.data(), {});
  const auto d = decode_all(ref_of(t, {4, 64}));
  const auto [lo, hi] = std::minmax_element(w.begin(), w.end());
  // One step plus bf16 rounding of scale (times up to 15) and bias.
  EXPECT_LE(max_abs_error(w, d), (*hi - *lo) / 15 * (1 + 15.0 / 256) + std::max(*hi, -*lo) / 256);
}

double weighted_error(const std::vector<float>& w, const std::vector<float>& d, int64_t cols,
                      const std::vector<float>& importance) {
  double e = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    const double diff = w[i] - d[i];
    e += (importance.empty() ? 1.0 : importance[i % static_cast<size_t>(cols)]) * diff * diff;
  }
  return e;
}

TEST(Affine, SearchNeverLosesToRtnAndUsesImportance) {
  const int64_t rows = 16, cols = 128;
  auto w = random_weights(static_cast<size_t>(rows * cols), 5);
  for (size_t i = 0; i < w.size(); i += 37) w[i] *= 8.0f;  // outliers make clipping pay
  std::vector<float> importance(static_cast<size_t>(cols));
  for (int64_t c = 0; c < cols; ++c) importance[c] = c % 3 == 0 ? 10.0f : 0.1f;
  for (int bits : {2, 3, 4}) {
    const Params params = affine_params(bits, 64);
    const auto rtn = decode_all(ref_of(affine_codec().encode(params, {rows, cols}, w.data(), {}), {rows, cols}));
    EncodeOptions search;
    search.search = true;
    const auto searched =
        decode_all(ref_of(affine_codec().encode(params, {rows, cols}, w.data(), search), {rows, cols}));
    EXPECT_LT(weighted_error(w, searched, cols, {}), weighted_error(w, rtn, cols, {})) << bits;
    search.column_importance = importance;
    const auto weighted =
        decode_all(ref_of(affine_codec().encode(params, {rows, cols}, w.data(), search), {rows, cols}));
    EXPECT_LE(weighted_error(w, weighted, cols, importance), weighted_error(w, rtn, cols, importance)) << bits;
  }
  EncodeOptions wrong;
  wrong.search = true;
  const std::vector<float> short_importance(3, 1.0f);
  wrong.column_importance = short_importance;
  EXPECT_THROW(affine_codec().encode(affine_params(4), {rows, cols}, w.data(), wrong), Error);
}

// Widths that are not a multiple of the group are zero-padded: params record padded_cols, padding codes are 0,
// the range of the last group ignores the padding, and decode returns the logical width only.
TEST(Affine, PaddingIsNeverData) {
  const int64_t rows = 3, cols = 37;
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < w.size(); ++i) w[i] = 1.0f + static_cast<float>(i % 7) / 6.0f;  // all in [1, 2]
  const EncodedTensor t = affine_codec().encode(affine_params(4), {rows, cols}, w.data(), {});
  EXPECT_EQ(t.params.at("padded_cols"), 64);
  EXPECT_EQ(t.arrays.at(0).second.shape, (Shape{rows, 64 * 4 / 32}));
  EXPECT_EQ(t.arrays.at(1).second.shape, (Shape{rows, 2}));
  const auto codes = codes_of(t);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = cols; c < 64; ++c) EXPECT_EQ(affine::read_code(codes.data() + r * 8, c, 4), 0u);
  const auto d = decode_all(ref_of(t, {rows, cols}));
  ASSERT_EQ(d.size(), w.size());
  EXPECT_LE(max_abs_error(w, d), 1.0 / 15 + 1e-5);  // a step of [1, 2], not of [0, 2]
  validate_tensor(ref_of(t, {rows, cols}), "padded");

  EncodedTensor dirty = t;
  affine::write_code(dirty.arrays.at(0).second.as<uint32_t>(), 40, 4, 3);
  try {
    validate_tensor(ref_of(dirty, {rows, cols}), "dirty");
    FAIL() << "a nonzero padding code was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::reserved_code);
  }
}

// 3 bits in groups of 16 (GGUF's Q3_K) pad to a pair of groups, 96 bits, so that rows stay whole words: 37 columns
// pad to 64, not 48, and the all-padding fourth group is stored too; any other padded_cols is refused.
TEST(Affine, ThreeBitGroupsOf16PadToWholeWords) {
  const int64_t rows = 3, cols = 37;
  const auto w = random_weights(static_cast<size_t>(rows * cols), 16);
  const EncodedTensor t = affine_codec().encode(affine_params(3, 16), {rows, cols}, w.data(), {});
  EXPECT_EQ(t.params.at("padded_cols"), 64);
  EXPECT_EQ(t.arrays.at(0).second.shape, (Shape{rows, 64 * 3 / 32}));
  EXPECT_EQ(t.arrays.at(1).second.shape, (Shape{rows, 4}));
  for (int64_t r = 0; r < rows; ++r)  // the all-padding group: scale and bias 0
    for (size_t array : {size_t{1}, size_t{2}})
      EXPECT_EQ(load_float(DType::F32, t.arrays.at(array).second.bytes.data(), static_cast<size_t>(r * 4 + 3)), 0.0f);
  validate_tensor(ref_of(t, {rows, cols}), "3 bits g16");
  EXPECT_EQ(decode_all(ref_of(t, {rows, cols})).size(), w.size());
  Params p48 = affine_params(3, 16);
  p48["padded_cols"] = 48;
  test_util::expect_errc(Errc::codec_params, [&] { affine_codec().validate(p48, {rows, cols}); });
  // 2 and 6 bits fill whole words with one group
  for (const int bits : {2, 6}) {
    const EncodedTensor u = affine_codec().encode(affine_params(bits, 16), {rows, cols}, w.data(), {});
    EXPECT_EQ(u.params.at("padded_cols"), 48) << bits;
  }
}

TEST(Affine, EveryInvalidParamIsRejected) {
  const Codec& c = affine_codec();
  const Shape shape{4, 64};
  const std::vector<Params> invalid = {
      {{"group_size", 32}, {"scale_dtype", "f16"}},  // bits missing
      {{"bits", 4}, {"scale_dtype", "f16"}},         // group_size missing
      {{"bits", 4}, {"group_size", 32}},             // scale_dtype missing
      {{"bits", 1}, {"group_size", 32}, {"scale_dtype", "f16"}},
      {{"bits", 7}, {"group_size", 32}, {"scale_dtype", "f16"}},
      {{"bits", 16}, {"group_size", 32}, {"scale_dtype", "f16"}},
      {{"bits", "4"}, {"group_size", 32}, {"scale_dtype", "f16"}},
      {{"bits", 4.0}, {"group_size", 32}, {"scale_dtype", "f16"}},
      {{"bits", 4}, {"group_size", 16}, {"scale_dtype", "f16"}},
      {{"bits", 5}, {"group_size", 16}, {"scale_dtype", "f32"}},
      {{"bits", 8}, {"group_size", 16}, {"scale_dtype", "f32"}},
      {{"bits", 4}, {"group_size", 256}, {"scale_dtype", "f16"}},
      {{"bits", 4}, {"group_size", 32}, {"scale_dtype", "f64"}},
      {{"bits", 4}, {"group_size", 32}, {"scale_dtype", "F16"}},
      {{"bits", 4}, {"group_size", 32}, {"scale_dtype", "f16"}, {"padded_cols", 96}},
      {{"bits", 4}, {"group_size", 32}, {"scale_dtype", "f16"}, {"padded_cols", -64}},
      {{"bits", 4}, {"group_size", 32}, {"scale_dtype", "f16"}, {"zero_point", 8}},
      Params::array({4, 32}),
  };
  for (const Params& p : invalid) {
    try {
      c.validate(p, shape);
      ADD_FAILURE() << "accepted " << p.dump();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::codec_params) << p.dump() << ": " << e.what();
    }
  }
  const Params good = affine_params(4, 32, "f16");
  EXPECT_NO_THROW(c.validate(good, shape));
  for (const int bits : {2, 3, 6}) EXPECT_NO_THROW(c.validate(affine_params(bits, 16, "f32"), shape)) << bits;
  for (const Shape& bad : {Shape{64}, Shape{2, 2, 64}, Shape{0, 64}, Shape{4, 0}, Shape{-1, 64}}) {
    try {
      c.validate(good, bad);
      ADD_FAILURE() << "accepted shape " << shape_str(bad);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::shape) << shape_str(bad);
    }
  }
}

TEST(Affine, NonFiniteScalesAndBiasesRejected) {
  const auto w = random_weights(2 * 64, 6);
  for (const char* dtype : {"bf16", "f16", "f32"}) {
    for (size_t array : {size_t{1}, size_t{2}}) {
      for (float bad : {NAN, INFINITY, -INFINITY}) {
        EncodedTensor t = affine_codec().encode(affine_params(4, 32, dtype), {2, 64}, w.data(), {});
        TensorBuffer& b = t.arrays.at(array).second;
        store_float(b.dtype, b.bytes.data(), 3, bad);
        try {
          validate_tensor(ref_of(t, {2, 64}), "t");
          ADD_FAILURE() << dtype << " array " << array << " accepted " << bad;
        } catch (const Error& e) {
          EXPECT_EQ(e.code(), Errc::non_finite);
        }
      }
    }
  }
  std::vector<float> nan_weights = w;
  nan_weights[5] = NAN;
  EXPECT_THROW(affine_codec().encode(affine_params(4), {2, 64}, nan_weights.data(), {}), Error);
  std::vector<float> huge(64, 1e6f);
  huge[0] = -1e6f;
  EXPECT_THROW(affine_codec().encode(affine_params(4, 32, "f16"), {1, 64}, huge.data(), {}), Error);
}

TEST(Affine, QuantizeColumnRoundsOntoTheStoredGrid) {
  const int64_t rows = 5, cols = 64;
  const auto w = random_weights(static_cast<size_t>(rows * cols), 8);
  EncodedTensor t = affine_codec().encode(affine_params(3), {rows, cols}, w.data(), {});
  const auto before = decode_all(ref_of(t, {rows, cols}));
  std::vector<float> column(rows), out(rows);
  for (int64_t r = 0; r < rows; ++r) column[r] = before[r * cols + 10];
  affine::quantize_column(t.params, {rows, cols}, t, 10, column.data(), out.data());
  EXPECT_EQ(decode_all(ref_of(t, {rows, cols})), before);  // decoded values are fixed points
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_EQ(out[r], before[r * cols + 10]);
    column[r] = 1e3f;  // far outside: clamps to an end of the grid
  }
  affine::quantize_column(t.params, {rows, cols}, t, 10, column.data(), out.data());
  const auto after = decode_all(ref_of(t, {rows, cols}));
  for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(after[r * cols + 10], out[r]);
  EXPECT_THROW(affine::quantize_column(t.params, {rows, cols}, t, cols, column.data(), out.data()), Error);
}

TEST(Affine, BitsPerWeightCountsMetadata) {
  EXPECT_DOUBLE_EQ(bits_per_weight(affine_codec(), affine_params(4, 64, "bf16"), {8, 128}), 4.5);
  EXPECT_DOUBLE_EQ(bits_per_weight(affine_codec(), affine_params(3, 32, "f32"), {8, 128}), 5.0);
}

}  // namespace
}  // namespace lowbit::codec
