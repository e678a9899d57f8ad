// Prefill GEMM on tensor cores for the layouts whose codes are not mma fragments: dense bf16 and affine 8 bits
// (CoalescedDevice), affine 3/5/6 bits (AffineDevice bit streams). The block tiling, activation pipeline and K split
// are gemm_tile.cuh's; a loader per layout copies a stage's weights of the block's 128 rows into a ring slot with
// cp.async, and the block decodes the slot into a bf16 tile [row][column] in shared memory that the warps read with
// ldmatrix as A fragments (dense bf16 copies straight into tile form, no decoding). Affine codes enter the tile as
// the integers q (exact in bf16 up to 8 bits) and, per group, sum (s q + b) x = s C + b Sx with C = sum q x (the
// mma accumulators) and the segment sums Sx of the activations, as in affine_gemm.cu.
//
// Per iteration ls, after the one barrier: copy stage ls + 2, convert the activations and decode the weights of stage
// ls + 1 into the other buffers, compute stage ls.
#include <cuda_fp16.h>

#include "gemm.h"
#include "gemm_tile.cuh"

namespace lowbit::kernels::cuda {
namespace {

struct TileArgs {
  const unsigned char* codes;
  const uint32_t* meta;  // affine: [rows][row_groups] (scale, bias): one u32 of 16-bit halves (scale low) or two f32
  int64_t rows, cols, m;
  int64_t row_bytes;   // of codes per row (the padded width)
  int64_t row_groups;  // affine groups per row
  int64_t stages;      // padded width / kStageCols
  int group_log2;      // affine group
  int meta_words;      // 1, or 2 for f32
  bool meta_f16;       // 16-bit meta is f16, else bf16
  bool x_vector;       // x rows are 16-byte aligned: 16-byte copies
  int stages_per_split;
};

// The bf16 tile: 64 columns (128 bytes) per row padded to 144, so that ldmatrix's eight row addresses and the
// decoder's 16-byte stores of consecutive rows hit distinct banks.
constexpr int kTileStride = 144;
constexpr int kTileBytes = kTileRows * kTileStride;

// Loaders: copy(a, raw, row0, st) issues the copies of stage st of rows row0 .. row0 + 127 (clamped to the last row:
// the extra rows' outputs are not stored) into a ring slot of kRawStride bytes per row; decode(raw, r, h, out) turns
// codes 32 h .. 32 h + 31 of row r of the slot into bf16 pairs (low half first).

// The bf16 pair (q0, q1) of codes q < 2^8 (exact in bf16): 2^23 + q as f32 bits, minus 2^23.
__device__ __forceinline__ uint32_t code_pair(uint32_t q0, uint32_t q1) {
  return pack_bf16(__uint_as_float(0x4B000000u | q0) - 8388608.0f, __uint_as_float(0x4B000000u | q1) - 8388608.0f);
}

// Affine B bits, B = 3, 5, 6, as bit streams: a row's stage is 8 B contiguous bytes (B copies of 8 bytes).
template <int B>
struct StreamLoader {
  static constexpr bool kAffine = true, kDecode = true;
  static constexpr int kRawStride = B == 6 ? 56 : 8 * B;  // words per row = 2 mod 4: the decoder's loads 2-way at most
  __device__ static void copy(const TileArgs& a, unsigned char* raw, int64_t row0, int64_t st) {
    for (int c = threadIdx.x; c < kTileRows * B; c += kThreads) {
      const int r = c / B, p = c % B;
      const int64_t row = min(row0 + r, a.rows - 1);
      cp_async8(raw + r * kRawStride + 8 * p, a.codes + row * a.row_bytes + st * 8 * B + 8 * p);
    }
  }
  __device__ static void decode(const unsigned char* raw, int r, int h, uint32_t (&out)[16]) {
    const uint32_t* src = reinterpret_cast<const uint32_t*>(raw + r * kRawStride + 4 * B * h);
    uint32_t w[B];
#pragma unroll
    for (int i = 0; i < B; ++i) w[i] = src[i];
    constexpr uint32_t kMask = (1u << B) - 1;
    uint32_t q[32];
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const int bit = j * B, wi = bit / 32, sh = bit % 32;
      q[j] = (sh + B <= 32 ? w[wi] >> sh : __funnelshift_r(w[wi], w[wi + 1], sh)) & kMask;
    }
#pragma unroll
    for (int k = 0; k < 16; ++k) out[k] = code_pair(q[2 * k], q[2 * k + 1]);
  }
};

// Stage st of the block's rows in the coalesced layout, P bytes per lane word: with S = 32 / P stages per step, stage
// cs = st % S is bytes P (cs / 2) .. + P - 1 of the 16-byte words of lanes 16 (cs % 2) .. + 15, sixteen copies per
// row into raw + r stride, in column order (rows past the matrix repeat its last).
template <int P>
__device__ void copy_coalesced_stage(const TileArgs& a, unsigned char* raw, int stride, int64_t row0, int64_t st) {
  constexpr int S = 32 / P;
  const int64_t step = st / S;
  const int t = static_cast<int>(st % S) / 2, half = static_cast<int>(st % 2);
  for (int c = threadIdx.x; c < kTileRows * 16; c += kThreads) {
    const int r = c / 16, p = c % 16;
    const int64_t row = min(row0 + r, a.rows - 1);
    const unsigned char* src = a.codes + row * a.row_bytes + (step * 32 + 16 * half + p) * 16 + P * t;
    if constexpr (P == 4) {
      cp_async4(raw + r * stride + 4 * p, src, 4);
    } else {
      cp_async8(raw + r * stride + 8 * p, src);
    }
  }
}

// Affine 8 bits, coalesced (T = 4): stage cs = st % 8 of a 512-column step is bytes 4 (cs / 2) .. + 3 of the 16-byte
// words of lanes 16 (cs % 2) .. + 15: sixteen 4-byte copies, in column order.
struct ByteLoader {
  static constexpr bool kAffine = true, kDecode = true;
  static constexpr int kRawStride = 80;  // 5 16-byte units: a quarter warp's loads of consecutive rows are distinct
  __device__ static void copy(const TileArgs& a, unsigned char* raw, int64_t row0, int64_t st) {
    copy_coalesced_stage<4>(a, raw, kRawStride, row0, st);
  }
  __device__ static void decode(const unsigned char* raw, int r, int h, uint32_t (&out)[16]) {
    const uint4* src = reinterpret_cast<const uint4*>(raw + r * kRawStride + 32 * h);
    const uint4 v0 = src[0], v1 = src[1];
    const uint32_t w[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      out[2 * i] = code_pair(w[i] & 0xFFu, (w[i] >> 8) & 0xFFu);
      out[2 * i + 1] = code_pair((w[i] >> 16) & 0xFFu, w[i] >> 24);
    }
  }
};

// Dense bf16, coalesced (T = 2): stage cs = st % 4 of a 256-column step is bytes 8 (cs / 2) .. + 7 of the 16-byte
// words of lanes 16 (cs % 2) .. + 15: sixteen 8-byte copies that land in tile form.
struct Bf16Loader {
  static constexpr bool kAffine = false, kDecode = false;
  static constexpr int kRawStride = kTileStride;
  __device__ static void copy(const TileArgs& a, unsigned char* raw, int64_t row0, int64_t st) {
    copy_coalesced_stage<8>(a, raw, kRawStride, row0, st);
  }
};

// Shared memory: the ring of raw weights, meta (affine) and activations, the decoded tiles (two buffers), the B
// fragments and segment sums.
template <class L>
struct Smem {
  static constexpr int kRawBytes = kTileRows * L::kRawStride;
  static constexpr int kMetaBytes = L::kAffine ? kTileRows * 16 : 0;  // per row: up to 2 groups x 2 words
  static constexpr int kMetaOff = kSlots * kRawBytes;
  static constexpr int kTileOff = kMetaOff + kSlots * kMetaBytes;
  static constexpr int kXOff = kTileOff + (L::kDecode ? 2 * kTileBytes : 0);
  static constexpr int kFragOff = kXOff + kSlots * kXBytes;
  static constexpr int kSxOff = kFragOff + kFragBytes;
  static constexpr int kBytes = kSxOff + kSxBytes;
  static_assert(kRawBytes % 16 == 0 && kMetaBytes % 16 == 0 && kBytes <= 227 * 1024, "shared memory layout");
  static_assert(kPartialBytes <= kBytes, "the partial tile fits");
};

__device__ __forceinline__ void ldmatrix_x4(const unsigned char* p, uint32_t (&a)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
               : "r"(smem_addr(p)));
}

