// Highway re-includes this file once per target (foreach_target.h), as simd.cpp does: the code-to-weight decode
// is vectorized (a vector of consecutive states at once: each half of the vector shifts its lanes' windows out of
// one 64-bit piece of the stream, then computes their code values: no gather, no table).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "trellis_kernels.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "lowbit/codec/trellis.h"

#ifndef LOWBIT_TRELLIS_TILE_WORDS  // once, not per target
#define LOWBIT_TRELLIS_TILE_WORDS
namespace lowbit::kernels::trellis_simd {
// One tile's stream as the vector decode reads it: one word of circular prefix (its last word: a state's window
// reaches back at most L - k < 16 bits before the stream's start), the tile's words, four zero words of slack
// (the last 64-bit piece starts at most 3 words before the end).
struct TileWords {
  static constexpr int kMaxWords = codec::trellis::kBlock * 4 / 16;
  uint16_t w[1 + kMaxWords + 4];
  void load(const std::byte* codes, size_t words) {
    std::memcpy(w + 1, codes, words * 2);
    w[0] = w[words];
    std::fill(w + words + 1, w + words + 5, uint16_t{0});
  }
  // The 64 stream bits from TileWords bit b on, earliest bit most significant (at least 49 valid).
  uint64_t bits_from(uint32_t b) const {
    uint64_t v;
    std::memcpy(&v, w + (b >> 4), 8);  // words w0 | w1 << 16 | w2 << 32 | w3 << 48 (little endian)
    v = (v >> 32) | (v << 32);
    v = ((v >> 16) & 0x0000FFFF0000FFFFull) | ((v & 0x0000FFFF0000FFFFull) << 16);  // w0 << 48 | .. | w3
    return v << (b & 15);
  }
};
}  // namespace lowbit::kernels::trellis_simd
#endif

HWY_BEFORE_NAMESPACE();
namespace lowbit::kernels::trellis_simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using DU = hn::ScalableTag<uint32_t>;
using DI = hn::ScalableTag<int32_t>;
constexpr int kTileDim = codec::trellis::kTileDim;

// Code values of states t0 .. t0 + Lanes - 1 of a tile: state t is the L-bit window ending at stream bit
// (t + 1) k, i.e. starting at bit (t + 1) k - L, which is bit (t + 1) k - L + 16 of TileWords (after the prefix
// word). Each half of the lanes takes its windows from one 64-bit piece starting at its first state's window:
// lane j of a half is that piece shifted right by 64 - L - j k (j k + L <= 7 * 4 + 16 + 15 < 64 for the 8 lanes of
// the widest vector), the halves are joined by keeping the low 32 bits of each 64-bit lane.
struct GroupDecoder {
  using D64 = hn::Repartition<uint64_t, DU>;
  DU du;
  DI di;
  DF df;
  D64 d64;
  hn::Vec<D64> shifts;  // lane j of a half: 64 - L - j k
  hn::Vec<DU> mask;
  uint32_t k, first;
  codec::trellis::Code code;
  GroupDecoder(int k_bits, int L, codec::trellis::Code c)
      : shifts(Shifts(d64, k_bits, L)),
        mask(hn::Set(du, (1u << L) - 1u)),
        k(static_cast<uint32_t>(k_bits)),
        first(static_cast<uint32_t>(k_bits - L + 16)),
        code(c) {}

  static hn::Vec<D64> Shifts(D64 d, int k, int L) {
    uint64_t s[HWY_MAX_BYTES / 8];
    for (size_t j = 0; j < hn::Lanes(d); ++j) s[j] = static_cast<uint64_t>(64 - L - static_cast<int>(j) * k);
    return hn::LoadU(d, s);
  }

