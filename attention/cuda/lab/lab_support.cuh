// What the kernel lab's stand-alone modes (lab/backward_parts.cu, lab/forward_timeline.cu) share:
// device allocations that free themselves, the counter hash their input fills draw from, and event
// timing.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
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
  std::vector<unsigned char> download() const { return copy_out<unsigned char>(bytes()); }
  std::vector<T> values() const { return copy_out<T>(n); }  // the same bytes as download(), as elements

 private:
  template <class U>
  std::vector<U> copy_out(std::size_t count) const {
    std::vector<U> h(count);
    check_cuda(cudaMemcpy(h.data(), ptr, bytes(), cudaMemcpyDeviceToHost), "cudaMemcpy");
    return h;
  }
};

// 64 random bits for element i of a fill seeded with `seed` (SplitMix64's finalizer on a counter).
__host__ __device__ inline std::uint64_t counter_hash(std::uint64_t seed, std::uint64_t i) {
  std::uint64_t z = seed * 0x9e3779b97f4a7c15ull + i + 1;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Two CUDA events on the default stream, destroyed with the object: start(), then stop_us() gives
// the microseconds since (waiting for the stop event); reusable for the next start().
class EventPair {
 public:
  EventPair() {
    check_cuda(cudaEventCreate(&start_), "cudaEventCreate");
    check_cuda(cudaEventCreate(&stop_), "cudaEventCreate");
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
  ~EventPair() { cudaEventDestroy(start_), cudaEventDestroy(stop_); }
  void start() { check_cuda(cudaEventRecord(start_), "cudaEventRecord"); }
  double stop_us() {
    check_cuda(cudaEventRecord(stop_), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(stop_), "cudaEventSynchronize");
    float ms = 0.0f;
    check_cuda(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
    return double(ms) * 1e3;
  }

 private:
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

// The mean time of `repeats` launches issued back to back (no flush, nothing between them), in
// microseconds. The caller warms up first.
inline double back_to_back_us(const std::function<void()>& launch, int repeats) {
  EventPair events;
  events.start();
  for (int r = 0; r < repeats; ++r) launch();
  return events.stop_us() / repeats;
}

}  // namespace stableflash::attention::cuda::lab
