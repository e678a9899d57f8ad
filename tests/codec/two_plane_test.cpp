#include "lowbit/codec/two_plane.h"

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

namespace tp = two_plane;

Params params(const char* storage, const char* metadata, const char* dtype = "bf16") {
  return {{"storage", storage}, {"metadata", metadata}, {"scale_dtype", dtype}};
}

std::vector<float> random_weights(int64_t n, uint64_t seed) { return test_util::gaussian_weights(n, seed, 0.02f); }

TensorRef ref(const EncodedTensor& e, const Shape& shape) { return test_util::encoded_ref("two_plane", e, shape); }

using test_util::expect_errc;

double squared_error(const std::vector<float>& a, const std::vector<float>& b) {
  double e = 0.0;
  for (size_t i = 0; i < a.size(); ++i) e += std::pow(static_cast<double>(a[i]) - b[i], 2);
  return e;
}

// A row whose weights are exactly the states {-2..2} times 0.5 (exact in bf16), so every encoder recovers them.
std::vector<float> state_row(const std::vector<int>& states, int64_t cols) {
  std::vector<float> w(static_cast<size_t>(cols), 0.0f);
  for (size_t j = 0; j < states.size(); ++j) w[j] = 0.5f * static_cast<float>(states[j]);
  return w;
}

const std::vector<int> kStates{-2, -1, 0, 1, 2, -2, -1, 0, 1, 2, 2, 2};

TEST(TwoPlane, Quint5GoldenDigitOrder) {
  // digits 0 1 2 3 4 0 1 2 3 4 (first weight least significant): 5 + 50 + 375 + 2500 + 15625 + 156250
  // + 1171875 + 7812500 = 9159180 = 0x8BC20C, stored little-endian
  const uint8_t digits[10] = {0, 1, 2, 3, 4, 0, 1, 2, 3, 4};
  uint8_t chunk[3];
  tp::quint5_pack(digits, 10, chunk);
  EXPECT_EQ(chunk[0], 0x0C);
  EXPECT_EQ(chunk[1], 0xC2);
  EXPECT_EQ(chunk[2], 0x8B);
  uint8_t back[10];
  ASSERT_TRUE(tp::quint5_unpack(chunk, 10, back));
  for (int j = 0; j < 10; ++j) EXPECT_EQ(back[j], digits[j]);
  const uint8_t over[3] = {0xF9, 0x02, 0x95};  // 9765625 = 5^10
  EXPECT_FALSE(tp::quint5_unpack(over, 10, back));
  const uint8_t tail[3] = {0xE0, 0xF5, 0x05};  // 390624 = 5^8 - 1: eight 4s, fine for n = 8 only
  EXPECT_TRUE(tp::quint5_unpack(tail, 8, back));
  EXPECT_FALSE(tp::quint5_unpack(tail, 7, back));
}