  HWY_INLINE hn::Vec<DF> operator()(const TileWords& tw, uint32_t t0) const {
    const uint32_t b = t0 * k + first, half = static_cast<uint32_t>(hn::Lanes(d64));
    const auto lo = hn::Shr(hn::Set(d64, tw.bits_from(b)), shifts);
#if HWY_TARGET == HWY_SCALAR
    // One lane (builds without -march, e.g. debug): the state is the low half of lo's one lane.
    (void)half;
    const auto state = hn::And(hn::Set(du, static_cast<uint32_t>(hn::GetLane(lo))), mask);
#else
    const auto hi = hn::Shr(hn::Set(d64, tw.bits_from(b + half * k)), shifts);
    const auto state = hn::And(hn::ConcatEven(du, hn::BitCast(du, hi), hn::BitCast(du, lo)), mask);
#endif
    return code == codec::trellis::Code::inst3 ? Code3Inst(state) : Code1Mad(state);
  }

  // codec::trellis::code_1mad in lanes: the byte sum of an LCG step, centred and scaled (the same division).
  HWY_INLINE hn::Vec<DF> Code1Mad(hn::Vec<DU> s) const {
    const auto x = hn::Add(hn::Mul(s, hn::Set(du, 34038481u)), hn::Set(du, 76625530u));
    const auto bytes = hn::Set(du, 0x00FF00FFu);
    const auto pairs = hn::Add(hn::And(x, bytes), hn::And(hn::ShiftRight<8>(x), bytes));
    const auto sum = hn::Add(hn::And(pairs, hn::Set(du, 0xFFFFu)), hn::ShiftRight<16>(pairs));
    return hn::Div(hn::ConvertTo(df, hn::Sub(hn::BitCast(di, sum), hn::Set(di, 510))), hn::Set(df, 147.800537109375f));
  }

  // codec::trellis::code_3inst in lanes: the two f16 halves of a masked LCG step, summed and rounded to f16. The
  // mask leaves each half's exponent field 0b011xx (12..15), so both are normal and widen to f32 by moving their
  // bits; their sum is exact in f32 and is 0 or at least 2^-13 in magnitude (their ulps are at least 2^-13), an
  // f16 normal, so rounding it to f16 is rounding its mantissa to 10 bits, to nearest even.
  HWY_INLINE hn::Vec<DF> Code3Inst(hn::Vec<DU> s) const {
    const auto x = hn::Add(hn::Mul(s, hn::Set(du, 89226354u)), hn::Set(du, 64248484u));
    const auto r = hn::Xor(hn::And(x, hn::Set(du, 0x8FFF8FFFu)), hn::Set(du, 0x3B603B60u));
    const auto widen = [&](hn::Vec<DU> h) {  // h: f16 bits in the low half
      const auto sign = hn::ShiftLeft<16>(hn::And(h, hn::Set(du, 0x8000u)));
      const auto rest = hn::Add(hn::ShiftLeft<13>(hn::And(h, hn::Set(du, 0x7FFFu))), hn::Set(du, 112u << 23));
      return hn::BitCast(df, hn::Or(sign, rest));
    };
    const auto sum = hn::BitCast(du, hn::Add(widen(hn::And(r, hn::Set(du, 0xFFFFu))), widen(hn::ShiftRight<16>(r))));
    const auto even = hn::And(hn::ShiftRight<13>(sum), hn::Set(du, 1u));
    return hn::BitCast(df, hn::And(hn::Add(sum, hn::Add(hn::Set(du, 0xFFFu), even)), hn::Set(du, 0xFFFFE000u)));
  }
};

// out [16, 16] (row-major) = the tile's code values, row r times scales[r].
void DecodeTile(const std::byte* codes, int k, int L, codec::trellis::Code code, const float* scales, float* out) {
  const GroupDecoder dec(k, L, code);
  const DF df;
  const size_t N = hn::Lanes(df);
  TileWords tw;
  tw.load(codes, static_cast<size_t>(codec::trellis::kBlock * k / 16));
  for (int r = 0; r < kTileDim; ++r) {
    const auto s = hn::Set(df, scales[r]);
    for (size_t c = 0; c < kTileDim; c += N)
      hn::StoreU(hn::Mul(dec(tw, static_cast<uint32_t>(r * kTileDim + c)), s), df, out + r * kTileDim + c);
  }
}

