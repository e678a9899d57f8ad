// docs/CODECS.md "trellis" states the stream, states and 3INST; the comments below derive the lane layout.
#include "trellis_avx512.h"

#include <array>
#include <cstdint>
#include <cstring>

#include <hwy/targets.h>

// GCC only: clang 14's immintrin.h declares the FP16 types only when the whole file targets AVX512-FP16 (the
// fuzz build and clang-tidy, which use clang, take the portable path).
#if defined(__x86_64__) && !defined(__clang__)
#include <immintrin.h>

// GCC 12's unmasked AVX-512 intrinsics start from _mm512_undefined_*() (a self-initialised variable), which its
// -Wuninitialized reports once they are inlined here; nothing in this file reads an uninitialised value.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace lowbit::kernels::trellis_avx512 {

namespace {

namespace tr = codec::trellis;

#define LOWBIT_AVX512FP16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi,avx512fp16")))

constexpr int kStates = 32;  // per decode step: 8 qword lanes x 4 windows of 16 bits
constexpr int kSteps = tr::kBlock / kStates;

// The tile's stream read with its last word in front (a state's window reaches back at most L - k < 16 bits
// before the stream): let bit 0 be that word's MSB; state t's 16-bit window (its L bits are the low ones) is bits
// [(t + 1) k, (t + 1) k + 16), MSB first. Step g decodes states 32 g + 4 q + i (q < 8 qword lanes, i < 4
// windows) from the 64 bytes at byte 4 g k, whose stream bytes are sb[j] = byte j ^ 1 (MSB-first bits in
// little-endian words). Only step 0 reaches into the front word; the loads stop at the stream's end (masked,
// so nothing past the tile is read). Lane q is built (vpermb) from stream bytes B_q .. B_q + 7 with
// B_q = 4 g k + (4 q + 1) k / 8, sb[B_q] its most significant byte, so stream bit P sits at qword bit
// 63 - (P - 8 B_q) and window i ends (its LSB) at qword bit 48 - r with r = (4 q + 1) k % 8 + i k <= 19:
// vpmultishiftqb takes the bytes at 48 - r and 56 - r into 16-bit lane 4 q + i.
struct Windows {
  __m512i permute, shifts;
  LOWBIT_AVX512FP16 explicit Windows(int k) {
    struct Bytes {
      alignas(64) uint8_t permute[64], shifts[64];
    };
    static const std::array<Bytes, 5> per_k = [] {  // index k
      std::array<Bytes, 5> t{};
      for (int k = 1; k <= 4; ++k)
        for (int q = 0; q < 8; ++q) {
          const int first = (4 * q + 1) * k;
          for (int b = 0; b < 8; ++b) t[k].permute[8 * q + b] = static_cast<uint8_t>((first / 8 + 7 - b) ^ 1);
          for (int i = 0; i < 4; ++i) {
            const int r = first % 8 + i * k;
            t[k].shifts[8 * q + 2 * i] = static_cast<uint8_t>(48 - r);
            t[k].shifts[8 * q + 2 * i + 1] = static_cast<uint8_t>(56 - r);
          }
        }
      return t;
    }();
    permute = _mm512_load_si512(per_k[k].permute);
    shifts = _mm512_load_si512(per_k[k].shifts);
  }
};

// codec::trellis::code_3inst of 32 states in 16-bit lanes: x = s * 89226354 + 64248484 (mod 2^32) as its low and
// high halves (the carry of the low half's sum where it wrapped below 64248484's low half), masked, and the two
// halves added as f16, which rounds the exact sum to f16 as the code states.
struct Code3Inst {
  static constexpr uint32_t kMul = 89226354u, kAdd = 64248484u;
  __m512i state_mask, mul_lo, mul_hi, add_lo, add_hi, one, keep, flip;
  LOWBIT_AVX512FP16 explicit Code3Inst(int L)
      : state_mask(_mm512_set1_epi16(static_cast<int16_t>((1u << L) - 1u))),
        mul_lo(_mm512_set1_epi16(static_cast<int16_t>(kMul & 0xFFFFu))),
        mul_hi(_mm512_set1_epi16(static_cast<int16_t>(kMul >> 16))),
        add_lo(_mm512_set1_epi16(static_cast<int16_t>(kAdd & 0xFFFFu))),
        add_hi(_mm512_set1_epi16(static_cast<int16_t>(kAdd >> 16))),
        one(_mm512_set1_epi16(1)),
        keep(_mm512_set1_epi16(static_cast<int16_t>(0x8FFF))),
        flip(_mm512_set1_epi16(0x3B60)) {}
};

struct Decoder {
  Windows windows;
  Code3Inst code;
  int k;
  int stream_bytes;                     // 32 k
  std::array<__mmask64, kSteps> valid;  // per step: the loaded bytes that lie in [front word, stream end)
  LOWBIT_AVX512FP16 Decoder(int k_bits, int L) : windows(k_bits), code(L), k(k_bits), stream_bytes(32 * k_bits) {
    for (int step = 0; step < kSteps; ++step) {
      const int end = 2 + stream_bytes - 4 * step * k;  // bytes of the front word and the stream from this load on
      valid[static_cast<size_t>(step)] = end >= 64 ? ~__mmask64{0} : (__mmask64{1} << end) - 1;
    }
  }

