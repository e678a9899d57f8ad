// Codec::slice, which tensor parallelism cuts shards with: for every codec and example encoding, a slice of rows or
// columns decodes exactly to the same slice of the whole tensor's decoding, or is refused with Errc::shape (a range
// that cuts a group or tile, a rotated axis); the cuts a group-aligned shard plan makes are accepted.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "codec/codec_test_util.h"
#include "lowbit/codec/codec.h"
#include "support/codec_examples.h"

namespace lowbit::codec {
namespace {

using test_util::encoded_ref;
using test_util::expect_errc;

// The decoded values of `ranges` of one axis of a decoded [rows, cols] matrix.
std::vector<float> cut(const std::vector<float>& w, int64_t rows, int64_t cols, Axis axis,
                       const std::vector<Range>& ranges) {
  std::vector<float> out;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = axis == Axis::rows ? r : c;
      for (const Range& g : ranges)
        if (i >= g.begin && i < g.end) out.push_back(w[static_cast<size_t>(r * cols + c)]);
    }
  return out;
}

// Slices t, and returns whether the codec accepted; an accepted slice must decode to the cut of the whole.
bool slices_exactly(const TensorRef& t, Axis axis, const std::vector<Range>& ranges, const std::string& what) {
  const std::vector<float> whole = decode_all(t);
  try {
    const SlicedTensor s = slice_tensor(t, axis, ranges, what);
    const std::vector<float> got = decode_all({t.codec, s.tensor.params, s.shape, s.tensor.views()});
    EXPECT_EQ(got, cut(whole, t.shape[0], t.shape[1], axis, ranges)) << what;
    return true;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::shape) << what << ": " << e.what();
    return false;
  }
}

TEST(Slice, EveryCodecSlicesExactlyOrRefuses) {
  const int64_t rows = 48;
  for (const Codec& codec : all_codecs()) {
    int column_slices = 0;  // accepted ones
    const auto& ex = lowbit::testing::codec_examples().at(std::string(codec.id));
    for (const Params& params : ex.params)
      for (const int64_t cols : ex.widths) {
        const Shape shape{rows, cols};
        const std::vector<float> w = test_util::gaussian_weights(rows * cols, 7, 0.02f);
        const EncodedTensor e = codec.encode(params, shape, w.data(), {});
        const TensorRef t = encoded_ref(codec.id, e, shape);
        const std::string what = std::string(codec.id) + " " + params.dump() + " width " + std::to_string(cols);
        const bool rotated_out = codec.id == "trellis" && params.value("rotate", "input") == "both";
        // whole tile rows, two ranges and the end: every codec but an output-rotated trellis
        EXPECT_EQ(slices_exactly(t, Axis::rows, {{0, 16}, {32, 48}}, what), !rotated_out) << what;
        if (codec.id != "trellis") {
          EXPECT_TRUE(slices_exactly(t, Axis::rows, {{3, 5}, {40, 41}}, what)) << what;
        }
        for (const int64_t unit : {1, 16, 32, 64, 128}) {
          if (unit < cols) column_slices += slices_exactly(t, Axis::cols, {{unit, cols}}, what);
          if (2 * unit < cols) column_slices += slices_exactly(t, Axis::cols, {{0, unit}, {2 * unit, cols}}, what);
        }
      }
    // a group (or tile) aligned cut of a multi-group width passes for every codec
    EXPECT_GT(column_slices, 0) << codec.id;
  }
}

TEST(Slice, GroupAlignedCutsPassAndGroupCutsAreRefused) {
  const Shape shape{8, 200};
  const std::vector<float> w = test_util::gaussian_weights(8 * 200, 3, 0.02f);
  const Codec& affine = codec_or_throw("affine", "test");
  const EncodedTensor e = affine.encode({{"bits", 3}, {"group_size", 32}, {"scale_dtype", "f16"}}, shape, w.data(), {});
  const TensorRef t = encoded_ref("affine", e, shape);
  EXPECT_TRUE(slices_exactly(t, Axis::cols, {{0, 32}, {64, 200}}, "affine"));
  EXPECT_FALSE(slices_exactly(t, Axis::cols, {{0, 16}}, "affine"));
  // the padding goes with the range that ends at the width, never with an earlier one
  EXPECT_FALSE(slices_exactly(t, Axis::cols, {{96, 200}, {0, 32}}, "affine"));
  // 3 bits in groups of 16 are cut in pairs of groups, the 96 bits of three whole words
  const EncodedTensor e16 =
      affine.encode({{"bits", 3}, {"group_size", 16}, {"scale_dtype", "f32"}}, shape, w.data(), {});
  const TensorRef t16 = encoded_ref("affine", e16, shape);
  EXPECT_TRUE(slices_exactly(t16, Axis::cols, {{0, 32}, {64, 200}}, "affine g16"));
  EXPECT_FALSE(slices_exactly(t16, Axis::cols, {{16, 200}}, "affine g16"));
  // rows 4..9 of 8
  expect_errc(Errc::shape, [&] { slice_tensor(t, Axis::rows, std::vector<Range>{{4, 9}}, "affine"); });
  const Codec& trellis = codec_or_throw("trellis", "test");
  const Shape tshape{32, 64};
  const std::vector<float> tw = test_util::gaussian_weights(32 * 64, 5, 0.02f);
  const EncodedTensor te = trellis.encode({{"L", 8}, {"k", 2}, {"code", "1mad"}}, tshape, tw.data(), {});
  const TensorRef tt = encoded_ref("trellis", te, tshape);
  EXPECT_TRUE(slices_exactly(tt, Axis::rows, {{16, 32}}, "trellis"));
  EXPECT_FALSE(slices_exactly(tt, Axis::rows, {{8, 32}}, "trellis"));
  EXPECT_FALSE(slices_exactly(tt, Axis::cols, {{0, 32}}, "trellis rotated input"));
}

}  // namespace
}  // namespace lowbit::codec
