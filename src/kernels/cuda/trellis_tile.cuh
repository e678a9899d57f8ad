// The tensor-core trellis kernels' shared device pieces (trellis.cu: decode matvec, trellis_gemm.cu: prefill GEMM):
// decoding a 16 x 16 tile's states straight into tf32 mma.sync A fragments, the hi + lo split of activations
// into B fragments, and the cp.async copies that stage codes and activations in shared memory.
//
// A tile row's chunk (trellis.h) holds, per row, the k u16 words of 4 consecutive tiles. Lane 4 g + t decodes
// rows g and g + 8, states 4 t .. 4 t + 3 of a tile: the A fragments of two m16n8k8 steps (step s takes the
// lane's columns 4 t + 2 s and 4 t + 2 s + 1, so B takes the same column order and one float4 of x per lane and
// activation row serves both). The L - k bits before a tile row in the tail-biting stream are the end of the row
// above, fetched by shuffle from the lane that decodes it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "trellis_code.cuh"

namespace lowbit::kernels::cuda {

// States 4 t .. 4 t + 3 of a tile row from its window hi:lo:tail = [16 prefix bits | the row's 16 K bits], MSB
// first (tail = 0 for K = 2, 3, whose window fits in 64 bits; for K = 4 it holds bits 64..79 in its high
// half): state i is the L bits ending at bit 16 + (i + 1) K. `u` = the window's 32 bits from bit (4 t + 1) K
// on (`shift` = that mod 32, `wide` = it is >= 32), so state j sits at the fixed offset 16 - j K in it, and
// state 0 of a 16-bit trellis needs no mask.
template <int K, bool kMad1, bool kL16>
__device__ __forceinline__ void decode4(uint32_t hi, uint32_t lo, uint32_t tail, int shift, bool wide,
                                        uint32_t mask, float (&f)[4]) {
  uint32_t u;
  if constexpr (13 * K < 32) {
    u = __funnelshift_l(lo, hi, shift);
  } else {
    u = __funnelshift_l(wide ? tail : lo, wide ? lo : hi, shift);
  }
  f[0] = trellis_code<kMad1>(kL16 ? u >> 16 : (u >> 16) & mask);
#pragma unroll
  for (int j = 1; j < 4; ++j) f[j] = trellis_code<kMad1>((u >> (16 - j * K)) & (kL16 ? 0xFFFFu : mask));
}

// The u16 words j (high half of the result) and i (low half) of a row's words, in one PRMT.
__device__ __forceinline__ uint32_t pack16(const uint32_t* hi_words, int j, const uint32_t* lo_words, int i) {
  return __byte_perm(lo_words[i / 2], hi_words[j / 2], (i % 2 ? 0x32u : 0x10u) | (j % 2 ? 0x7600u : 0x5400u));
}

// One lane's view of a tile row: which bits of its window it decodes and where its rows' prefixes come from.
template <int K, bool kMad1, bool kL16>
struct TileDecoder {
  static constexpr int kRowWords = 2 * K;  // u32 words of one row's 4 tiles

  uint32_t mask;
  int shift;
  bool wide;
  int prefix_lane;
  uint32_t sel_g0, sel_h0, sel_g1, sel_h1;  // 1: the prefix above a row's second u16 word

  __device__ TileDecoder(int L, int g, int t)
      : mask((1u << L) - 1u),
        shift(((4 * t + 1) * K) % 32),
        wide((4 * t + 1) * K >= 32),
        prefix_lane(((g + 7) & 7) * 4 + t),
        // Prefix of row g: the last word of row g - 1 (lane g - 1's first row), of row 15 for g = 0 (lane 7's
        // second); the selectors put it above the row's first word (low or high half of its u32).
        sel_g0(g > 0 ? 0x5410u : 0x7610u),
        sel_h0(g > 0 ? 0x7610u : 0x5410u),
        sel_g1(sel_g0 + 0x22u),
        sel_h1(sel_h0 + 0x22u) {}

  // Tile q (0..3) of the chunk whose rows g and g + 8 are rg and rh: fg, fh = states 4 t .. 4 t + 3 of those
  // rows. Every lane of the warp must call it (shuffle).
  __device__ __forceinline__ void decode(const uint32_t (&rg)[kRowWords], const uint32_t (&rh)[kRowWords], int q,
                                         float (&fg)[4], float (&fh)[4]) const {
    const int j0 = q * K;  // the tile's first u16 word in the row's words
    const uint32_t p = __shfl_sync(0xFFFFFFFFu, pack16(rh, j0 + K - 1, rg, j0 + K - 1), prefix_lane);
    const uint32_t hi_g = __byte_perm(rg[j0 / 2], p, j0 % 2 ? sel_g1 : sel_g0);
    const uint32_t hi_h = __byte_perm(rh[j0 / 2], p, j0 % 2 ? sel_h1 : sel_h0);
    uint32_t lo_g, lo_h, tail_g = 0u, tail_h = 0u;
    if constexpr (K == 2) {
      lo_g = rg[q] & 0xFFFF0000u;
      lo_h = rh[q] & 0xFFFF0000u;
    } else {
      lo_g = pack16(rg, j0 + 1, rg, j0 + 2);
      lo_h = pack16(rh, j0 + 1, rh, j0 + 2);
    }
    if constexpr (K == 4) {  // word j0 + 3, the high half of u32 j0 / 2 + 1
      tail_g = rg[j0 / 2 + 1] & 0xFFFF0000u;
      tail_h = rh[j0 / 2 + 1] & 0xFFFF0000u;
    }
    decode4<K, kMad1, kL16>(hi_g, lo_g, tail_g, shift, wide, mask, fg);
    decode4<K, kMad1, kL16>(hi_h, lo_h, tail_h, shift, wide, mask, fh);
  }
};

// tf32 hi part of x (x - hi is exact in f32 and its tf32 rounding leaves about 2^-22 of x).
__device__ __forceinline__ uint32_t tf32_hi(float x) { return __float_as_uint(x) & 0xFFFFE000u; }

__device__ __forceinline__ void mma_tf32(float (&c)[4], const float (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(__float_as_uint(a[0])), "r"(__float_as_uint(a[1])), "r"(__float_as_uint(a[2])),
        "r"(__float_as_uint(a[3])), "r"(b0), "r"(b1));
}

// cp.async copies of 16 bytes (cg, 16-byte aligned) and 4 bytes (ca); `bytes` < the size zero-fills the rest.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int bytes = 16) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(gmem), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem, int bytes) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(gmem), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

}  // namespace lowbit::kernels::cuda
