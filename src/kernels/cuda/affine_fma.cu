// Affine 2/4-bit (batch 1; 4 bits also batch 2..8 on tall matrices) and two-plane (batch 1..4) decode matvec,
// reading the tensor-core layout (AffineMmaDevice in matvec.h), so one device copy of the weights serves this
// kernel and affine_mma.cu.
//
// Persistent blocks, one per SM: block b takes the 16-row tiles b, b + grid, ... In the layout a tile's k-blocks
// are one contiguous run, so a producer warp streams the block's tiles, slot by slot, into a ring of shared memory
// with bulk copies (cp.async.bulk, each slot completing on its mbarrier): the SM keeps the whole ring of loads in
// flight whatever the decoding warps do, and the stream runs from one tile into the next without draining. The
// consumer warps decode the slots' units of 128 columns (two k-blocks of 4 bits, one of 2 bits) and free each slot
// for the next copy; at a tile's end they add their shares in shared memory. The block sums x per group once, for
// all its tiles, while the first copies fly.
//
// Affine decodes on the tensor cores (TC): a lane's 16 bytes are its mma A fragments, each register pair the
// codes under the exponent of the bf16 128.0 (exactly 128 + q, one shift and one LOP3), and the block builds the B
// fragments of x once (bf16 hi + lo, so the products keep f32 accuracy; B column n holds hi or lo by parity, of
// batch row n / 2 in an n-tile of 4 rows), so one mma.sync m16n8k16 covers 256 codes for up to 4 batch rows.
// Per group, with C = sum (128 + q) x and Sx = sum x (of hi + lo),
//   sum (s q + b) x = s C + (b - 128 s) Sx.
// Rows too long for the B fragments in shared memory, and two-plane (two scales per group, batch up to 4), decode
// on the CUDA cores: in a unit a lane's words hold 32 columns of rows g and g + 8 (lane 4 g + t; step J covers
// columns 16 J + 2 t + {0, 1, 8, 9}), so one activation load serves both rows; 4 bits cost one AND (and shift)
// per word and one PRMT per code (a byte under the exponent byte 0x43 reads as 128 + q), 2 bits a shift and a
// LOP3 per code (1 + q / 4), and one FFMA per code, with the same group identity (one lane of a row adds the Sx
// term).
#include <cuda_bf16.h>

#include "matvec.cuh"

namespace lowbit::kernels::cuda {
namespace {

constexpr int kUnitCols = 128;
constexpr int kKblockBytes = 512;  // one k-block of one 16-row tile: 32 lanes x 16 bytes
constexpr int kMaxConsumers = 15;  // with the producer 16 warps: 128 registers a thread
constexpr int kMaxThreads = (kMaxConsumers + 1) * 32;
constexpr uint32_t kExp128 = 0x43000000u;  // 128.0f: a code q in byte 2 reads as 128 + q

struct FmaArgs {
  const uint32_t* planes[2];  // codes in the tensor-core layout; the second plane only for two-plane tensors
  const uint32_t* meta;       // [row_tiles][groups][16 rows] (matvec.h)
  int64_t rows, cols, row_tiles, kblocks, groups;
  bool meta_f32;
};

// The ring: `slots` slots of `units` units; a slot holds the codes [P planes][units * B / 2 k-blocks][512 bytes],
// then the meta of the units' groups [units * SEGS][16 rows][meta words].
struct Ring {
  int slots, units;
  uint32_t slot_bytes;
};

// Blocks that share each tile (`splits`: batch 2..8 at 4 bits on long rows, affine_splits; else 1): consecutive
// blocks, each owning one K slice of ceil(units / splits) units, so that each reads only its slice of x; they add
// their sums into y (zeroed first) with atomics, so those results vary in the last bits from run to run.
// The block's share: tiles first_tile, first_tile + tile_stride, ...; units [u_begin, u_end) of each.
struct Share {
  int64_t first_tile, tile_stride, u_begin, u_end;
};

// Only batches 2..8 on the tensor cores split K. The other instances take whole tiles, and their loops read
// blockIdx.x and gridDim.x themselves (first_tile and tile_stride unused), so that their sm_90a code stays the
// unsplit kernel's instruction for instruction (checked with nvdisasm, 2026-12-03).
template <int M, bool TC>
constexpr bool kSplits = TC && M > 1;

template <bool Split>
__device__ __forceinline__ Share block_share(int64_t tile_units, int splits) {
  if constexpr (!Split) return {0, 0, 0, tile_units};
  const int64_t chunk = (tile_units + splits - 1) / splits;
  const int64_t begin = min(tile_units, (blockIdx.x % splits) * chunk);
  return {blockIdx.x / splits, gridDim.x / splits, begin, min(tile_units, begin + chunk)};
}

// Words per meta entry (one row's group): bf16 pairs take one word per plane, f32 two.
template <int P>
__device__ __forceinline__ int meta_words(const FmaArgs& a) {
  return P * (a.meta_f32 ? 2 : 1);
}

// ---- mbarriers and bulk copies (shared-memory addresses as 32-bit offsets) --------------------------------------

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("{ .reg .b64 state; mbarrier.arrive.shared::cta.b64 state, [%0]; }" ::"r"(smem_addr(bar)) : "memory");
}

// Waits until the phase of parity `parity` of `bar` has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
#if __CUDA_ARCH__ >= 900
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
#else
    asm volatile(
        "{ .reg .pred p; mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
#endif
  }
}