// (scale, bias) of row rb of the block, group q of the slot's meta.
__device__ __forceinline__ float2 meta_pair(const TileArgs& a, const uint32_t* ms, int rb, int q) {
  const uint32_t* e = ms + rb * 4 + q * a.meta_words;
  if (a.meta_words == 2) return {__uint_as_float(e[0]), __uint_as_float(e[1])};
  const uint32_t pair = e[0];
  if (a.meta_f16)
    return {__half2float(__ushort_as_half(static_cast<unsigned short>(pair & 0xFFFFu))),
            __half2float(__ushort_as_half(static_cast<unsigned short>(pair >> 16)))};
  return {__uint_as_float(pair << 16), __uint_as_float(pair & 0xFFFF0000u)};
}

template <class L>
__global__ void __launch_bounds__(kThreads, 1) tile_gemm_kernel(TileArgs a, const float* __restrict__ x,
                                                                float* __restrict__ y) {
  using S = Smem<L>;
  extern __shared__ __align__(16) unsigned char smem[];
  uint2* const frag = reinterpret_cast<uint2*>(smem + S::kFragOff);
  float* const sx = reinterpret_cast<float*>(smem + S::kSxOff);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int wr = warp % 4, wn = warp / 4;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kTileRows;
  const int64_t tok0 = static_cast<int64_t>(blockIdx.z) * kTileTokens;
  const int tokens = static_cast<int>(min(static_cast<int64_t>(kTileTokens), a.m - tok0));
  const int64_t st0 = static_cast<int64_t>(blockIdx.x) * a.stages_per_split;
  const int nst = static_cast<int>(min(static_cast<int64_t>(a.stages_per_split), max(a.stages - st0, int64_t{0})));
  const int seg_steps = L::kAffine ? min(1 << a.group_log2, kStageCols) / 16 : kSteps;  // k16 steps per segment
  const int group_steps = (1 << a.group_log2) / 16;

  // Copies of local stage ls into its slot; one commit group per stage (empty past the end).
  auto issue = [&](int ls) {
    if (ls < nst) {
      const int slot = ls % kSlots;
      const int64_t st = st0 + ls;
      L::copy(a, smem + slot * S::kRawBytes, row0, st);
      if constexpr (L::kAffine) {
        if (threadIdx.x < kTileRows) {  // a row's groups of the stage: 4, 8 or 16 bytes
          const int64_t row = min(row0 + threadIdx.x, a.rows - 1);
          const int words = max(1, kStageCols >> a.group_log2) * a.meta_words;
          const uint32_t* src = a.meta + (row * a.row_groups + ((st * kStageCols) >> a.group_log2)) * a.meta_words;
          unsigned char* dst = smem + S::kMetaOff + slot * S::kMetaBytes + threadIdx.x * 16;
          if (words == 4)
            cp_async16(dst, src);
          else if (words == 2)
            cp_async8(dst, src);
          else
            cp_async4(dst, src, 4);
        }
      }
      copy_x_stage(reinterpret_cast<float*>(smem + S::kXOff + slot * kXBytes), x, a.cols, tok0, tokens, st * kStageCols,
                   a.x_vector);
    }
    cp_async_commit();
  };

  // The activations and weights of local stage ls into buffer ls % 2: thread (row tid % 128, half tid / 128) decodes
  // 32 codes.
  auto prepare = [&](int ls) {
    const int slot = ls % kSlots, buf = ls % 2;
    convert_x_stage(reinterpret_cast<const float*>(smem + S::kXOff + slot * kXBytes), frag + buf * kFragWords,
                    sx + buf * kSxFloats, seg_steps);
    if constexpr (L::kDecode) {
      const int r = threadIdx.x % kTileRows, h = threadIdx.x / kTileRows;
      uint32_t out[16];
      L::decode(smem + slot * S::kRawBytes, r, h, out);
      uint4* dst = reinterpret_cast<uint4*>(smem + S::kTileOff + buf * kTileBytes + r * kTileStride + 64 * h);
#pragma unroll
      for (int i = 0; i < 4; ++i) dst[i] = {out[4 * i], out[4 * i + 1], out[4 * i + 2], out[4 * i + 3]};
    }
  };

  float acc[2][4][4], c[2][4][4];  // [row tile][n-tile][fragment element]
  zero(acc);
  zero(c);

  auto compute = [&](int ls) {
    const int slot = ls % kSlots, buf = ls % 2;
    const int64_t st = st0 + ls;
    const unsigned char* tile = L::kDecode ? smem + S::kTileOff + buf * kTileBytes : smem + slot * S::kRawBytes;
    // ldmatrix: lane l addresses row l % 16 of the row tile, columns 8 (l / 16) .. + 7 of the k16 step.
    const unsigned char* a_rows = tile + (32 * wr + lane % 16) * kTileStride + 16 * (lane / 16);
    const uint32_t* ms = reinterpret_cast<const uint32_t*>(smem + S::kMetaOff + slot * S::kMetaBytes);
#pragma unroll
    for (int j = 0; j < kSteps; ++j) {
      uint32_t af[2][4];
#pragma unroll
      for (int r = 0; r < 2; ++r) ldmatrix_x4(a_rows + 16 * r * kTileStride + 32 * j, af[r]);
      uint2 bf[2][4];  // [hi, lo][n-tile]
      load_b(frag + buf * kFragWords, j, wn, lane, bf);
      mma_step(c, af, bf);
      if constexpr (L::kAffine)
        finish_segment(j, st, seg_steps, group_steps, a.group_log2, sx + buf * kSxFloats, wn, t, acc, c,
                       [&](int r, int h, int q) { return meta_pair(a, ms, 32 * wr + 16 * r + g + 8 * h, q); });
    }
  };

  issue(0);
  issue(1);
  cp_async_wait<1>();
  __syncthreads();
  if (nst > 0) prepare(0);
  for (int ls = 0; ls < nst; ++ls) {
    cp_async_wait<0>();
    __syncthreads();
    issue(ls + 2);
    if (ls + 1 < nst) prepare(ls + 1);
    compute(ls);
  }
  cp_async_wait<0>();
  __syncthreads();

  if constexpr (L::kAffine)
    reduce_tile(reinterpret_cast<float*>(smem), acc, y, a.rows, row0, tok0, tokens, false);
  else
    reduce_tile(reinterpret_cast<float*>(smem), c, y, a.rows, row0, tok0, tokens, false);
}

