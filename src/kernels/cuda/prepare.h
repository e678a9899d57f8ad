// Host-side re-expressions behind prepare_cuda and its kernel table, visible to the tests (they run without a GPU).
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "lowbit/codec/codec.h"
#include "lowbit/kernels/cuda.h"

namespace lowbit::kernels::cuda {

// An offset_scale tensor as the equal affine tensor (same code bits; f32 scales, biases = -offset * scale),
// which the affine kernels run.
codec::EncodedTensor offset_scale_as_affine(const codec::TensorRef& tensor);

// One row per codec id: how prepare_cuda uploads a tensor of that codec, and which valid tensors of it have no
// CUDA kernel. no_kernel (nullptr where every tensor runs) returns the message prepare_cuda refuses such a tensor
// with (Errc::unsupported), empty where the tensor runs; the tests check every codec's examples against it.
struct CudaKernelEntry {
  std::string_view codec_id;
  std::unique_ptr<CudaLinear> (*prepare)(const codec::TensorRef& tensor);
  std::string (*no_kernel)(const codec::TensorRef& tensor) = nullptr;
};

std::span<const CudaKernelEntry> cuda_kernel_table();

}  // namespace lowbit::kernels::cuda