// Named barrier 1 over the consumer warps (the producer warp never joins).
__device__ __forceinline__ void consumers_sync(int consumers) {
  asm volatile("bar.sync 1, %0;" ::"r"(consumers * 32) : "memory");
}

// ---- decoding ----------------------------------------------------------------------------------------------------

// Byte k of v (a code of at most 7 bits) as the float 128 + v_k.
__device__ __forceinline__ float byte_as_float(uint32_t v, int k) {
  return __uint_as_float(__byte_perm(v, kExp128, 0x7044u | (static_cast<uint32_t>(k) << 8)));
}

// The 2-bit code at bit `bit` of w as the float 1 + q / 4 (the code under the exponent of 1.0, at bits 21-22):
// a shift and a LOP3, but an offset of 4 code units instead of 128 + q's 128, so that the group's cancellation
// F - Sx keeps 2-bit products (rms code 1.9) as accurate as 4-bit ones.
__device__ __forceinline__ float code2_as_float(uint32_t w, int bit) {
  const uint32_t v = bit <= 21 ? w << (21 - bit) : w >> (bit - 21);
  return __uint_as_float((v & 0x00600000u) | 0x3F800000u);
}

// Scale per plane and bias summed over planes, rows g and g + 8 of the tile, for one group; `meta` points at the
// group's 16 entries in shared memory.
template <int P>
struct SegMeta {
  float scale[P][2];
  float bias[2];

  __device__ void load(const FmaArgs& a, const uint32_t* meta, bool valid, int g) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      bias[r] = 0.0f;
#pragma unroll
      for (int p = 0; p < P; ++p) scale[p][r] = 0.0f;
      if (!valid) continue;
      const int e = g + 8 * r;
      if (a.meta_f32) {
        if constexpr (P == 1) {
          const uint2 v = reinterpret_cast<const uint2*>(meta)[e];
          scale[0][r] = __uint_as_float(v.x), bias[r] = __uint_as_float(v.y);
        } else {
          const uint4 v = reinterpret_cast<const uint4*>(meta)[e];
          scale[0][r] = __uint_as_float(v.x), scale[1][r] = __uint_as_float(v.z);
          bias[r] = __uint_as_float(v.y) + __uint_as_float(v.w);
        }
      } else {
        uint32_t v[P];
        if constexpr (P == 1) {
          v[0] = meta[e];
        } else {
          const uint2 u = reinterpret_cast<const uint2*>(meta)[e];
          v[0] = u.x, v[1] = u.y;
        }
#pragma unroll
        for (int p = 0; p < P; ++p) {
          scale[p][r] = __uint_as_float(v[p] << 16);
          bias[r] += __uint_as_float(v[p] & 0xFFFF0000u);
        }
      }
    }
  }
};

// The activations of step J for lane t: columns c + {0, 1, 8, 9} with c = c0 + 16 J + 2 t. Vector: xs[i] points
// at column c0 + 2 t of batch row i and the unit lies inside the row (constant offsets from one address); else
// scalar loads with zeros past `cols`.
template <bool Vector, int M>
__device__ __forceinline__ void load_step_x(const float* const (&xs)[M], int J, int64_t c, int64_t cols,
                                            float (&xv)[M][4]) {
#pragma unroll
  for (int i = 0; i < M; ++i) {
    if constexpr (Vector) {
      const float2 v0 = __ldg(reinterpret_cast<const float2*>(xs[i] + 16 * J));
      const float2 v1 = __ldg(reinterpret_cast<const float2*>(xs[i] + 16 * J + 8));
      xv[i][0] = v0.x, xv[i][1] = v0.y, xv[i][2] = v1.x, xv[i][3] = v1.y;
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t k = c + 16 * J + (e & 1) + 8 * (e >> 1);
        xv[i][e] = k < cols ? __ldg(xs[i] + 16 * J + (e & 1) + 8 * (e >> 1)) : 0.0f;
      }
    }
  }
}

