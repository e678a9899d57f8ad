// Device discovery, error checking and device buffers: the only place that turns CUDA status codes into
// lowbit errors.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "lowbit/core/error.h"
#include "lowbit/kernels/cuda.h"

namespace lowbit::kernels::cuda {

namespace {
void check(cudaError_t status, const char* op) {
  if (status != cudaSuccess) fail(Errc::internal, "[{}] CUDA error: {}", op, cudaGetErrorString(status));
}
}  // namespace

bool device_available(std::string* why) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    if (why) *why = status != cudaSuccess ? cudaGetErrorString(status) : "no CUDA device";
    cudaGetLastError();  // clear the sticky "no device" status
    return false;
  }
  return true;
}

std::string device_summary() {
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, 0), "device_summary");
  return fmt::format("{}, sm_{}{}, {} SMs, {:.0f} GiB, L2 {} MiB", p.name, p.major, p.minor, p.multiProcessorCount,
                     static_cast<double>(p.totalGlobalMem) / (1 << 30), p.l2CacheSize >> 20);
}

void check_last_error(const char* op) { check(cudaGetLastError(), op); }

void synchronize(const char* op) {
  check(cudaDeviceSynchronize(), op);
  check(cudaGetLastError(), op);
}

DeviceBuffer::DeviceBuffer(size_t bytes) : size_(bytes) {
  if (bytes > 0) check(cudaMalloc(&data_, bytes), "cudaMalloc");
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_) cudaFree(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (data_) cudaFree(data_);
}

void DeviceBuffer::upload(const void* host, size_t bytes) {
  if (bytes > size_) fail(Errc::internal, "[DeviceBuffer::upload] {} bytes into a buffer of {}", bytes, size_);
  if (bytes > 0) check(cudaMemcpy(data_, host, bytes, cudaMemcpyHostToDevice), "DeviceBuffer::upload");
}

void DeviceBuffer::download(void* host, size_t bytes) const {
  if (bytes > size_) fail(Errc::internal, "[DeviceBuffer::download] {} bytes from a buffer of {}", bytes, size_);
  if (bytes > 0) check(cudaMemcpy(host, data_, bytes, cudaMemcpyDeviceToHost), "DeviceBuffer::download");
}

void DeviceBuffer::fill(uint8_t value) {
  if (size_ > 0) check(cudaMemset(data_, value, size_), "DeviceBuffer::fill");
}

void CudaLinear::gemm(const float* x, int64_t m, float* y, Stream stream) const {
  if (m < 1) fail(Errc::internal, "[CudaLinear::gemm] {} rows", m);
  for (int64_t row = 0; row < m; row += kMaxBatch) {
    const int rows_now = static_cast<int>(std::min<int64_t>(kMaxBatch, m - row));
    matmul(x + row * cols(), rows_now, y + row * rows(), stream);
  }
}

}  // namespace lowbit::kernels::cuda
