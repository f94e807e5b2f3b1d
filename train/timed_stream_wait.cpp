// A stream waiting on an event, optionally timed (see timed_stream_wait.hpp).
#include "timed_stream_wait.hpp"

#include "stableflash/model/cuda/device_array.hpp"

namespace stableflash::train {

using model::cuda::check_cuda;

TimedStreamWait::~TimedStreamWait() {
  for (auto [a, b] : timers_) cudaEventDestroy(a), cudaEventDestroy(b);
}

void TimedStreamWait::wait(cudaEvent_t event, const char* what) {
  if (!measure_) return check_cuda(cudaStreamWaitEvent(waiting_, event), what);
  if (used_ == timers_.size()) {
    cudaEvent_t a = nullptr, b = nullptr;
    check_cuda(cudaEventCreate(&a), "cudaEventCreate (timing)");
    check_cuda(cudaEventCreate(&b), "cudaEventCreate (timing)");
    timers_.push_back({a, b});
  }
  // The time between these two events on the waiting stream is how long it stood still.
  const auto [before, after] = timers_[used_++];
  check_cuda(cudaEventRecord(before, waiting_), "cudaEventRecord (timing)");
  check_cuda(cudaStreamWaitEvent(waiting_, event), what);
  check_cuda(cudaEventRecord(after, waiting_), "cudaEventRecord (timing)");
}

double TimedStreamWait::take_ms() {
  check_cuda(cudaStreamSynchronize(waiting_), "cudaStreamSynchronize (wait timing)");
  double ms = 0;
  for (std::size_t i = 0; i < used_; ++i) {
    float t = 0;
    check_cuda(cudaEventElapsedTime(&t, timers_[i].first, timers_[i].second), "cudaEventElapsedTime");
    ms += t;
  }
  used_ = 0;
  return ms;
}

}  // namespace stableflash::train