// acc[r][i] (rows g, g + 8; batch row i) += the codes of unit s (of the tile) times x; `meta` points at the unit's
// first group in the slot. Within a step's word, 4 bits: byte k holds column 2 t + {0, 8, 1, 9}[k] of row g (low
// nibble) and row g + 8 (high nibble); 2 bits (word J / 2): byte J % 2 + 2 e holds, in slot c, row g + 8 (c % 2)
// at column 2 t + 8 (c / 2) + e.
template <bool Vector, int B, int P, int M, int SEGS>
__device__ __forceinline__ void compute_unit(const FmaArgs& a, const uint32_t (&w)[P][B / 2][4], int64_t s,
                                             const uint32_t* meta, const float* const (&xr)[M],
                                             const float* group_sx, int g, int t, float (&acc)[2][M]) {
  constexpr int kSteps = 8 / SEGS;  // k16 steps per group segment
  const int64_t c = s * kUnitCols + 2 * t;
  const float* xs[M];
#pragma unroll
  for (int i = 0; i < M; ++i) xs[i] = xr[i] + c;
#pragma unroll
  for (int seg = 0; seg < SEGS; ++seg) {
    const int64_t group = s * SEGS + seg;
    SegMeta<P> sm;
    sm.load(a, meta + seg * 16 * meta_words<P>(a), group < a.groups, g);
    float F[P][2][M];
#pragma unroll
    for (int p = 0; p < P; ++p)
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int i = 0; i < M; ++i) F[p][r][i] = 0.0f;
#pragma unroll
    for (int jj = 0; jj < kSteps; ++jj) {
      const int J = seg * kSteps + jj;
      float xv[M][4];
      load_step_x<Vector, M>(xs, J, c, a.cols, xv);
#pragma unroll
      for (int p = 0; p < P; ++p) {
        if constexpr (B == 4) {
          const uint32_t word = w[p][J / 4][J % 4];
          const uint32_t nib[2] = {word & 0x0F0F0F0Fu, (word >> 4) & 0x0F0F0F0Fu};
#pragma unroll
          for (int k = 0; k < 4; ++k)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
              const float f = byte_as_float(nib[r], k);
#pragma unroll
              for (int i = 0; i < M; ++i) F[p][r][i] = fmaf(f, xv[i][(k & 1) * 2 + (k >> 1)], F[p][r][i]);
            }
        } else {
          const uint32_t word = w[p][0][J / 2];
#pragma unroll
          for (int c2 = 0; c2 < 4; ++c2)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float f = code2_as_float(word, 8 * (J % 2 + 2 * e) + 2 * c2);
#pragma unroll
              for (int i = 0; i < M; ++i) F[p][c2 % 2][i] = fmaf(f, xv[i][2 * (c2 / 2) + e], F[p][c2 % 2][i]);
            }
        }
      }
    }
    // F = U^-1 sum q x + O U^-1 Sx: 4 bits U = 1, O = 128 (128 + q); 2 bits U = 4, O = 4 (1 + q / 4).
    constexpr float U = B == 4 ? 1.0f : 4.0f, O = B == 4 ? 128.0f : 4.0f;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float s_sum = 0.0f;
#pragma unroll
      for (int p = 0; p < P; ++p) s_sum += sm.scale[p][r];
      const float d = t == 0 ? fmaf(-O, s_sum, sm.bias[r]) : 0.0f;
#pragma unroll
      for (int i = 0; i < M; ++i) {
        float v = acc[r][i];
#pragma unroll
        for (int p = 0; p < P; ++p) v = fmaf(U * sm.scale[p][r], F[p][r][i], v);
        if (group < a.groups) v = fmaf(d, group_sx[group * M + i], v);
        acc[r][i] = v;
      }
    }
  }
}

// ---- the tensor-core decode (affine, batch 1) ------------------------------------------------------------------

__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// xfrag [k16 steps][M batch rows][2 parts][4 t] (uint2): the mma B fragments of x, batch row i, part p for lane
// 4 g + t: columns 16 step + 2 t + {0, 1} and + {8, 9} as bf16 pairs, hi (part 0) and lo = x - hi (part 1), so
// that hi + lo is x within 2^-17 relative. In n-tile nt, B column n holds batch row (4 nt + n / 2) % M, part n % 2,
// so D columns 2 t and 2 t + 1 hold the hi and lo sums of batch row (4 nt + t) % M for the lane's rows (at M = 1
// all four lanes of a row get the same sums). Batch rows i >= m repeat row 0.
// The block builds the fragments of its slice: `steps` steps from step0, xfrag's step 0 being step0.
template <int M>
__device__ void build_xfrag(const FmaArgs& a, const float* x, int m, uint2* xfrag, int64_t step0, int64_t steps,
                            int thread, int threads) {
#pragma unroll 4
  for (int64_t e = thread; e < steps * 4 * M; e += threads) {
    const int64_t step = e / (4 * M), c = (step0 + step) * 16 + 2 * (e % 4);
    const int i = static_cast<int>(e / 4 % M);
    const float* xi = x + (i < m ? i : 0) * a.cols;
    float v[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int64_t col = c + (q & 1) + 8 * (q >> 1);
      v[q] = col < a.cols ? __ldg(xi + col) : 0.0f;
    }
    uint32_t hi[2], lo[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      hi[h] = pack_bf16(v[2 * h], v[2 * h + 1]);
      lo[h] = pack_bf16(v[2 * h] - __uint_as_float(hi[h] << 16), v[2 * h + 1] - __uint_as_float(hi[h] & 0xFFFF0000u));
    }
    xfrag[(step * M + i) * 8 + e % 4] = make_uint2(hi[0], hi[1]);
    xfrag[(step * M + i) * 8 + 4 + e % 4] = make_uint2(lo[0], lo[1]);
  }
}

// A fragment register i of k16 step j of the unit from the lane's words (matvec.h): bf16 pairs 128 + q.
template <int B>
__device__ __forceinline__ void decode_a(const uint32_t (&w)[B / 2][4], int j, uint32_t (&av)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (B == 4) {
      av[i] = ((w[j / 4][j % 4] >> (4 * i)) & 0x000F000Fu) | 0x43004300u;
    } else {
      av[i] = ((w[0][j / 2] >> (2 * (4 * (j % 2) + i))) & 0x00030003u) | 0x43004300u;
    }
  }
}