TEST(TwoPlane, EncodedStatesInEveryStorage) {
  const Shape shape{1, 128};
  const auto w = state_row(kStates, 128);
  // planes: state -> (base, residual) = (0,0) (0,1) (1,1) (2,1) (2,2); MLX 2 bits per code, LSB first
  {
    const auto e = tp::encode(params("planes", "full"), shape, w.data(), {});
    const auto* base = e.arrays[0].second.view().as<uint32_t>();
    const auto* residual = e.arrays[1].second.view().as<uint32_t>();
    // base codes 0 0 1 2 2 0 0 1 2 2 2 2 then 1s; residual 0 1 1 1 2 0 1 1 1 2 2 2 then 1s
    EXPECT_EQ(base[0], 0x55AA4290u);
    EXPECT_EQ(residual[0], 0x55A95254u);
    EXPECT_EQ(base[1], 0x55555555u);
    EXPECT_EQ(f32_to_bf16(0.5f), e.arrays[2].second.view().as<uint16_t>()[0]);  // base scale = alpha
    EXPECT_EQ(f32_to_bf16(-0.5f), e.arrays[3].second.view().as<uint16_t>()[0]);  // bias = -scale
  }
  // quint5: digits = state + 2 = 0 1 2 3 4 0 1 2 3 4 | 4 4 2 2 ...
  {
    const auto e = tp::encode(params("quint5", "slim"), shape, w.data(), {});
    const auto* codes = e.arrays[0].second.view().as<uint8_t>();
    ASSERT_EQ(e.arrays[0].second.shape, (Shape{1, 39}));  // ceil(128 / 10) * 3
    EXPECT_EQ(codes[0], 0x0C);
    EXPECT_EQ(codes[1], 0xC2);
    EXPECT_EQ(codes[2], 0x8B);
    // 4 + 4*5 + 2*(25 + ... + 5^9) = 24 + 2 * (9765625 - 25) / 4 = 4882824 = 0x4A8188
    EXPECT_EQ(codes[3], 0x88);
    EXPECT_EQ(codes[4], 0x81);
    EXPECT_EQ(codes[5], 0x4A);
    // last chunk: 8 digits of state 0 = 2 * (5^8 - 1) / 4 = 195312 = 0x02FAF0
    EXPECT_EQ(codes[36], 0xF0);
    EXPECT_EQ(codes[37], 0xFA);
    EXPECT_EQ(codes[38], 0x02);
  }
  // trit3: digits 0 1 2 3 4 0 1 2 as 3-bit LSB-first codes: 000 100 010 110 001 000 100 010 = 0x88 0x46 0x44
  {
    const auto e = tp::encode(params("trit3", "full", "f32"), shape, w.data(), {});
    const auto* codes = e.arrays[0].second.view().as<uint8_t>();
    ASSERT_EQ(e.arrays[0].second.shape, (Shape{1, 48}));
    for (size_t j = 0; j < kStates.size(); ++j) {
      const uint64_t bit = j * 3;
      const uint32_t d = ((codes[bit / 8] | (codes[bit / 8 + 1] << 8)) >> (bit % 8)) & 7u;
      EXPECT_EQ(d, static_cast<uint32_t>(kStates[j] + 2)) << j;
    }
    EXPECT_EQ(codes[0], 0x88);
    EXPECT_EQ(codes[1], 0x46);
    EXPECT_EQ(codes[2], 0x44);
  }
}

TEST(TwoPlane, RowPlaneCodesFollowTheStateMapping) {
  const Shape shape{1, 128};
  const auto w = state_row(kStates, 128);
  for (const char* storage : {"planes", "quint5", "trit3"}) {
    const auto e = tp::encode(params(storage, "full"), shape, w.data(), {});
    const auto l = tp::layout(e.params, shape);
    std::vector<uint8_t> base(128), residual(128);
    tp::row_plane_codes(l, e.views(), 0, base.data(), residual.data());
    for (size_t j = 0; j < kStates.size(); ++j) {
      EXPECT_EQ(base[j], tp::kStateBase[kStates[j] + 2]) << storage;
      EXPECT_EQ(residual[j], tp::kStateResidual[kStates[j] + 2]) << storage;
    }
    const auto d = decode_all(ref(e, shape));
    for (size_t j = 0; j < 128; ++j) EXPECT_EQ(d[j], w[j]) << storage << " " << j;
  }
}

TEST(TwoPlane, SlimMetadataExpandsToContiguousPerGroupArrays) {
  const Shape shape{3, 300};
  const auto w = random_weights(900, 2);
  const auto e = tp::encode(params("planes", "slim"), shape, w.data(), {});
  ASSERT_EQ(e.arrays[2].first, "base_alpha");
  ASSERT_EQ(e.arrays[3].first, "residual_scale");
  const auto l = tp::layout(e.params, shape);
  ASSERT_EQ(l.groups_per_row(), 3);
  const auto m = tp::expand_metadata(l, e.views());
  ASSERT_EQ(m.base_scales.size(), 9u);
  const float residual = bf16_to_f32(e.arrays[3].second.view().as<uint16_t>()[0]);
  for (int64_t r = 0; r < 3; ++r) {
    const float alpha = bf16_to_f32(e.arrays[2].second.view().as<uint16_t>()[r]);
    for (int64_t g = 0; g < 3; ++g) {
      const size_t i = static_cast<size_t>(r * 3 + g);
      EXPECT_EQ(m.base_scales[i], alpha);
      EXPECT_EQ(m.base_biases[i], -alpha);
      EXPECT_EQ(m.residual_scales[i], residual);
      EXPECT_EQ(m.residual_biases[i], -residual);
    }
  }
}

