// trellis: codes, bit streams, layout and decoding (the encoder is in trellis_encode.cpp).
#include "lowbit/codec/trellis.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <mutex>

#include "lowbit/codec/hadamard.h"
#include "lowbit/codec/params.h"
#include "lowbit/core/checked.h"
#include "lowbit/core/error.h"
#include "slice_util.h"

namespace lowbit::codec::trellis {

namespace {
constexpr int kMaxTableBits = 16;
constexpr int64_t kMaxDim = int64_t{1} << 31;

bool stream_bit(const uint16_t* words, int j) { return (words[j >> 4] >> (15 - (j & 15))) & 1u; }
}  // namespace

float code_1mad(uint32_t state) {
  const uint32_t x = state * 34038481u + 76625530u;
  const int sum = static_cast<int>((x & 0xFFu) + ((x >> 8) & 0xFFu) + ((x >> 16) & 0xFFu) + (x >> 24));
  return static_cast<float>(sum - 510) / 147.800537109375f;
}

float code_3inst(uint32_t state) {
  const uint32_t x = state * 89226354u + 64248484u;
  const uint32_t r = (x & 0x8FFF8FFFu) ^ 0x3B603B60u;
  // Both halves have exponents within 3 of each other, so the f32 sum is exact; rounding it to f16 gives
  // what an f16 addition would.
  const float sum = f16_to_f32(static_cast<uint16_t>(r >> 16)) + f16_to_f32(static_cast<uint16_t>(r & 0xFFFFu));
  return f16_to_f32(f32_to_f16(sum));
}

float code_value(Code code, uint32_t state) {
  return code == Code::mad1 ? code_1mad(state) : code_3inst(state);
}

const float* code_table(Code code, int L) {
  if (L < 1 || L > kMaxTableBits) fail(Errc::internal, "[trellis] code table for L = {}", L);
  static std::array<std::array<std::once_flag, kMaxTableBits + 1>, 2> once;
  static std::array<std::array<std::vector<float>, kMaxTableBits + 1>, 2> tables;
  const auto c = static_cast<size_t>(code), l = static_cast<size_t>(L);
  std::call_once(once[c][l], [&] {
    std::vector<float>& t = tables[c][l];
    t.resize(size_t{1} << L);
    for (uint32_t s = 0; s < t.size(); ++s) t[s] = code_value(code, s);
  });
  return tables[c][l].data();
}

double code_std(Code code) {
  const float* t = code_table(code, kMaxTableBits);
  double sum2 = 0.0;
  for (size_t s = 0; s < (size_t{1} << kMaxTableBits); ++s) sum2 += double{t[s]} * t[s];
  return std::sqrt(sum2 / static_cast<double>(size_t{1} << kMaxTableBits));
}

uint32_t state_at(const uint16_t* words, int T, int k, int L, int t) {
  const int nbits = T * k;
  const int start = (((t + 1) * k - L) % nbits + nbits) % nbits;
  uint32_t s = 0;
  for (int i = 0; i < L; ++i) s = (s << 1) | stream_bit(words, (start + i) % nbits);
  return s;
}

void decode_block(const uint16_t* words, int T, int k, int L, const float* table, float* out) {
  // The stream as big-endian bytes behind a copy of its last 32 bits (circularly) and 4 bytes of slack, so
  // that state t, the window ending at stream bit (t + 1) k, is one 32-bit load: every step is independent.
  constexpr int kMaxBytes = kBlock * 4 / 8;
  const int nbytes = T * k / 8;
  if (nbytes > kMaxBytes) fail(Errc::internal, "[trellis] decode_block of {} bits", T * k);
  uint8_t ext[4 + kMaxBytes + 4] = {};
  for (int i = 0; i < nbytes; ++i) ext[4 + i] = static_cast<uint8_t>(words[i / 2] >> (i % 2 == 0 ? 8 : 0));
  for (int i = 0; i < 4; ++i) ext[i] = ext[4 + ((nbytes - 4 + i) % nbytes + nbytes) % nbytes];
  const uint32_t mask = (1u << L) - 1u;
  for (int t = 0; t < T; ++t) {
    const int q = (t + 1) * k - L + 32;  // first bit of the window in ext
    uint32_t v;
    std::memcpy(&v, ext + (q >> 3), 4);
    v = __builtin_bswap32(v);
    out[t] = table[(v >> (32 - L - (q & 7))) & mask];
  }
}

void pack_states(const uint32_t* states, int T, int k, uint16_t* words) {
  std::memset(words, 0, sizeof(uint16_t) * static_cast<size_t>(T * k / 16));
  for (int t = 0; t < T; ++t)
    for (int b = 0; b < k; ++b)
      if ((states[t] >> (k - 1 - b)) & 1u) {
        const int j = t * k + b;
        words[j >> 4] = static_cast<uint16_t>(words[j >> 4] | (1u << (15 - (j & 15))));
      }
}

namespace {

int64_t padded_dim(ParamReader& r, std::string_view key, int64_t dim, bool rotated) {
  const int64_t expected = rotated ? hadamard::padded_size(dim, kTileDim) : round_up(dim, kTileDim);
  const int64_t got = r.integer_in_or(key, expected, 0, kMaxDim * 2);
  if (got != expected)
    fail(Errc::codec_params, "[trellis] param '{}' = {} but {} pads to {}", key, got, dim, expected);
  return expected;
}

uint64_t seed_param(ParamReader& r, const Params& params, std::string_view key, bool rotated) {
  if (!rotated) {
    if (params.contains(std::string(key)))
      fail(Errc::codec_params, "[trellis] param '{}' given for a side that is not rotated", key);
    return 0;
  }
  return static_cast<uint64_t>(r.integer_in_or(key, 0, 0, INT64_MAX));
}

}  // namespace

Layout parse_layout(const Params& params, const Shape& shape) {
  ParamReader r(params, "trellis");
  Layout lay;
  lay.L = static_cast<int>(r.integer_in("L", 8, 16));
  lay.k = static_cast<int>(r.integer_in("k", 1, 4));
  lay.code = r.choice("code", {"1mad", "3inst"}) == "1mad" ? Code::mad1 : Code::inst3;
  lay.per_row_scale = r.choice_or("scale", "row", {"row", "tensor"}) == "row";
  const std::string rotate = r.choice_or("rotate", "input", {"none", "input", "both"});
  lay.rotate_input = rotate != "none";
  lay.rotate_output = rotate == "both";
  lay.input_seed = seed_param(r, params, "input_seed", lay.rotate_input);
  lay.output_seed = seed_param(r, params, "output_seed", lay.rotate_output);
  if (shape.size() != 2) fail(Errc::shape, "[trellis] needs a rank-2 shape, got {}", shape_str(shape));
  lay.rows = shape[0];
  lay.cols = shape[1];
  if (lay.rows < 1 || lay.cols < 1 || lay.rows > kMaxDim || lay.cols > kMaxDim)
    fail(Errc::limit, "[trellis] shape {} outside [1, 2^31] per dimension", shape_str(shape));
  lay.padded_rows = padded_dim(r, "padded_rows", lay.rows, lay.rotate_output);
  lay.padded_cols = padded_dim(r, "padded_cols", lay.cols, lay.rotate_input);
  r.finish();
  checked_mul(static_cast<uint64_t>(lay.padded_rows), static_cast<uint64_t>(lay.padded_cols), "[trellis] shape");
  return lay;
}

void validate(const Params& params, const Shape& shape) { parse_layout(params, shape); }

std::vector<ArraySpec> arrays(const Params& params, const Shape& shape) {
  const Layout lay = parse_layout(params, shape);
  return {{"codes", DType::U16, {lay.row_tiles(), lay.col_tiles(), lay.words_per_tile()}},
          {"scales", DType::F16, {lay.per_row_scale ? lay.padded_rows : 1}}};
}

void check_content(const Params& params, const Shape& shape, const ArrayViews& arrays) {
  const Layout lay = parse_layout(params, shape);
  const TensorView& scales = arrays.at("scales");
  const int64_t n = lay.per_row_scale ? lay.padded_rows : 1;
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(load_float(DType::F16, scales.bytes.data(), static_cast<size_t>(i))))
      fail(Errc::non_finite, "[trellis] scale {} is not finite", i);
}

