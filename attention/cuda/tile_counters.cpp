// The warp-specialized forward's dynamic tile schedule: per device kSlots counter pairs, zeroed once
// (launch.hpp, next_tile_counters). Each launch's last CTA zeroes its pair again, so the pairs stay
// ready without a memset per call, which would also stand between the forward and the kernel
// before it (launch_after_previous). The allocation (2 KB a device) lives as long as the process.
#include <cuda_runtime.h>

#include <cstddef>
#include <mutex>
#include <vector>

#include "launch.hpp"

namespace stableflash::attention::cuda {

int* next_tile_counters(cudaStream_t stream) {
  constexpr int kSlots = 256;  // launches in flight at once, at most
  struct DevicePairs {
    int* pairs = nullptr;
    unsigned next = 0;
  };
  static std::mutex mutex;
  static std::vector<DevicePairs> devices;
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  const std::lock_guard lock(mutex);
  if (devices.size() <= std::size_t(device)) devices.resize(std::size_t(device) + 1);
  DevicePairs& d = devices[std::size_t(device)];
  if (!d.pairs) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    check_cuda(cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing");
    if (capture != cudaStreamCaptureStatusNone) return nullptr;
    constexpr std::size_t kBytes = 2 * kSlots * sizeof(int);
    check_cuda(cudaMalloc(&d.pairs, kBytes), "cudaMalloc (tile counters)");
    check_cuda(cudaMemsetAsync(d.pairs, 0, kBytes, stream), "cudaMemsetAsync (tile counters)");
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize (tile counters)");  // once: other streams may use them next
  }
  return d.pairs + 2 * (d.next++ % kSlots);
}

}  // namespace stableflash::attention::cuda