TEST(TwoPlane, StoragesDecodeIdentically) {
  const Shape shape{5, 200};
  const auto w = random_weights(1000, 3);
  for (const char* metadata : {"full", "slim"}) {
    const auto planes = decode_all(ref(tp::encode(params("planes", metadata), shape, w.data(), {}), shape));
    for (const char* storage : {"quint5", "trit3"}) {
      const auto e = tp::encode(params(storage, metadata), shape, w.data(), {});
      ASSERT_NO_THROW(validate_tensor(ref(e, shape), "t"));
      EXPECT_EQ(decode_all(ref(e, shape)), planes) << storage << " " << metadata;
    }
  }
}

TEST(TwoPlane, EncodeErrorBoundsAndRefinement) {
  for (int64_t cols : {128, 200, 512}) {
    const Shape shape{6, cols};
    const auto w = random_weights(6 * cols, static_cast<uint64_t>(cols));
    double energy = 0.0;
    for (float v : w) energy += static_cast<double>(v) * v;
    for (const char* metadata : {"full", "slim"}) {
      const auto e = tp::encode(params("planes", metadata, "f32"), shape, w.data(), {});
      const auto d = decode_all(ref(e, shape));
      const double basic = squared_error(d, w);
      // full keeps each group's extremes as its outer levels (below); five levels with the outer ones at the
      // extremes of 128 Gaussian samples (about 2.6 sigma) give about 0.117; slim's five uniform levels per row
      // about 0.08, its mean residual scale a little more
      EXPECT_LT(basic / energy, 0.13) << metadata << " cols " << cols;
      if (std::string(metadata) == "full") {
        // Plain rounding never clips: each group's smallest and largest weights are its outer levels.
        for (int64_t r = 0; r < 6; ++r)
          for (int64_t c0 = 0; c0 < cols; c0 += 128) {
            size_t lo = static_cast<size_t>(r * cols + c0), hi = lo;
            for (int64_t c = c0; c < std::min(cols, c0 + 128); ++c) {
              const auto i = static_cast<size_t>(r * cols + c);
              if (w[i] < w[lo]) lo = i;
              if (w[i] > w[hi]) hi = i;
            }
            EXPECT_NEAR(d[lo], w[lo], 1e-6f) << "row " << r << " group " << c0 / 128;
            EXPECT_NEAR(d[hi], w[hi], 1e-6f) << "row " << r << " group " << c0 / 128;
          }
      }
      EncodeOptions refine;
      refine.search = true;
      const auto r = decode_all(ref(tp::encode(params("planes", metadata, "f32"), shape, w.data(), refine), shape));
      EXPECT_LE(squared_error(r, w), basic * (1 + 1e-9)) << metadata;
    }
  }
}

// Full metadata is a five-level grid per group of 128 with its own center and steps, so groups of very different
// scales and offsets in one row cost no more than each alone: the error relative to each group's variance stays
// near that of the best five-level quantizer of a Gaussian: 0.117 with the outer levels at the extremes of 128
// samples (plain rounding), 0.0799 with both steps free (the search); four uniform levels, 2-bit affine at its
// best, give 0.119. One alpha per row, or levels symmetric about 0, would fail this by far.
TEST(TwoPlane, FullMetadataFitsEachGroupsScaleAndOffset) {
  constexpr int64_t kRows = 32, kGroups = 5, kCols = kGroups * 128 - 64;  // the last group half padded
  std::mt19937_64 rng(11);
  std::normal_distribution<float> n01;
  std::vector<float> w(static_cast<size_t>(kRows * kCols));
  const float sigma[kGroups] = {0.001f, 0.03f, 0.004f, 0.2f, 0.01f}, mean[kGroups] = {0.0f, -0.05f, 0.02f, 0.3f, -0.01f};
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t c = 0; c < kCols; ++c) w[r * kCols + c] = mean[c / 128] + sigma[c / 128] * n01(rng);
  const Shape shape{kRows, kCols};
  for (bool search : {false, true}) {
    EncodeOptions o;
    o.search = search;
    const auto d = decode_all(ref(tp::encode(params("quint5", "full"), shape, w.data(), o), shape));
    for (int64_t g = 0; g < kGroups; ++g) {
      double err = 0.0, var = 0.0;
      for (int64_t r = 0; r < kRows; ++r)
        for (int64_t c = g * 128; c < std::min(kCols, (g + 1) * 128); ++c) {
          const auto i = static_cast<size_t>(r * kCols + c);
          err += std::pow(static_cast<double>(w[i]) - d[i], 2);
          var += std::pow(static_cast<double>(w[i]) - mean[g], 2);
        }
      EXPECT_LT(err / var, search ? 0.08 : 0.125) << "group " << g << (search ? " with search" : "");
    }
  }
}