namespace {

float row_scale(const Layout& lay, const TensorView& scales, int64_t row) {
  return load_float(DType::F16, scales.bytes.data(), static_cast<size_t>(lay.per_row_scale ? row : 0));
}

}  // namespace

void decode_tile(const Layout& lay, const ArrayViews& arrays, int64_t tile_row, int64_t tile_col, float* out) {
  const TensorView& codes = arrays.at("codes");
  const TensorView& scales = arrays.at("scales");
  const int wpt = lay.words_per_tile();
  uint16_t words[kBlock * 4 / 16];
  std::memcpy(words, codes.bytes.data() + ((tile_row * lay.col_tiles() + tile_col) * wpt) * 2,
              static_cast<size_t>(wpt) * 2);
  decode_block(words, kBlock, lay.k, lay.L, code_table(lay.code, lay.L), out);
  for (int r = 0; r < kTileDim; ++r) {
    const float s = row_scale(lay, scales, tile_row * kTileDim + r);
    for (int c = 0; c < kTileDim; ++c) out[r * kTileDim + c] *= s;
  }
}

void decode_tile_row(const Layout& lay, const ArrayViews& arrays, int64_t tile_row, float* out) {
  float tile[kBlock];
  for (int64_t ct = 0; ct < lay.col_tiles(); ++ct) {
    decode_tile(lay, arrays, tile_row, ct, tile);
    for (int r = 0; r < kTileDim; ++r)
      std::memcpy(out + r * lay.padded_cols + ct * kTileDim, tile + r * kTileDim, sizeof(float) * kTileDim);
  }
}

