// Thread-block-cluster helpers of the kernels that split K over a cluster and add the blocks' partial sums
// through distributed shared memory (affine_mma.cu, the prefill GEMMs): the device side, and the host side's launch
// configuration and residency query. Before sm_90 a cluster is one block: the helpers fall back to the block.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

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

// A launch of `grid` blocks of `threads` with clusters of `split` blocks along x; without the cluster attribute
// when `clusters` is false (before sm_90, where split is 1). cfg points into the object, so it is not copied.
struct ClusterLaunch {
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute cluster[1] = {};
  ClusterLaunch(dim3 grid, int threads, int split, bool clusters, size_t smem_bytes, cudaStream_t stream) {
    cfg.gridDim = grid;
    cfg.blockDim = dim3(static_cast<unsigned>(threads));
    cfg.dynamicSmemBytes = smem_bytes;
    cfg.stream = stream;
    cluster[0].id = cudaLaunchAttributeClusterDimension;
    cluster[0].val.clusterDim.x = static_cast<unsigned>(split);
    cluster[0].val.clusterDim.y = 1;
    cluster[0].val.clusterDim.z = 1;
    cfg.attrs = cluster;
    cfg.numAttrs = clusters ? 1 : 0;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

// How many blocks of `kernel` (`threads`, `smem_bytes` of dynamic shared memory, whose limit it sets) fit the device
// at once: alone, and as clusters of 2, 4 and 8 blocks (clusters_of[i]: clusters of 2^i blocks, 0 where the query
// fails or before sm_90). A cluster's blocks share a GPC, so fewer blocks may fit in clusters than alone.
struct ClusterResidency {
  static constexpr int kSizes = 4;  // clusters of 1, 2, 4, 8 blocks (8: the portable cluster size)
  bool clusters = false;
  int64_t blocks = 1;
  int clusters_of[kSizes] = {0, 0, 0, 0};
  template <class Kernel>
  ClusterResidency(Kernel kernel, int threads, size_t smem_bytes) {
    int dev = 0, sms = 1, major = 0, blocks_per_sm = 1;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem_bytes));
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, kernel, threads, smem_bytes);
    blocks = std::max<int64_t>(int64_t{sms} * std::max(blocks_per_sm, 1), 1);
    clusters = major >= 9;
    for (int i = 1; i < kSizes && clusters; ++i) {
      const ClusterLaunch config(dim3(1u << i), threads, 1 << i, true, smem_bytes, nullptr);
      if (cudaOccupancyMaxActiveClusters(&clusters_of[i], kernel, &config.cfg) != cudaSuccess) {
        clusters_of[i] = 0;
        cudaGetLastError();  // a failed query is not an error of the next launch
      }
    }
  }
};

}  // namespace lowbit::kernels::cuda