TEST(TwoPlane, PaddingIsStateZeroAndNeverDecoded) {
  const Shape shape{2, 130};
  const auto w = random_weights(260, 4);
  for (const char* storage : {"planes", "quint5", "trit3"}) {
    const auto e = tp::encode(params(storage, "full"), shape, w.data(), {});
    EXPECT_EQ(e.params["padded_cols"], 256);
    const auto l = tp::layout(e.params, shape);
    std::vector<uint8_t> base(256), residual(256);
    tp::row_plane_codes(l, e.views(), 1, base.data(), residual.data());
    for (int64_t c = 130; c < 256; ++c) EXPECT_EQ(base[c] * 4 + residual[c], 5);
    EXPECT_EQ(decode_all(ref(e, shape)).size(), 260u);
  }
}

// GPTQ's column step: the column is re-rounded to the nearest state on the stored grid, in every storage and
// both metadata variants, and nothing else changes.
TEST(TwoPlane, QuantizeColumnRoundsToTheStoredGrid) {
  const Shape shape{4, 140};  // two groups, the second padded
  const auto w = random_weights(4 * 140, 8);
  const int64_t col = 131;
  const std::vector<float> values{0.031f, -0.2f, 0.0f, 0.007f};
  for (const char* storage : {"planes", "quint5", "trit3"})
    for (const char* metadata : {"full", "slim"}) {
      EncodedTensor e = tp::encode(params(storage, metadata), shape, w.data(), {});
      const auto before = decode_all(ref(e, shape));
      std::vector<float> out(4);
      tp::quantize_column(e.params, shape, e, col, values.data(), out.data());
      ASSERT_NO_THROW(validate_tensor(ref(e, shape), "t")) << storage << " " << metadata;
      const auto after = decode_all(ref(e, shape));
      const auto m = tp::expand_metadata(tp::layout(e.params, shape), e.views());
      for (int64_t r = 0; r < 4; ++r) {
        for (int64_t c = 0; c < 140; ++c) {
          if (c != col) {
            ASSERT_EQ(after[r * 140 + c], before[r * 140 + c]) << storage << " " << metadata;
          }
        }
        EXPECT_EQ(after[r * 140 + col], out[r]);
        const size_t g = static_cast<size_t>(r * 2 + 1);
        for (size_t d = 0; d < 5; ++d) {
          const float level = (m.base_scales[g] * tp::kStateBase[d] + m.base_biases[g]) +
                              (m.residual_scales[g] * tp::kStateResidual[d] + m.residual_biases[g]);
          EXPECT_LE(std::fabs(values[r] - out[r]), std::fabs(values[r] - level) * 1.0001f + 1e-9f);
        }
      }
    }
  EncodedTensor e = tp::encode(params("planes", "full"), shape, w.data(), {});
  std::vector<float> out(4);
  expect_errc(Errc::shape, [&] { tp::quantize_column(e.params, shape, e, 140, values.data(), out.data()); });
  const std::vector<float> nan{0.0f, std::numeric_limits<float>::quiet_NaN(), 0.0f, 0.0f};
  expect_errc(Errc::non_finite, [&] { tp::quantize_column(e.params, shape, e, 0, nan.data(), out.data()); });
}

TEST(TwoPlane, RejectsInvalidParams) {
  const Shape shape{2, 128};
  expect_errc(Errc::codec_params, [&] { tp::validate(Params{{"storage", "quint4"}}, shape); });
  expect_errc(Errc::codec_params, [&] { tp::validate(Params{{"metadata", "thin"}}, shape); });
  expect_errc(Errc::codec_params, [&] { tp::validate(Params{{"scale_dtype", "f64"}}, shape); });
  expect_errc(Errc::codec_params, [&] { tp::validate(Params{{"group_size", 64}}, shape); });
  expect_errc(Errc::codec_params, [&] { tp::validate(Params{{"padded_cols", 256}}, shape); });
  expect_errc(Errc::codec_params, [&] { tp::validate(Params{{"bits", 2}}, shape); });
  expect_errc(Errc::codec_params, [&] { tp::validate(Params{{"storage", true}}, shape); });
  expect_errc(Errc::codec_params, [&] { tp::validate(Params::array(), shape); });
  expect_errc(Errc::shape, [&] { tp::validate(Params::object(), {128}); });
  expect_errc(Errc::shape, [&] { tp::validate(Params::object(), {0, 128}); });
  expect_errc(Errc::overflow, [&] { tp::validate(Params::object(), {INT64_MAX / 4, INT64_MAX / 4}); });
  EXPECT_NO_THROW(tp::validate(Params::object(), {1, 1}));
}

