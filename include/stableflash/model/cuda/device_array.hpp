// Owning device memory for the CUDA model and optimizer: one typed allocation, freed on
// destruction, moved but never copied. Errors throw std::runtime_error naming the operation, and
// an allocation that does not fit says how much was asked and how much the device has free.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>

namespace stableflash::model::cuda {

inline void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(err));
}

template <class T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(std::size_t n) : n_(n) {
    if (n == 0) return;
    const cudaError_t err = cudaMalloc(&ptr_, n * sizeof(T));
    if (err != cudaSuccess) {
      cudaGetLastError();  // clear the error, so later CUDA calls do not report it again
      std::size_t free_bytes = 0, total = 0;
      cudaMemGetInfo(&free_bytes, &total);
      throw std::runtime_error("out of GPU memory: asked for " + std::to_string(n * sizeof(T) >> 20) + " MiB, " +
                               std::to_string(free_bytes >> 20) + " MiB free of " + std::to_string(total >> 20) +
                               " MiB (" + cudaGetErrorString(err) + "); try a smaller train.batch_size with more train.grad_accum");
    }
  }
  ~DeviceArray() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceArray(DeviceArray&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    if (this != &o) {
      if (ptr_) cudaFree(ptr_);
      ptr_ = std::exchange(o.ptr_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return ptr_; }
  std::size_t size() const { return n_; }
  std::size_t bytes() const { return n_ * sizeof(T); }
  bool empty() const { return n_ == 0; }

  void upload(const T* host, std::size_t n, cudaStream_t stream, std::size_t offset = 0) {
    check_range(offset, n);
    check_cuda(cudaMemcpyAsync(ptr_ + offset, host, n * sizeof(T), cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync (upload)");
  }
  void download(T* host, std::size_t n, cudaStream_t stream, std::size_t offset = 0) const {
    check_range(offset, n);
    check_cuda(cudaMemcpyAsync(host, ptr_ + offset, n * sizeof(T), cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync (download)");
  }
  void zero(cudaStream_t stream) {
    if (n_) check_cuda(cudaMemsetAsync(ptr_, 0, bytes(), stream), "cudaMemsetAsync");
  }

 private:
  void check_range(std::size_t offset, std::size_t n) const {
    if (offset + n > n_) throw std::out_of_range("DeviceArray: " + std::to_string(offset + n) + " elements past " + std::to_string(n_));
  }
  T* ptr_ = nullptr;
  std::size_t n_ = 0;
};

}  // namespace stableflash::model::cuda