namespace {

// Rows [row_begin, row_end) of R_out^T W' (padded width) into out, one 16-column strip of W' at a time.
void unrotate_output_rows(const Layout& lay, const ArrayViews& arrays, int64_t row_begin, int64_t row_end,
                          float* out) {
  const hadamard::RandomizedHadamard r_out(lay.padded_rows, lay.output_seed);
  std::vector<float> strip(static_cast<size_t>(lay.padded_rows * kTileDim));  // [padded_rows, 16]
  std::vector<float> column(static_cast<size_t>(lay.padded_rows));
  float tile[kBlock];
  for (int64_t ct = 0; ct < lay.col_tiles(); ++ct) {
    for (int64_t tr = 0; tr < lay.row_tiles(); ++tr) {
      decode_tile(lay, arrays, tr, ct, tile);
      std::memcpy(strip.data() + tr * kBlock, tile, sizeof tile);
    }
    for (int c = 0; c < kTileDim; ++c) {
      for (int64_t r = 0; r < lay.padded_rows; ++r) column[r] = strip[r * kTileDim + c];
      r_out.inverse(column.data());
      for (int64_t r = row_begin; r < row_end; ++r)
        out[(r - row_begin) * lay.padded_cols + ct * kTileDim + c] = column[r];
    }
  }
}

}  // namespace

void decode_rows(const Params& params, const Shape& shape, const ArrayViews& arrays, int64_t row_begin,
                 int64_t row_end, float* out) {
  const Layout lay = parse_layout(params, shape);
  if (row_begin < 0 || row_end > lay.rows || row_begin > row_end)
    fail(Errc::internal, "[trellis] decode_rows [{}, {}) outside [0, {})", row_begin, row_end, lay.rows);
  std::unique_ptr<hadamard::RandomizedHadamard> r_in;
  if (lay.rotate_input) r_in = std::make_unique<hadamard::RandomizedHadamard>(lay.padded_cols, lay.input_seed);
  std::vector<float> v(static_cast<size_t>(lay.padded_cols));
  const auto emit = [&](const float* padded_row, int64_t row) {
    std::copy_n(padded_row, lay.padded_cols, v.begin());
    if (r_in) r_in->inverse(v.data());
    std::memcpy(out + (row - row_begin) * lay.cols, v.data(), sizeof(float) * static_cast<size_t>(lay.cols));
  };
  if (lay.rotate_output) {
    std::vector<float> rows(static_cast<size_t>((row_end - row_begin) * lay.padded_cols));
    unrotate_output_rows(lay, arrays, row_begin, row_end, rows.data());
    for (int64_t r = row_begin; r < row_end; ++r) emit(rows.data() + (r - row_begin) * lay.padded_cols, r);
    return;
  }
  std::vector<float> tile_row(static_cast<size_t>(kTileDim * lay.padded_cols));
  for (int64_t tr = row_begin / kTileDim; tr * kTileDim < row_end; ++tr) {
    decode_tile_row(lay, arrays, tr, tile_row.data());
    for (int64_t r = std::max(row_begin, tr * kTileDim); r < std::min(row_end, (tr + 1) * kTileDim); ++r)
      emit(tile_row.data() + (r - tr * kTileDim) * lay.padded_cols, r);
  }
}

// Whole tiles only, and never along a rotated axis (its Hadamard transform mixes all of it).
EncodedTensor slice(const Params& params, const Shape& shape, const ArrayViews& arrays, Axis axis,
                    std::span<const Range> ranges) {
  const Layout lay = parse_layout(params, shape);
  const bool rows = axis == Axis::rows;
  if (rows ? lay.rotate_output : lay.rotate_input)
    fail(Errc::shape, "[trellis] the {} side is Hadamard-rotated as a whole: its {} cannot be sliced",
         rows ? "output" : "input", rows ? "rows" : "columns");
  const std::vector<Range> tiles =
      unit_ranges(ranges, rows ? lay.rows : lay.cols, rows ? lay.padded_rows : lay.padded_cols, kTileDim, "trellis",
                  rows ? "tile row" : "tile column");
  EncodedTensor out;
  out.params = with_param(params, rows ? "padded_rows" : "padded_cols", total(tiles) * kTileDim);
  out.arrays.emplace_back("codes", slice_axis(arrays.at("codes"), rows ? 0 : 1, tiles));
  const TensorView& scales = arrays.at("scales");
  const Range whole{0, scales.shape[0]};
  const std::vector<Range> scale_rows = rows && lay.per_row_scale ? scaled(tiles, kTileDim) : std::vector<Range>{whole};
  out.arrays.emplace_back("scales", slice_axis(scales, 0, scale_rows));
  return out;
}

}  // namespace lowbit::codec::trellis
