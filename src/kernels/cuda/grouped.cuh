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
  const int32_t* x_rows;  // the group's x row indices (ExpertGroups::x_rows from start on), or null
};
__device__ __forceinline__ BlockGroup group_of_block(const ExpertGroups& g) {
  const int z = static_cast<int>(blockIdx.z);
  const int count = g.count[z];
  if (count <= 0) return {{}, 0, 0, nullptr};
  const int start = g.start[z];
  return {g.experts[g.expert[z]], start, count, g.x_rows ? g.x_rows + start : nullptr};
}

// Row i of the block's x: x + i cols (x already at the group's first row), or row x_rows[i] of x when the launch
// gathers. Plain launches keep x_rows a constant null, so their code is unchanged.
__device__ __forceinline__ const float* group_x_row(const float* x, const int32_t* x_rows, int i, int64_t cols) {
  return x_rows ? x + static_cast<int64_t>(x_rows[i]) * cols : x + i * cols;
}

}  // namespace lowbit::kernels::cuda