// N-tiles of 8 columns (4 batch rows of hi + lo) for a batch of M rows.
template <int M>
constexpr int kNtiles = (M + 3) / 4;

// acc[r][nt] (rows g, g + 8; batch row (4 nt + t) % M) += the codes of unit s (the slice's unit sl) times x on the
// tensor cores: per group segment C = sum (128 + q) (hi + lo) in two accumulator chains (even and odd steps), then
// s C + (b - 128 s) Sx. One mma per k16 step and n-tile: the decode and the weight bytes serve all M rows.
template <int B, int M, int SEGS>
__device__ __forceinline__ void mma_unit(const FmaArgs& a, const uint32_t (&w)[1][B / 2][4], int64_t s, int64_t sl,
                                         const uint32_t* meta, const uint2* xfrag, const float* group_sx, int g, int t,
                                         float (&acc)[2][kNtiles<M>]) {
  constexpr int kSteps = 8 / SEGS, NT = kNtiles<M>;
  const uint2* xf[NT];  // step j of the unit at xf[nt][8 M j]
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) xf[nt] = xfrag + sl * 64 * M + (((4 * nt + g / 2) % M) * 2 + (g & 1)) * 4 + t;
#pragma unroll
  for (int seg = 0; seg < SEGS; ++seg) {
    const int64_t group = s * SEGS + seg;
    const int64_t slice_group = M > 1 ? sl * SEGS + seg : group;  // group_sx holds the slice (batch 2..8)
    SegMeta<1> sm;
    sm.load(a, meta + seg * 16 * meta_words<1>(a), group < a.groups, g);
    float d[NT][2][4] = {};
#pragma unroll
    for (int jj = 0; jj < kSteps; ++jj) {
      const int j = seg * kSteps + jj;
      uint32_t av[4];
      decode_a<B>(w[0], j, av);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const uint2 bv = xf[nt][8 * M * j];
        mma_bf16(d[nt][jj & 1], av, bv.x, bv.y);
      }
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int i = (4 * nt + t) % M;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float C = (d[nt][0][2 * r] + d[nt][0][2 * r + 1]) + (d[nt][1][2 * r] + d[nt][1][2 * r + 1]);
        float v = fmaf(sm.scale[0][r], C, acc[r][nt]);
        if (group < a.groups) v = fmaf(fmaf(-128.0f, sm.scale[0][r], sm.bias[r]), group_sx[slice_group * M + i], v);
        acc[r][nt] = v;
      }
    }
  }
}

// x as the tensor cores see it: hi + lo (xfrag), so that the group's 128 Sx cancels exactly what C holds.
__device__ __forceinline__ float split_value(float v) {
  const float hi = __bfloat162float(__float2bfloat16_rn(v));
  return hi + __bfloat162float(__float2bfloat16_rn(v - hi));
}

// group_sx [slice groups][M] = the sums of x (split_value of x when TC) over the groups of units [u_begin, u_end):
// warp w takes units u_begin + w, u_begin + w + W, ...; lane l sums columns 4 l .. 4 l + 3 of the unit and the
// group's lanes add by shuffle.
template <int M, int SEGS, bool TC>
__device__ __forceinline__ void group_sums(const FmaArgs& a, const float* const (&xr)[M], float* group_sx,
                                           int64_t u_begin, int64_t u_end, int warp, int warps, int lane) {
  const auto value = [](float v) { return TC ? split_value(v) : v; };
  constexpr int kLanes = 32 / SEGS;  // lanes per group
  const bool aligned = a.cols % 4 == 0;
#pragma unroll 4
  for (int64_t c = u_begin + warp; (!kSplits<M, TC> || c < u_end) && c * SEGS < a.groups; c += warps) {
    const int64_t col = c * kUnitCols + 4 * lane;
#pragma unroll
    for (int i = 0; i < M; ++i) {
      float v = 0.0f;
      if (aligned && col + 4 <= a.cols) {
        const float4 q = __ldg(reinterpret_cast<const float4*>(xr[i] + col));
        v = (value(q.x) + value(q.y)) + (value(q.z) + value(q.w));
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) v += col + e < a.cols ? value(__ldg(xr[i] + col + e)) : 0.0f;
      }
#pragma unroll
      for (int off = 1; off < kLanes; off *= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, off);
      const int64_t group = c * SEGS + lane / kLanes;
      if (lane % kLanes == 0 && group < a.groups) group_sx[(group - u_begin * SEGS) * M + i] = v;
    }
  }
}

// ---- the two roles -----------------------------------------------------------------------------------------------

