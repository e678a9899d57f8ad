// Thread-block-cluster helpers of the kernels that split K over a cluster and add the blocks' partial sums
// through distributed shared memory. Before sm_90 a cluster is one block: the helpers fall back to the block.
#pragma once

#include <cooperative_groups.h>

namespace lowbit::kernels::cuda {

__device__ __forceinline__ void cluster_sync() {
#if __CUDA_ARCH__ >= 900
  cooperative_groups::this_cluster().sync();
#else
  __syncthreads();
#endif
}

// `p` (a shared-memory address in this block) as the same address in the block of cluster rank `rank`.
__device__ __forceinline__ const float* cluster_partial(float* p, int rank) {
#if __CUDA_ARCH__ >= 900
  return cooperative_groups::this_cluster().map_shared_rank(p, rank);
#else
  return p;
#endif
}

}  // namespace lowbit::kernels::cuda
