// Device helpers of the tensor-core kernels that read the tensor-core layout (AffineMmaDevice in matvec.h):
// cp.async copies, bf16 mma.sync, the hi + lo split of activations and the decoding of codes into A fragments.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace lowbit::kernels::cuda {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// Copies of `bytes` (at most the width; the rest of the destination is zero-filled) from global to shared memory.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int bytes = 16) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async8(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src, int bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(smem_addr(dst)), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint2 b) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b.x), "r"(b.y));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// (hi, lo) bf16 pairs with hi + lo = (f0, f1) to within 2^-17 relative; returns the sum of the represented values.
__device__ __forceinline__ float split_pair(float f0, float f1, uint32_t& hi, uint32_t& lo) {
  hi = pack_bf16(f0, f1);
  const float h0 = __uint_as_float(hi << 16), h1 = __uint_as_float(hi & 0xFFFF0000u);
  lo = pack_bf16(f0 - h0, f1 - h1);
  return (h0 + __uint_as_float(lo << 16)) + (h1 + __uint_as_float(lo & 0xFFFF0000u));
}

// The code scale K: a code q enters the product as the bf16 2 + q / K.
template <int B>
constexpr float kCodeScale = B == 4 ? 8.0f : 2.0f;

// A fragment register i of k16 step j from the lane's 16 bytes (matvec.h): bf16 pairs 2 + q / K, the code moved
// from bit `at` (and at + 16) to the top of the mantissa (bits 3-6 for 4 bits, 5-6 for 2 bits).
template <int B>
__device__ __forceinline__ void decode_a(const uint4& v, int j, uint32_t (&a)[4]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  constexpr int kTop = 7 - B;
  constexpr uint32_t kMask = ((1u << B) - 1) << kTop;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t word = B == 4 ? w[j] : w[j / 2];
    const int at = B == 4 ? 4 * i : 2 * (4 * (j % 2) + i);
    const uint32_t moved = at >= kTop ? word >> (at - kTop) : word << (kTop - at);
    a[i] = (moved & (kMask | kMask << 16)) | 0x40004000u;
  }
}

// Fragment slot of lane `lane` in k16 step j: rows of lanes swizzled by the step, so that the conversion's
// stores (one activation row, several steps per warp) spread over the banks; readers stay conflict-free.
__device__ __forceinline__ int frag_lane(int lane, int j) { return lane ^ ((j & 7) << 2); }

}  // namespace lowbit::kernels::cuda