// Copies the block's tiles into the ring, slot i of the stream into ring slot i % slots once the consumers have
// freed it. One lane issues the bulk copies (sm_90); older GPUs copy with the warp's loads and stores.
// Slot protocol: full[slot] counts 1 arrival (this lane's) plus the copies' bytes; empty[slot] counts one arrival
// per consumer thread, each made after that thread's last read of the slot (codes and meta), so every read is
// ordered before the next copy into the slot by the thread's own release and this lane's acquire (the pattern of
// CUTLASS's PipelineTmaAsync; no proxy fence: the reads are complete once their values are in registers). The
// lane declares the bytes (expect_tx), issues the copies and only then arrives: the phase still completes only
// when the bytes have landed, and the arrive follows the copies in program order. compute-sanitizer's racecheck
// reported the copies' writes against the slot reads (14 hazards) with the arrive before the copies and one
// arrive per consumer warp after __syncwarp; with both as here, none (H200, 2026-12-03).
template <int B, int P, int SEGS, bool Split>
__device__ void produce(const FmaArgs& a, const Ring& ring, unsigned char* slots, uint64_t* full, uint64_t* empty,
                        int64_t tile_units, int splits, int lane) {
  const Share sh = block_share<Split>(tile_units, splits);
  const uint32_t entry_bytes = 64 * meta_words<P>(a);  // one group's 16 rows
  const uint32_t plane_bytes = ring.units * (B / 2) * kKblockBytes;
  int slot = 0;
  uint32_t phase = 0;
  const int64_t kb_end = Split ? min(a.kblocks, sh.u_end * (B / 2)) : a.kblocks;
  const int64_t g_end = Split ? min(a.groups, sh.u_end * SEGS) : a.groups;
  for (int64_t tile = Split ? sh.first_tile : blockIdx.x; tile < a.row_tiles;
       tile += Split ? sh.tile_stride : gridDim.x)
    for (int64_t u0 = sh.u_begin; u0 < sh.u_end; u0 += ring.units,
                 slot = slot + 1 == ring.slots ? (phase ^= 1, 0) : slot + 1) {
      mbar_wait(empty + slot, phase ^ 1);
      const int64_t kb0 = u0 * (B / 2), g0 = u0 * SEGS;
      const uint32_t code_bytes = static_cast<uint32_t>(min(int64_t{ring.units} * (B / 2), kb_end - kb0)) * kKblockBytes;
      const uint32_t meta_bytes = static_cast<uint32_t>(min(int64_t{ring.units} * SEGS, g_end - g0)) * entry_bytes;
      unsigned char* dst = slots + static_cast<size_t>(slot) * ring.slot_bytes;
      const char* src[P + 1];
      uint32_t dst_off[P + 1], bytes[P + 1];
#pragma unroll
      for (int p = 0; p < P; ++p) {
        src[p] = reinterpret_cast<const char*>(a.planes[p]) + (tile * a.kblocks + kb0) * kKblockBytes;
        dst_off[p] = p * plane_bytes, bytes[p] = code_bytes;
      }
      src[P] = reinterpret_cast<const char*>(a.meta) + (tile * a.groups + g0) * entry_bytes;
      dst_off[P] = P * plane_bytes, bytes[P] = meta_bytes;
#if __CUDA_ARCH__ >= 900
      if (lane == 0) {
        asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(full + slot)),
                     "r"(P * code_bytes + meta_bytes)
                     : "memory");
#pragma unroll
        for (int k = 0; k <= P; ++k)
          asm volatile(
              "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                  smem_addr(dst + dst_off[k])),
              "l"(src[k]), "r"(bytes[k]), "r"(smem_addr(full + slot))
              : "memory");
        mbar_arrive(full + slot);
      }
#else
#pragma unroll
      for (int k = 0; k <= P; ++k)
        for (uint32_t o = 16 * lane; o < bytes[k]; o += 16 * 32)
          *reinterpret_cast<uint4*>(dst + dst_off[k] + o) = __ldg(reinterpret_cast<const uint4*>(src[k] + o));
      __syncwarp();
      if (lane == 0) mbar_arrive(full + slot);
#endif
    }
}