  // The code values of states 32 step .. 32 step + 31 of the tile at `codes` as f16 lanes.
  LOWBIT_AVX512FP16 inline __m512h operator()(const std::byte* codes, int step) const {
    __m512i bytes;
    if (step == 0) {
      uint16_t last;
      std::memcpy(&last, codes + stream_bytes - 2, 2);
      bytes = _mm512_mask_set1_epi16(_mm512_maskz_loadu_epi8(valid[0] & ~__mmask64{3}, codes - 2), 1,
                                     static_cast<int16_t>(last));
    } else {
      bytes = _mm512_maskz_loadu_epi8(valid[static_cast<size_t>(step)], codes + 4 * step * k - 2);
    }
    const __m512i lanes = _mm512_permutexvar_epi8(windows.permute, bytes);
    const __m512i s = _mm512_and_si512(_mm512_multishift_epi64_epi8(windows.shifts, lanes), code.state_mask);
    const __m512i lo = _mm512_add_epi16(_mm512_mullo_epi16(s, code.mul_lo), code.add_lo);
    const __m512i hi = _mm512_add_epi16(_mm512_add_epi16(_mm512_mulhi_epu16(s, code.mul_lo), code.add_hi),
                                        _mm512_mullo_epi16(s, code.mul_hi));
    const __m512i hi_carried = _mm512_mask_add_epi16(hi, _mm512_cmplt_epu16_mask(lo, code.add_lo), hi, code.one);
    const __m512i r_lo = _mm512_xor_si512(_mm512_and_si512(lo, code.keep), code.flip);
    const __m512i r_hi = _mm512_xor_si512(_mm512_and_si512(hi_carried, code.keep), code.flip);
    return _mm512_add_ph(_mm512_castsi512_ph(r_hi), _mm512_castsi512_ph(r_lo));
  }
};

// The low and high 16 f16 lanes as f32: tile rows 2 step and 2 step + 1.
LOWBIT_AVX512FP16 inline __m512 low_row(__m512h v) { return _mm512_cvtxph_ps(_mm512_castph512_ph256(v)); }
LOWBIT_AVX512FP16 inline __m512 high_row(__m512h v) {
  return _mm512_cvtxph_ps(_mm256_castsi256_ph(_mm512_extracti64x4_epi64(_mm512_castph_si512(v), 1)));
}

LOWBIT_AVX512FP16 void decode_tiles_avx512(const std::byte* codes, size_t tiles, int k, int L, const float* scales,
                                           float* out, size_t stride) {
  const Decoder decode(k, L);
  for (size_t tile = 0; tile < tiles; ++tile) {
    const std::byte* tile_codes = codes + tile * static_cast<size_t>(decode.stream_bytes);
    float* o = out + tile * tr::kTileDim;
    for (int step = 0; step < kSteps; ++step) {
      const __m512h v = decode(tile_codes, step);
      const size_t r = 2 * static_cast<size_t>(step);
      _mm512_storeu_ps(o + r * stride, _mm512_mul_ps(low_row(v), _mm512_set1_ps(scales[r])));
      _mm512_storeu_ps(o + (r + 1) * stride, _mm512_mul_ps(high_row(v), _mm512_set1_ps(scales[r + 1])));
    }
  }
}

LOWBIT_AVX512FP16 void matvec_tile_rows_avx512(const std::byte* codes, size_t col_tiles, int k, int L,
                                               const float* scales, const float* x, size_t tr0, size_t tr1, float* y) {
  const Decoder decode(k, L);
  const auto tile_bytes = static_cast<size_t>(decode.stream_bytes);
  for (size_t t = tr0; t < tr1; ++t) {
    const std::byte* row_codes = codes + t * col_tiles * tile_bytes;
    // Each pair of rows runs over the whole tile row with two accumulators.
    for (int step = 0; step < kSteps; ++step) {
      __m512 even = _mm512_setzero_ps(), odd = _mm512_setzero_ps();
      for (size_t ct = 0; ct < col_tiles; ++ct) {
        const __m512h v = decode(row_codes + ct * tile_bytes, step);
        const __m512 xv = _mm512_loadu_ps(x + ct * tr::kTileDim);
        even = _mm512_fmadd_ps(low_row(v), xv, even);
        odd = _mm512_fmadd_ps(high_row(v), xv, odd);
      }
      const size_t r = (t - tr0) * tr::kTileDim + 2 * static_cast<size_t>(step);
      y[r] = _mm512_reduce_add_ps(even) * scales[t * tr::kTileDim + 2 * step];
      y[r + 1] = _mm512_reduce_add_ps(odd) * scales[t * tr::kTileDim + 2 * step + 1];
    }
  }
}

}  // namespace

bool usable(codec::trellis::Code code) {
  static const bool cpu = __builtin_cpu_supports("avx512fp16") && __builtin_cpu_supports("avx512vbmi") &&
                          __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  return cpu && code == codec::trellis::Code::inst3 && (hwy::SupportedTargets() & HWY_AVX3_DL) != 0;
}

void decode_tiles(const std::byte* codes, size_t tiles, int k, int L, const float* scales, float* out, size_t stride) {
  decode_tiles_avx512(codes, tiles, k, L, scales, out, stride);
}

void matvec_tile_rows(const std::byte* codes, size_t col_tiles, int k, int L, const float* scales, const float* x,
                      size_t tr0, size_t tr1, float* y) {
  matvec_tile_rows_avx512(codes, col_tiles, k, L, scales, x, tr0, tr1, y);
}

}  // namespace lowbit::kernels::trellis_avx512

#else  // not x86-64 with GCC: the portable path runs

#include "lowbit/core/error.h"

namespace lowbit::kernels::trellis_avx512 {
bool usable(codec::trellis::Code) { return false; }
void decode_tiles(const std::byte*, size_t, int, int, const float*, float*, size_t) {
  fail(Errc::internal, "[trellis] the AVX-512 decode on a CPU without it");
}
void matvec_tile_rows(const std::byte*, size_t, int, int, const float*, const float*, size_t, size_t, float*) {
  fail(Errc::internal, "[trellis] the AVX-512 decode on a CPU without it");
}
}  // namespace lowbit::kernels::trellis_avx512

#endif
