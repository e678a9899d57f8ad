// The trellis codes on the device (trellis.cu, trellis_fma.cu): state -> exact float value, as
// codec/trellis.cpp decodes it. No int-to-float conversion (a quarter-rate instruction) on the hot path:
//   1MAD: dp4a(x, 0x01010101, bits(1.5 * 2^23) - 510) is the bit pattern of 1.5 * 2^23 + (sum - 510), so one
//         FADD gives the integer byte sum - 510; the factor 1 / 147.8005... joins the row scale at the end.
//   3INST: the f16 sum of the two masked halves, converted exactly.
// Both values have at most 11 significant bits, so they are exact in tf32 too.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace lowbit::kernels::cuda {

inline constexpr float kTrellisMad1Scale = 1.0f / 147.800537109375f;

template <bool kMad1>
__device__ __forceinline__ float trellis_code(uint32_t s) {
  if constexpr (kMad1) {
    return __uint_as_float(__dp4a(s * 34038481u + 76625530u, 0x01010101u, 0x4B400000u - 510u)) - 12582912.0f;
  } else {
    const uint32_t r = ((s * 89226354u + 64248484u) & 0x8FFF8FFFu) ^ 0x3B603B60u;
    const __half sum = __hadd(__ushort_as_half(static_cast<unsigned short>(r & 0xFFFFu)),
                              __ushort_as_half(static_cast<unsigned short>(r >> 16)));
    return __half2float(sum);
  }
}

}  // namespace lowbit::kernels::cuda