// The consumer warps' side of the stream: unit u of a slot goes to warp u % consumers (a slot holds a multiple of
// `consumers` units, all but a tile's last).
// TC: decode on the tensor cores (affine, batch 1..8), with the B fragments of x in xfrag.
template <int B, int P, int M, int SEGS, bool TC>
__device__ void consume(const FmaArgs& a, const Ring& ring, const unsigned char* slots, uint64_t* full,
                        uint64_t* empty, int64_t tile_units, int splits, const float* x, int m, float* y,
                        float* group_sx, float* partial, uint2* xfrag, int consumers, int warp, int lane) {
  const Share sh = block_share<kSplits<M, TC>>(tile_units, splits);
  const int g = lane / 4, t = lane % 4;
  const uint32_t plane_bytes = ring.units * (B / 2) * kKblockBytes;
  const float* xr[M];
#pragma unroll
  for (int i = 0; i < M; ++i) xr[i] = x + (i < m ? i : 0) * a.cols;
  group_sums<M, SEGS, TC>(a, xr, group_sx, sh.u_begin, sh.u_end, warp, consumers, lane);
  if constexpr (TC)
    build_xfrag<M>(a, x, m, xfrag, sh.u_begin * (kUnitCols / 16), (sh.u_end - sh.u_begin) * (kUnitCols / 16),
                   warp * 32 + lane, consumers * 32);
  consumers_sync(consumers);

  constexpr int A = TC ? kNtiles<M> : M;  // accumulators per row: n-tiles (TC) or batch rows
  float acc[2][A];
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int i = 0; i < A; ++i) acc[r][i] = 0.0f;
  int slot = 0, parity = 0;
  uint32_t phase = 0;
  for (int64_t tile = kSplits<M, TC> ? sh.first_tile : blockIdx.x; tile < a.row_tiles;
       tile += kSplits<M, TC> ? sh.tile_stride : gridDim.x, parity ^= 1) {
    for (int64_t u0 = sh.u_begin; u0 < sh.u_end; u0 += ring.units,
                 slot = slot + 1 == ring.slots ? (phase ^= 1, 0) : slot + 1) {
      mbar_wait(full + slot, phase);
      const unsigned char* src = slots + static_cast<size_t>(slot) * ring.slot_bytes;
      const int units = static_cast<int>(min(int64_t{ring.units}, sh.u_end - u0));
      for (int u = warp; u < units; u += consumers) {
        const int64_t s = u0 + u, sl = s - sh.u_begin;
        uint32_t w[P][B / 2][4];
#pragma unroll
        for (int p = 0; p < P; ++p)
#pragma unroll
          for (int k = 0; k < B / 2; ++k) {
            uint4 v = make_uint4(0, 0, 0, 0);
            if (s * (B / 2) + k < a.kblocks)
              v = *reinterpret_cast<const uint4*>(src + p * plane_bytes + (u * (B / 2) + k) * kKblockBytes + 16 * lane);
            w[p][k][0] = v.x, w[p][k][1] = v.y, w[p][k][2] = v.z, w[p][k][3] = v.w;
          }
        const uint32_t* meta = reinterpret_cast<const uint32_t*>(src + P * plane_bytes) + u * SEGS * 16 * meta_words<P>(a);
        if constexpr (TC) {
          mma_unit<B, M, SEGS>(a, w, s, sl, meta, xfrag, group_sx, g, t, acc);
        } else if (a.cols % 2 == 0 && (s + 1) * kUnitCols <= a.cols) {
          compute_unit<true, B, P, M, SEGS>(a, w, s, meta, xr, group_sx, g, t, acc);
        } else {
          compute_unit<false, B, P, M, SEGS>(a, w, s, meta, xr, group_sx, g, t, acc);
        }
      }
      mbar_arrive(empty + slot);
    }

    // Lanes 4 g .. 4 g + 3 share rows g, g + 8: on the CUDA cores each holds a part of every batch row's sum,
    // on the tensor cores lane t the whole sums of batch rows 4 nt + t. Then the warps' shares through shared
    // memory, in the half of `partial` this tile's parity picks: the next tile's writes go to the other half, and
    // the one after waits at the next barrier for this tile's reads.
    float* part = partial + parity * consumers * 16 * M;
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int k = 0; k < A; ++k) {
        float v = acc[r][k];
        if constexpr (!TC) {
          v += __shfl_xor_sync(0xFFFFFFFFu, v, 1);
          v += __shfl_xor_sync(0xFFFFFFFFu, v, 2);
        }
        const int i = TC ? 4 * k + t : k;
        if (TC ? i < M : t == 0) part[(warp * 16 + g + 8 * r) * M + i] = v;
        acc[r][k] = 0.0f;
      }
    consumers_sync(consumers);
    for (int idx = warp * 32 + lane; idx < 16 * M; idx += consumers * 32) {
      const int k = idx / 16, rr = idx % 16;
      const int64_t row = tile * 16 + rr;
      if (k >= m || row >= a.rows) continue;
      float v = 0.0f;
      for (int wp = 0; wp < consumers; ++wp) v += part[(wp * 16 + rr) * M + k];
      if (kSplits<M, TC> && splits > 1) {
        atomicAdd(y + k * a.rows + row, v);
      } else {
        y[k * a.rows + row] = v;
      }
    }
  }
}

// Units per tile and per K slice of `splits`.
int64_t tile_units(const FmaArgs& a, int bits) { return (a.kblocks + bits / 2 - 1) / (bits / 2); }
int64_t slice_units(const FmaArgs& a, int bits, int splits) { return (tile_units(a, bits) + splits - 1) / splits; }

// Shared memory besides the ring: its full and empty mbarriers, with TC xfrag (64 M bytes per k16 step of the
// slice's whole units: zeros past the row), group_sx [groups][M], partial [2][consumers][16][M].
size_t smem_besides_ring(const FmaArgs& a, int bits, int m, bool tc, int splits, int slots, int consumers) {
  const int64_t units = slice_units(a, bits, splits);
  return 16 * static_cast<size_t>(slots) + static_cast<size_t>(a.groups) * m * sizeof(float) +
         2 * static_cast<size_t>(consumers) * 16 * m * sizeof(float) +
         (tc ? static_cast<size_t>(units) * 8 * 64 * m : 0);
}

