#include "lowbit/codec/offset_scale.h"

#include <gtest/gtest.h>

#include "codec/codec_test_util.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "lowbit/codec/codec.h"
#include "lowbit/core/error.h"

namespace lowbit::codec {
namespace {

namespace os = offset_scale;

Params precision(const char* p) { return {{"precision", p}}; }

std::vector<float> random_weights(int64_t n, uint64_t seed) { return test_util::gaussian_weights(n, seed, 0.05f); }

TensorRef ref(const EncodedTensor& e, const Shape& shape) { return test_util::encoded_ref("offset_scale", e, shape); }

using test_util::expect_errc;

// One group whose largest magnitude sits on the outermost level with scale 1 exactly, so RTN reproduces
// the integer codes given.
std::vector<float> group_for_codes(const std::vector<uint32_t>& codes, int offset, int64_t cols) {
  std::vector<float> w(static_cast<size_t>(cols), 0.0f);
  for (size_t j = 0; j < codes.size(); ++j) w[j] = static_cast<float>(static_cast<int>(codes[j]) - offset);
  return w;
}

TEST(OffsetScale, Q3GoldenBitsLsbFirstAcrossBytes) {
  // codes 0 1 2 3 4 5 6 0 -> 000 100 010 110 001 101 011 000 read LSB-first = 0x88 0xC6 0x1A
  const auto w = group_for_codes({0, 1, 2, 3, 4, 5, 6, 0}, 3, 64);
  const auto e = os::encode(precision("q3"), {1, 64}, w.data(), {});
  const auto* bytes = e.arrays[0].second.view().as<uint8_t>();
  ASSERT_EQ(e.arrays[0].second.shape, (Shape{1, 24}));
  EXPECT_EQ(bytes[0], 0x88);
  EXPECT_EQ(bytes[1], 0xC6);
  EXPECT_EQ(bytes[2], 0x1A);
  // The remaining 56 weights are 0: code 3 = 011, repeating with period 3 bytes: 0xDB 0xB6 0x6D.
  EXPECT_EQ(bytes[3], 0xDB);
  EXPECT_EQ(bytes[4], 0xB6);
  EXPECT_EQ(bytes[5], 0x6D);
  EXPECT_EQ(f16_to_f32(e.arrays[1].second.view().as<uint16_t>()[0]), 1.0f);
}

TEST(OffsetScale, Q4GoldenNibblesLowFirst) {
  const auto w = group_for_codes({1, 14, 7, 0}, 7, 64);
  const auto e = os::encode(precision("q4"), {1, 64}, w.data(), {});
  const auto* bytes = e.arrays[0].second.view().as<uint8_t>();
  ASSERT_EQ(e.arrays[0].second.shape, (Shape{1, 32}));
  EXPECT_EQ(bytes[0], 0xE1);
  EXPECT_EQ(bytes[1], 0x07);
  EXPECT_EQ(bytes[2], 0x77);  // zeros: code 7
}

TEST(OffsetScale, Full8GoldenAndGridMetadata) {
  // values -4..3 are codes 0..7 with zero point 4
  const auto w = group_for_codes({0, 1, 2, 3, 4, 4, 3, 2, 7}, 4, 64);
  const auto e = os::encode(precision("q3_full8"), {1, 64}, w.data(), {});
  const auto* bytes = e.arrays[0].second.view().as<uint8_t>();
  EXPECT_EQ(bytes[0], 0x88);
  EXPECT_EQ(bytes[1], 0x46);
  EXPECT_EQ(bytes[2], 0x4E);
  EXPECT_EQ(os::read_code(bytes, 8, 3), 7u);
  EXPECT_EQ(e.params["encoding"], "uniform_lsb_full8");
  EXPECT_EQ(e.params["grid"]["zero_point"], 4);
  EXPECT_EQ(e.params["grid"]["padding_code"], 4);
  EXPECT_NO_THROW(validate_tensor(ref(e, {1, 64}), "t"));
}

TEST(OffsetScale, ReadWriteCodeRoundTrip) {
  for (int bits : {3, 4}) {
    std::vector<uint8_t> row(64 * bits / 8, 0xFF);
    for (int64_t i = 0; i < 64; ++i) os::write_code(row.data(), i, bits, static_cast<uint32_t>((i * 5) % (1 << bits)));
    for (int64_t i = 0; i < 64; ++i) EXPECT_EQ(os::read_code(row.data(), i, bits), (i * 5) % (1 << bits));
  }
}

TEST(OffsetScale, EncodeDecodeErrorWithinHalfStep) {
  for (const char* p : {"q3", "q3_full8", "q4"}) {
    for (int64_t cols : {64, 100, 256}) {
      const Shape shape{7, cols};
      const auto w = random_weights(7 * cols, static_cast<uint64_t>(cols));
      const auto e = os::encode(precision(p), shape, w.data(), {});
      const auto t = ref(e, shape);
      ASSERT_NO_THROW(validate_tensor(t, "t"));
      const auto d = decode_all(t);
      const auto* scales = e.arrays[1].second.view().as<uint16_t>();
      const int64_t groups = (cols + 63) / 64;
      for (int64_t r = 0; r < 7; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          const float s = f16_to_f32(scales[r * groups + c / 64]);
          const size_t i = static_cast<size_t>(r * cols + c);
          // half a step, plus what rounding the scale to f16 can move the outermost level
          EXPECT_LE(std::fabs(d[i] - w[i]), 0.5f * s + 8.0f * s * 0x1p-11f) << p << " r" << r << " c" << c;
        }
    }
  }
}

TEST(OffsetScale, SearchNeverWorseThanRtn) {
  const Shape shape{9, 192};
  auto w = random_weights(9 * 192, 3);
  w[5] = 0.6f;  // an outlier that RTN's range must cover
  for (const char* p : {"q3", "q3_full8", "q4"}) {
    const auto rtn = decode_all(ref(os::encode(precision(p), shape, w.data(), {}), shape));
    EncodeOptions search;
    search.search = true;
    const auto srch = decode_all(ref(os::encode(precision(p), shape, w.data(), search), shape));
    double e_rtn = 0, e_search = 0;
    for (size_t i = 0; i < w.size(); ++i)
      e_rtn += std::pow(rtn[i] - w[i], 2), e_search += std::pow(srch[i] - w[i], 2);
    EXPECT_LE(e_search, e_rtn) << p;
  }
}

TEST(OffsetScale, PaddingHoldsZeroPointAndIsNeverDecoded) {
  const Shape shape{3, 100};
  const auto w = random_weights(300, 9);
  for (const char* p : {"q3", "q3_full8", "q4"}) {
    const auto e = os::encode(precision(p), shape, w.data(), {});
    EXPECT_EQ(e.params["padded_cols"], 128);
    const auto l = os::layout(e.params, shape);
    EXPECT_EQ(e.arrays[0].second.shape, (Shape{3, 128 * l.grid.bits / 8}));
    EXPECT_EQ(e.arrays[1].second.shape, (Shape{3, 2}));
    for (int64_t r = 0; r < 3; ++r)
      for (int64_t c = 100; c < 128; ++c)
        EXPECT_EQ(os::read_code(e.arrays[0].second.view().as<uint8_t>() + r * l.row_bytes(), c, l.grid.bits), l.grid.offset);
    EXPECT_EQ(decode_all(ref(e, shape)).size(), 300u);
  }
}

TEST(OffsetScale, QuantizeColumnUsesStoredScales) {
  const Shape shape{4, 64};
  const auto w = random_weights(256, 4);
  auto e = os::encode(precision("q4"), shape, w.data(), {});
  const std::vector<float> column{0.01f, -0.02f, 0.0f, 1e6f};
  std::vector<float> out(4);
  os::quantize_column(e.params, shape, e, 10, column.data(), out.data());
  const auto d = decode_all(ref(e, shape));
  for (int64_t r = 0; r < 4; ++r) EXPECT_EQ(d[static_cast<size_t>(r * 64 + 10)], out[static_cast<size_t>(r)]);
  const float s3 = f16_to_f32(e.arrays[1].second.view().as<uint16_t>()[3]);
  EXPECT_EQ(out[3], 7.0f * s3);  // clamped to the top level
}

TEST(OffsetScale, RejectsInvalidParams) {
  const Shape shape{2, 64};
  expect_errc(Errc::codec_params, [&] { os::validate(Params::object(), shape); });
  expect_errc(Errc::codec_params, [&] { os::validate(precision("q5"), shape); });
  expect_errc(Errc::codec_params, [&] { os::validate(Params{{"precision", 3}}, shape); });
  expect_errc(Errc::codec_params, [&] { os::validate(Params{{"precision", "q4"}, {"group_size", 128}}, shape); });
  expect_errc(Errc::codec_params, [&] { os::validate(Params{{"precision", "q4"}, {"padded_cols", 128}}, shape); });
  expect_errc(Errc::codec_params, [&] { os::validate(Params{{"precision", "q4"}, {"bits", 4}}, shape); });
  expect_errc(Errc::codec_params,
              [&] { os::validate(Params{{"precision", "q4"}, {"encoding", "uniform_lsb_full8"}}, shape); });
  expect_errc(Errc::codec_params,
              [&] { os::validate(Params{{"precision", "q3_full8"}, {"encoding", "uniform_lsb"}}, shape); });
  Params q3_with_grid = precision("q3");
  q3_with_grid["grid"] = Params::object();
  expect_errc(Errc::codec_params, [&] { os::validate(q3_with_grid, shape); });
  const auto w = random_weights(128, 1);
  Params bad_grid = os::encode(precision("q3_full8"), shape, w.data(), {}).params;
  bad_grid["grid"]["padding_code"] = 0;
  expect_errc(Errc::codec_params, [&] { os::validate(bad_grid, shape); });
  expect_errc(Errc::codec_params, [&] { os::validate(Params::array(), shape); });
  expect_errc(Errc::shape, [&] { os::validate(precision("q4"), {64}); });
  expect_errc(Errc::limit, [&] { os::validate(precision("q4"), {2, 0}); });
  expect_errc(Errc::limit, [&] { os::validate(precision("q4"), {2, os::kMaxCols + 1}); });
  expect_errc(Errc::limit, [&] { os::validate(precision("q4"), {os::kMaxRows + 1, 64}); });
  EXPECT_NO_THROW(os::validate(Params{{"precision", "q3"}, {"group_size", 64}, {"padded_cols", 128}}, {2, 65}));
}

TEST(OffsetScale, RejectsReservedCodesAndBadScales) {
  const Shape shape{2, 100};
  const auto w = random_weights(200, 5);
  for (const char* p : {"q3", "q3_full8", "q4"}) {
    const auto good = os::encode(precision(p), shape, w.data(), {});
    const auto l = os::layout(good.params, shape);
    const auto with_code = [&](int64_t c, uint32_t code) {
      EncodedTensor e = good;
      os::write_code(e.arrays[0].second.as<uint8_t>() + l.row_bytes(), c, l.grid.bits, code);
      return e;
    };
    if (l.grid.max_code < (1u << l.grid.bits) - 1u) {
      const auto e = with_code(5, l.grid.max_code + 1);
      expect_errc(Errc::reserved_code, [&] { validate_tensor(ref(e, shape), "t"); });
    }
    const auto padded = with_code(110, l.grid.offset + 1);
    expect_errc(Errc::reserved_code, [&] { validate_tensor(ref(padded, shape), "t"); });
    EXPECT_NO_THROW(validate_tensor(ref(with_code(99, l.grid.max_code), shape), "t"));
    for (float s : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), 0.0f, -0.0f,
                    -1.0f}) {
      EncodedTensor e = good;
      e.arrays[1].second.as<uint16_t>()[3] = f32_to_f16(s);
      expect_errc(Errc::non_finite, [&] { validate_tensor(ref(e, shape), "t"); });
    }
  }
}

TEST(OffsetScale, RejectsArraysOfTheWrongShape) {
  const Shape shape{2, 64};
  const auto w = random_weights(128, 6);
  auto e = os::encode(precision("q3"), shape, w.data(), {});
  e.arrays[0].second = make_buffer(DType::U8, {2, 32});
  expect_errc(Errc::shape, [&] { validate_tensor(ref(e, shape), "t"); });
}

TEST(OffsetScale, AllZeroGroupsGetAPositiveScale) {
  const Shape shape{1, 64};
  const std::vector<float> zeros(64, 0.0f);
  const auto e = os::encode(precision("q4"), shape, zeros.data(), {});
  EXPECT_NO_THROW(validate_tensor(ref(e, shape), "t"));
  for (float v : decode_all(ref(e, shape))) EXPECT_EQ(v, 0.0f);
}

}  // namespace
}  // namespace lowbit::codec