// y [16 (tr1 - tr0)] = W' rows of tile rows [tr0, tr1) @ x (padded_cols), decoding straight into the dot
// products: the one-row path, where scratch would cost as much as the arithmetic.
void MatvecTileRows(const std::byte* codes, size_t col_tiles, int k, int L, codec::trellis::Code code,
                    const float* scales, const float* x, size_t tr0, size_t tr1, float* y) {
  const GroupDecoder dec(k, L, code);
  const DF df;
  const size_t N = hn::Lanes(df);
  const size_t words = static_cast<size_t>(codec::trellis::kBlock * k / 16);
  // The tile row's streams are copied once; then each row runs over all of them with one accumulator, so that
  // nothing spills from registers.
  std::vector<TileWords> tws(col_tiles);
  for (size_t tr = tr0; tr < tr1; ++tr) {
    for (size_t ct = 0; ct < col_tiles; ++ct) tws[ct].load(codes + (tr * col_tiles + ct) * words * 2, words);
    for (int r = 0; r < kTileDim; ++r) {
      auto acc = hn::Zero(df);
      for (size_t ct = 0; ct < col_tiles; ++ct)
        for (size_t c = 0; c < kTileDim; c += N)
          acc = hn::MulAdd(dec(tws[ct], static_cast<uint32_t>(r * kTileDim + c)), hn::LoadU(df, x + ct * kTileDim + c),
                           acc);
      y[(tr - tr0) * kTileDim + r] = hn::GetLane(hn::SumOfLanes(df, acc)) * scales[tr * kTileDim + r];
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace lowbit::kernels::trellis_simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <optional>
#include <vector>

#include "lowbit/codec/hadamard.h"
#include "lowbit/core/thread_pool.h"
#include "simd.h"
#include "trellis_avx512.h"
#include "trellis_kernels.h"

namespace lowbit::kernels {

namespace trellis_simd {
HWY_EXPORT(DecodeTile);
HWY_EXPORT(MatvecTileRows);
}  // namespace trellis_simd

namespace {

namespace tr = codec::trellis;

class TrellisLinear final : public CpuLinear {
 public:
  explicit TrellisLinear(const codec::TensorRef& t)
      : tensor_(t), layout_(tr::parse_layout(t.params, t.shape)), avx512_(trellis_avx512::usable(layout_.code)) {
    if (layout_.rotate_input) r_in_.emplace(layout_.padded_cols, layout_.input_seed);
    if (layout_.rotate_output) r_out_.emplace(layout_.padded_rows, layout_.output_seed);
    codes_ = t.arrays.at("codes").bytes.data();
    const TensorView& scales = t.arrays.at("scales");
    scales_.resize(static_cast<size_t>(layout_.padded_rows));
    for (int64_t r = 0; r < layout_.padded_rows; ++r)
      scales_[r] = load_float(DType::F16, scales.bytes.data(), static_cast<size_t>(layout_.per_row_scale ? r : 0));
  }
  int64_t rows() const override { return layout_.rows; }
  int64_t cols() const override { return layout_.cols; }
  uint64_t weight_bytes() const override {
    return tensor_.arrays.at("codes").bytes.size() + tensor_.arrays.at("scales").bytes.size();
  }

  // y [m, rows] = x [m, cols] @ W^T = R_out^T (W' (R_in x)).
  void matmul(const float* x, int64_t m, float* y, ThreadPool& pool) const override {
    const size_t pc = static_cast<size_t>(layout_.padded_cols), pr = static_cast<size_t>(layout_.padded_rows);
    std::vector<float> xr(static_cast<size_t>(m) * pc, 0.0f);  // x' [m, padded_cols]
    for (int64_t i = 0; i < m; ++i) {
      std::copy_n(x + i * layout_.cols, layout_.cols, xr.data() + i * pc);
      if (r_in_) r_in_->forward(xr.data() + i * pc);
    }
    std::vector<float> yr(static_cast<size_t>(m) * pr);  // y' [m, padded_rows]
    if (m == 1) {
      const auto col_tiles = static_cast<size_t>(layout_.col_tiles());
      pool.parallel_for(static_cast<size_t>(layout_.row_tiles()), 1, [&](size_t t0, size_t t1) {
        float* out = yr.data() + t0 * tr::kTileDim;
        if (avx512_)
          trellis_avx512::matvec_tile_rows(codes_, col_tiles, layout_.k, layout_.L, scales_.data(), xr.data(), t0, t1,
                                           out);
        else
          HWY_DYNAMIC_DISPATCH(trellis_simd::MatvecTileRows)
        (codes_, col_tiles, layout_.k, layout_.L, layout_.code, scales_.data(), xr.data(), t0, t1, out);
      });
    } else {
      const size_t k_chunk = std::min<size_t>(pc, 1024);
      simd::tiled_matmul(
          pr, pc, k_chunk,
          [&](size_t r0, size_t, size_t k0, size_t k1, float* out, size_t stride) { decode(r0, k0, k1, out, stride); },
          xr.data(), pc, static_cast<size_t>(m), yr.data(), pr, pool);
    }
    for (int64_t i = 0; i < m; ++i) {
      if (r_out_) r_out_->inverse(yr.data() + i * pr);
      std::copy_n(yr.data() + i * pr, layout_.rows, y + i * layout_.rows);
    }
  }

  void gather_rows(std::span<const int32_t> ids, float* out) const override {
    check_gather_ids(ids, layout_.rows);
    for (size_t i = 0; i < ids.size(); ++i)
      tr::decode_rows(tensor_.params, tensor_.shape, tensor_.arrays, ids[i], ids[i] + 1,
                      out + static_cast<int64_t>(i) * layout_.cols);
  }

 private:
  // Rows [r0, r0 + 16) x columns [k0, k1) of W' (tile-aligned) into out (row stride `stride`): the code values
  // of codec::trellis::decode_tile times the row scales, converted once.
  void decode(size_t r0, size_t k0, size_t k1, float* out, size_t stride) const {
    const size_t wpt = static_cast<size_t>(layout_.words_per_tile());
    const size_t tile_row = r0 / tr::kTileDim;
    const std::byte* codes =
        codes_ + (tile_row * static_cast<size_t>(layout_.col_tiles()) + k0 / tr::kTileDim) * wpt * 2;
    if (avx512_) {
      trellis_avx512::decode_tiles(codes, (k1 - k0) / tr::kTileDim, layout_.k, layout_.L, scales_.data() + r0, out,
                                   stride);
      return;
    }
    float tile[tr::kBlock];
    for (size_t c0 = k0; c0 < k1; c0 += tr::kTileDim) {
      HWY_DYNAMIC_DISPATCH(trellis_simd::DecodeTile)
      (codes + (c0 - k0) / tr::kTileDim * wpt * 2, layout_.k, layout_.L, layout_.code, scales_.data() + r0, tile);
      for (int r = 0; r < tr::kTileDim; ++r)
        std::copy_n(tile + r * tr::kTileDim, tr::kTileDim, out + r * stride + (c0 - k0));
    }
  }

  codec::TensorRef tensor_;
  tr::Layout layout_;
  bool avx512_;  // trellis_avx512.h's path, chosen once (hwy::SupportedTargets is not cheap)
  std::optional<codec::hadamard::RandomizedHadamard> r_in_, r_out_;
  const std::byte* codes_ = nullptr;  // [row_tiles, col_tiles, 16 k] U16, possibly unaligned
  std::vector<float> scales_;         // per padded row
};

}  // namespace

std::unique_ptr<CpuLinear> prepare_trellis(const codec::TensorRef& tensor) {
  return std::make_unique<TrellisLinear>(tensor);
}

}  // namespace lowbit::kernels
#endif  // HWY_ONCE
