// The device side of the grouped expert launches (matvec.h: ExpertGroups): which group a block serves.
#pragma once

#include <cuda_runtime.h>

#include "matvec.h"

namespace lowbit::kernels::cuda {

// Block z of a grouped launch serves group z: its expert's arrays, its first row in x and y and its row count (0:
// an empty group, whose block exits; every block of a cluster shares blockIdx.z, so whole clusters exit together).
struct BlockGroup {
  ExpertArrays w;
  int64_t start;
  int count;
};
__device__ __forceinline__ BlockGroup group_of_block(const ExpertGroups& g) {
  const int z = static_cast<int>(blockIdx.z);
  const int count = g.count[z];
  if (count <= 0) return {{}, 0, 0};
  return {g.experts[g.expert[z]], g.start[z], count};
}

}  // namespace lowbit::kernels::cuda
