// A stream waiting on an event, optionally timed: CUDA events bracket each wait on the waiting
// stream, so their elapsed time is how long that stream stood still. Used by ZeRO-1's
// communication waits (data_parallel_sync) and the overlapped optimizer (update_overlap), whose
// waits `stableflash bench train` reports. CUDA builds only; private to train/.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>
#include <vector>

namespace stableflash::train {

class TimedStreamWait {
 public:
  explicit TimedStreamWait(cudaStream_t waiting) : waiting_(waiting) {}
  ~TimedStreamWait();
  TimedStreamWait(const TimedStreamWait&) = delete;
  TimedStreamWait& operator=(const TimedStreamWait&) = delete;

  void measure(bool on) { measure_ = on; }
  // The waiting stream waits for `event` (what: the call's name in error messages).
  void wait(cudaEvent_t event, const char* what);
  // Synchronizes the waiting stream; the milliseconds it stood waiting since the last call.
  double take_ms();

 private:
  cudaStream_t waiting_;
  bool measure_ = false;
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> timers_;  // around each timed wait, reused
  std::size_t used_ = 0;
};

}  // namespace stableflash::train