template <int B, int P, int M, int SEGS, bool TC>
__global__ void __launch_bounds__(kMaxThreads, 1)
    affine_fma_kernel(FmaArgs a, Ring ring, const float* __restrict__ x, int m, float* __restrict__ y, int splits) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int consumers = blockDim.x / 32 - 1, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + static_cast<size_t>(ring.slots) * ring.slot_bytes);
  uint64_t* empty = full + ring.slots;
  uint2* xfrag = reinterpret_cast<uint2*>(empty + ring.slots);
  const int64_t tile_units = (a.kblocks + B / 2 - 1) / (B / 2);
  const Share sh = block_share<kSplits<M, TC>>(tile_units, splits);
  float* group_sx = reinterpret_cast<float*>(xfrag + (TC ? (sh.u_end - sh.u_begin) * 64 * M : 0));
  float* partial = group_sx + a.groups * M;
  if (threadIdx.x == 0) {
    for (int s = 0; s < ring.slots; ++s) mbar_init(full + s, 1), mbar_init(empty + s, consumers * 32);
#if __CUDA_ARCH__ >= 900
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
  }
  __syncthreads();
  if (warp == consumers) {
    produce<B, P, SEGS, kSplits<M, TC>>(a, ring, smem, full, empty, tile_units, splits, lane);
  } else {
    consume<B, P, M, SEGS, TC>(a, ring, smem, full, empty, tile_units, splits, x, m, y, group_sx, partial, xfrag,
                               consumers, warp, lane);
  }
}

// Measured 2026-12-03 at 28672 x 8192 (affine4 g128): a ring of 160 KB in slots of 16 units ran 1.76 TB/s, one of
// 96 KB in slots of 8 units 1.38 (each slot costs every consumer a wait and an arrive).
constexpr int kConsumers = kMaxConsumers;
constexpr int kRingBytes = 160 << 10;
constexpr int kSlotCodeBytes = 12 << 10;  // at least; a slot holds a multiple of kConsumers units

int sm_count() {
  int device = 0, n = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device);
  return n > 0 ? n : 1;
}

constexpr size_t kMaxSmem = 227 << 10;
constexpr size_t kMinRingBytes = 32 << 10;  // the TC decode needs at least this much room for the ring

// The ring's share of shared memory: up to kRingBytes, as much as the rest leaves.
size_t ring_room(const FmaArgs& a, int bits, int m, bool tc, int splits) {
  const size_t besides = smem_besides_ring(a, bits, m, tc, splits, 64, kConsumers);
  const size_t room = besides < kMaxSmem ? kMaxSmem - besides : 0;
  return room < size_t{kRingBytes} ? room : size_t{kRingBytes};
}

// Launches with TC if its shared memory leaves room for a ring of at least kMinRingBytes, else returns false.
template <int B, int P, int M, int SEGS, bool TC>
bool launch_kernel(const FmaArgs& a, int splits, const float* x, int m, float* y, CUstream_st* s) {
  static const bool attribute_set = [] {
    cudaFuncSetAttribute(affine_fma_kernel<B, P, M, SEGS, TC>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(kMaxSmem));
    return true;
  }();
  (void)attribute_set;
  const int unit_code_bytes = P * (B / 2) * kKblockBytes;
  Ring ring{};
  ring.units = kConsumers * ((kSlotCodeBytes + kConsumers * unit_code_bytes - 1) / (kConsumers * unit_code_bytes));
  const int64_t slice = slice_units(a, B, splits);
  if (splits > 1 && slice < ring.units) ring.units = static_cast<int>(slice);  // one slot per tile slice
  ring.slot_bytes = static_cast<uint32_t>(ring.units * (unit_code_bytes + SEGS * 64 * P * (a.meta_f32 ? 2 : 1)));
  const size_t ring_bytes = ring_room(a, B, M, TC, splits);
  if (TC && ring_bytes < kMinRingBytes) return false;
  ring.slots = static_cast<int>(ring_bytes / ring.slot_bytes);
  ring.slots = ring.slots < 2 ? 2 : (ring.slots > 64 ? 64 : ring.slots);
  const int64_t groups = a.row_tiles < sm_count() / splits ? a.row_tiles : sm_count() / splits;
  const size_t smem = static_cast<size_t>(ring.slots) * ring.slot_bytes +
                      smem_besides_ring(a, B, M, TC, splits, ring.slots, kConsumers);
  if (splits > 1) cudaMemsetAsync(y, 0, static_cast<size_t>(m) * a.rows * sizeof(float), s);
  affine_fma_kernel<B, P, M, SEGS, TC>
      <<<static_cast<unsigned>(groups * splits), (kConsumers + 1) * 32, smem, s>>>(a, ring, x, m, y, splits);
  return true;
}

// Affine on the tensor cores, batch 1 at both widths and 2..8 at 4 bits (affine_fma_serves checked that x's
// fragments fit); batch 1 falls back to the CUDA-core decode when they do not.
template <int B, int SEGS>
void launch_affine(const FmaArgs& a, int splits, const float* x, int m, int batch, float* y, CUstream_st* s) {
  if constexpr (B == 4) {
    switch (batch) {
      case 2: launch_kernel<B, 1, 2, SEGS, true>(a, splits, x, m, y, s); return;
      case 4: launch_kernel<B, 1, 4, SEGS, true>(a, splits, x, m, y, s); return;
      case 8: launch_kernel<B, 1, 8, SEGS, true>(a, splits, x, m, y, s); return;
      default: break;
    }
  }
  if (!launch_kernel<B, 1, 1, SEGS, true>(a, 1, x, m, y, s)) launch_kernel<B, 1, 1, SEGS, false>(a, 1, x, m, y, s);
}