template <class L>
void launch(TileArgs a, const float* x, int64_t m, float* y, CUstream_st* s) {
  static const ClusterResidency dev(tile_gemm_kernel<L>, kThreads, Smem<L>::kBytes);
  const int64_t row_blocks = (a.rows + kTileRows - 1) / kTileRows;
  const int64_t group_stages = L::kAffine ? std::max(1, (1 << a.group_log2) / kStageCols) : 1;
  launch_tiles(tile_gemm_kernel<L>, dev, Smem<L>::kBytes, a, row_blocks, a.stages, group_stages, x, a.cols, m, y,
               a.rows, s);
}

}  // namespace

void launch_coalesced_gemm_kernel(const CoalescedDevice& w, const float* x, int64_t m, float* y, CUstream_st* s) {
  const TileArgs a{static_cast<const unsigned char*>(w.codes), w.meta, w.rows, w.cols, m, w.kpad * w.bits / 8,
                   w.group > 0 ? w.kpad / w.group : 0, w.kpad / kStageCols, w.group > 0 ? log2_of(w.group) : 0,
                   w.meta_type == MetaType::f32 ? 2 : 1, w.meta_type == MetaType::f16, x_vector(x, w.cols), 0};
  if (w.bits == 8) return launch<ByteLoader>(a, x, m, y, s);
  launch<Bf16Loader>(a, x, m, y, s);
}

void launch_affine_tile_gemm_kernel(const AffineDevice& w, const float* x, int64_t m, float* y, CUstream_st* s) {
  const TileArgs a{reinterpret_cast<const unsigned char*>(w.codes), w.meta, w.rows, w.cols, m, w.kpad * w.bits / 8,
                   w.kpad / w.group, w.kpad / kStageCols, log2_of(w.group), w.meta_type == MetaType::f32 ? 2 : 1,
                   w.meta_type == MetaType::f16, x_vector(x, w.cols), 0};
  switch (w.bits) {
    case 5: return launch<StreamLoader<5>>(a, x, m, y, s);
    case 6: return launch<StreamLoader<6>>(a, x, m, y, s);
    default: return launch<StreamLoader<3>>(a, x, m, y, s);
  }
}

}  // namespace lowbit::kernels::cuda