TEST(TwoPlane, RejectsReservedCodesAndNonFiniteMetadata) {
  const Shape shape{2, 100};
  const auto w = random_weights(200, 5);
  const auto rejects = [&](const EncodedTensor& e, Errc code) {
    expect_errc(code, [&] { validate_tensor(ref(e, shape), "t"); });
  };
  {
    auto e = tp::encode(params("quint5", "full"), shape, w.data(), {});
    uint8_t* row1 = e.arrays[0].second.as<uint8_t>() + 39;
    row1[0] = 0xF9, row1[1] = 0x02, row1[2] = 0x95;  // 5^10
    rejects(e, Errc::reserved_code);
    e = tp::encode(params("quint5", "full"), shape, w.data(), {});
    row1 = e.arrays[0].second.as<uint8_t>() + 39;
    row1[36] = 0xE0, row1[37] = 0xF5, row1[38] = 0x05;  // 5^8 - 1 in the 8-digit tail: state 2 in padding
    rejects(e, Errc::reserved_code);
    row1[36] = 0xE1, row1[37] = 0xF5, row1[38] = 0x05;  // 5^8: beyond an 8-digit chunk
    rejects(e, Errc::reserved_code);
  }
  {
    auto e = tp::encode(params("trit3", "slim"), shape, w.data(), {});
    e.arrays[0].second.as<uint8_t>()[48] |= 0x05;  // row 1, weight 0: digit 5 (or higher)
    rejects(e, Errc::reserved_code);
  }
  {
    auto e = tp::encode(params("planes", "full"), shape, w.data(), {});
    e.arrays[0].second.as<uint32_t>()[8 + 7] ^= 0x3u;  // row 1, column 112: padding base code changed
    rejects(e, Errc::reserved_code);
  }
  for (const char* metadata : {"full", "slim"})
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      auto e = tp::encode(params("planes", metadata), shape, w.data(), {});
      e.arrays[3].second.as<uint16_t>()[0] = f32_to_bf16(bad);
      rejects(e, Errc::non_finite);
    }
}

TEST(TwoPlane, FoldToAffineIsAValidAffineTensorWithinOneStep) {
  const Shape shape{70, 200};  // more than one 64-row block
  const auto w = random_weights(70 * 200, 8);
  const auto e = tp::encode(params("quint5", "slim", "f32"), shape, w.data(), {});
  const auto two_plane_values = decode_all(ref(e, shape));
  for (int bits : {3, 4, 8}) {
    const auto folded = tp::fold_to_affine(ref(e, shape), bits, {});
    EXPECT_EQ(folded.params["bits"], bits);
    EXPECT_EQ(folded.params["group_size"], 128);
    const TensorRef affine_ref{&codec_or_throw("affine", "test"), folded.params, shape, folded.views()};
    ASSERT_NO_THROW(validate_tensor(affine_ref, "folded"));
    const auto values = decode_all(affine_ref);
    EXPECT_LT(squared_error(values, two_plane_values), squared_error(two_plane_values, w)) << bits << " bits";
    const auto* scales = folded.arrays[1].second.view().as<float>();
    for (int64_t r = 0; r < 70; ++r)
      for (int64_t c = 0; c < 200; ++c) {
        const size_t i = static_cast<size_t>(r * 200 + c);
        // MLX's RTN puts the larger endpoint exactly on the grid; the far one may clamp by up to one step
        ASSERT_LE(std::fabs(values[i] - two_plane_values[i]), std::fabs(scales[r * 2 + c / 128]) * 1.001f)
            << bits << " bits, row " << r;
      }
  }
}

}  // namespace
}  // namespace lowbit::codec