template <int B>
void launch_affine_segs(const FmaArgs& a, int segs, int splits, const float* x, int m, int batch, float* y,
                        CUstream_st* s) {
  if (segs == 1) return launch_affine<B, 1>(a, splits, x, m, batch, y, s);
  if (segs == 2) return launch_affine<B, 2>(a, splits, x, m, batch, y, s);
  launch_affine<B, 4>(a, splits, x, m, batch, y, s);
}

FmaArgs affine_args(const AffineMmaDevice& w) {
  return {{w.codes, nullptr}, w.meta,    w.rows, w.cols, w.row_tiles, w.kblocks,
          w.kblocks * mma_kblock_cols(w.bits) / w.group, w.meta_f32};
}

// Batches 2..8: every block reads x (batch x slice floats, in its prologue), so the persistent kernel pays off
// only where that is small against the block's share of the weights. Measured 2026-12-03 (H200, 132 blocks, 4 bits
// g128, us, against affine_mma.cu) with whole rows per block: 28672 x 8192 m = 2 / 4: 64.0 / 70.0 (95.0 / 99.7);
// 128256 x 4096 m = 2 / 4 / 8: 142 / 141 / 174 (156 / 161 / 252); 28672 x 4096 m = 2 / 4 / 8: 39.7 / 43.0 / 57.1
// (49.3 / 51.4 / 66.5); 14336 x 4096 m = 2 / 4 / 8: 23.9 / 26.9 / 37.0 (26.5 / 27.4 / 35.1); 6144 x 4096 m = 2 / 4:
// 14.8 / 18.1 (17.3 / 17.6); 4096 x 4096 m = 2: 11.9 (10.3). So rows >= 20 batch (blocks / splits): x's bytes
// at most 0.4 of the block's weight bytes, where each tile's K is split over `splits` blocks (the smallest of 1, 2,
// 4, 8 that fits). Splitting paid off only on long rows: 4096 x 14336 m = 2 / 4 / 8 in 2 / 4 / 8 slices ran 25.0 /
// 26.7 / 32.1 against affine_mma.cu's 27.4 / 28.2 / 57.8, while rows of 4096 columns lost (4096 x 4096 m = 8 in 8
// slices 22.7 vs 20.4, 6144 x 4096 in 4 slices 21.2 vs 19.2, 14336 x 4096 in 2 slices 36.6 vs 35.1), so tiles of
// fewer than kMinSplitUnits units stay whole. 2 bits lost at most shapes (14336 x 4096 m = 4: 27.3 vs 21.3: the
// 2-bit decode, bound by the CUDA cores at batch 1 already, gains less from reading the weights once), so they keep
// affine_mma.cu.
constexpr int kMaxSplits = 8;
constexpr int64_t kMinSplitUnits = 64;  // 8192 columns; with at most 8 slices no slice is empty

// The K slices per tile for batch 2..8 at 4 bits, or 0 where the persistent kernel does not serve it.
int affine_splits(const AffineMmaDevice& w, int batch) {
  const FmaArgs a = affine_args(w);
  const int max_splits = tile_units(a, w.bits) >= kMinSplitUnits ? kMaxSplits : 1;
  for (int splits = 1; splits <= max_splits; splits *= 2) {
    const int64_t groups = a.row_tiles < sm_count() / splits ? a.row_tiles : sm_count() / splits;
    if (w.rows >= 20 * batch * groups && ring_room(a, w.bits, batch, true, splits) >= kMinRingBytes) return splits;
  }
  return 0;
}

}  // namespace

bool affine_fma_serves(const AffineMmaDevice& w, int batch) {
  if (batch == 1) return fma_group_sums_fit(affine_args(w).groups, 1);
  return w.bits == 4 && batch <= kFmaTcMaxBatch && affine_splits(w, batch) > 0;
}

void launch_affine_fma_kernel(const AffineMmaDevice& w, const float* x, int m, int batch, float* y, CUstream_st* s) {
  const int segs = kUnitCols / w.group;
  if (w.bits == 2) return launch_affine_segs<2>(affine_args(w), segs, 1, x, m, batch, y, s);
  launch_affine_segs<4>(affine_args(w), segs, batch == 1 ? 1 : affine_splits(w, batch), x, m, batch, y, s);
}

void launch_two_plane_kernel(const TwoPlaneDevice& w, const float* x, int m, int batch, float* y, CUstream_st* s) {
  const FmaArgs a{{w.base, w.residual}, w.meta, w.rows, w.cols, w.row_tiles, w.kblocks, w.kblocks, w.meta_f32};
  switch (batch) {
    case 1: launch_kernel<2, 2, 1, 1, false>(a, 1, x, m, y, s); return;
    case 2: launch_kernel<2, 2, 2, 1, false>(a, 1, x, m, y, s); return;
    default: launch_kernel<2, 2, 4, 1, false>(a, 1, x, m, y, s); return;
  }
}

}  // namespace lowbit::kernels::cuda
