// A device allocation that frees itself, for the kernel lab's stand-alone modes
// (lab/backward_parts.cu, lab/forward_timeline.cu). Host header.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <vector>

#include "launch.hpp"

namespace stableflash::attention::cuda::lab {

template <class T>
struct DeviceBuffer {
  T* ptr = nullptr;
  std::size_t n = 0;
  explicit DeviceBuffer(std::size_t count) : n(count) {
    check_cuda(cudaMalloc(&ptr, std::max<std::size_t>(n, 1) * sizeof(T)), "cudaMalloc");
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(ptr); }
  std::size_t bytes() const { return n * sizeof(T); }
  std::vector<unsigned char> download() const {
    std::vector<unsigned char> h(bytes());
    check_cuda(cudaMemcpy(h.data(), ptr, bytes(), cudaMemcpyDeviceToHost), "cudaMemcpy");
    return h;
  }
};

}  // namespace stableflash::attention::cuda::lab
