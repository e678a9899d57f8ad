// CUDA kernels: a weight is prepared once from its stored arrays (uploaded, possibly re-laid out for the GPU,
// never expanded to a dense matrix) and then multiplies activations that live on the device. The artifact on
// disk is the same for every device; docs/CUDA.md lists the device layouts. This header needs no CUDA headers,
// so host code that only drives the kernels compiles with the plain C++ compiler.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "lowbit/codec/codec.h"

struct CUstream_st;

namespace lowbit::kernels::cuda {

using Stream = CUstream_st*;  // cudaStream_t; nullptr is the default stream

// Activation rows one matmul call takes; decode batches larger than this go through the prefill path.
inline constexpr int kMaxBatch = 16;

// True when a CUDA device is usable; otherwise `why` (if given) says why, e.g. for a test's skip message.
bool device_available(std::string* why = nullptr);

// Name, multiprocessor count and memory of device 0, one line (for benchmark headers).
std::string device_summary();

// Throws Errc::internal naming `op` when the last launch or asynchronous work failed.
void check_last_error(const char* op);
void synchronize(const char* op);

// An owning device allocation of raw bytes.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  void* data() const { return data_; }
  size_t size() const { return size_; }
  template <class T>
  T* as() const { return static_cast<T*>(data_); }
  // Synchronous copies of `bytes` (at most size()) to and from host memory.
  void upload(const void* host, size_t bytes);
  void download(void* host, size_t bytes) const;
  // Fills every byte with `value` (tests poison outputs with 0xFF: NaN in f32).
  void fill(uint8_t value);

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

// A prepared weight W of logical shape [rows, cols] = [out_features, in_features] on the device.
class CudaLinear {
 public:
  virtual ~CudaLinear() = default;
  virtual int64_t rows() const = 0;
  virtual int64_t cols() const = 0;
  // y [m, rows] = x [m, cols] @ W^T for 1 <= m <= kMaxBatch; x and y are contiguous f32 device arrays.
  // Asynchronous on `stream` (capturable in a CUDA graph): no allocation, no synchronization.
  virtual void matmul(const float* x, int m, float* y, Stream stream) const = 0;
  // y [m, rows] = x [m, cols] @ W^T for any m >= 1 (prefill). Codecs with a prefill GEMM kernel run it on the
  // tensor cores; the others (this default) run matmul over chunks of kMaxBatch rows. Same contract as matmul:
  // asynchronous, no allocation.
  virtual void gemm(const float* x, int64_t m, float* y, Stream stream) const;
  // Bytes of weight data one matmul reads (codes and metadata as stored), for effective-bandwidth figures.
  virtual uint64_t weight_bytes() const = 0;
};

// The experts of one Mixture-of-Experts role of a layer (each expert's stacked gate/up, or its down), every one an
// ordinary prepared weight of the same shape and layout, plus a device table of their arrays: grouped_matmul
// multiplies groups of activation rows by the experts that device arrays name (written by the router kernel of the
// same step), reading only those experts' weights, without a host round trip (capturable in a CUDA graph).
class CudaExperts {
 public:
  // Device arrays of up to max_groups groups: group z multiplies rows start[z] .. start[z] + count[z] - 1 of x
  // [.., cols] by expert[z]'s weight into the same rows of y [.., rows]; count[z] == 0: no group. With x_rows,
  // row i of the groups reads x row x_rows[i] instead (a gather folded into the matmul).
  struct Groups {
    const int32_t* expert = nullptr;
    const int32_t* start = nullptr;
    const int32_t* count = nullptr;
    int max_groups = 0;
    const int32_t* x_rows = nullptr;
  };
  // Errc::unsupported when the experts' layout has no grouped kernel (e.g. trellis, affine 3/5/6, affine 2 in groups of
  // 16) or when their shapes or layouts differ; `what` names them in the message.
  CudaExperts(std::vector<std::unique_ptr<CudaLinear>> experts, std::string_view what);
  ~CudaExperts();
  CudaExperts(const CudaExperts&) = delete;
  CudaExperts& operator=(const CudaExperts&) = delete;

  int64_t count() const;
  int64_t rows() const;
  int64_t cols() const;
  const CudaLinear& expert(int64_t e) const;
  // Every group's count must be <= batch (1..kMaxBatch), which sizes the kernels' batch width. Asynchronous.
  void grouped_matmul(const float* x, const Groups& groups, int batch, float* y, Stream stream) const;
  // Bytes of all experts' weights.
  uint64_t weight_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Prepares a validated tensor for the GPU (Errc::unsupported when no CUDA kernel exists for its codec).
std::unique_ptr<CudaLinear> prepare_cuda(const codec::TensorRef& tensor);

}  // namespace lowbit::kernels::cuda
