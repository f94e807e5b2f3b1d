// The optimizer step on its own stream, overlapped with the next forward (see update_overlap.hpp).
#include "update_overlap.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "stableflash/model/cuda/device_array.hpp"

namespace stableflash::train {

using model::cuda::check_cuda;

UpdateOverlap::UpdateOverlap(std::vector<optim::FlatRange> parts, cudaStream_t compute)
    : parts_(std::move(parts)), compute_(compute), waits_(compute) {
  int least = 0, greatest = 0;  // CUDA numbers priorities downwards: `least` is the largest number
  check_cuda(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
  // The lowest priority, below the compute stream's: the update's blocks take what the forward
  // leaves (wave tails, gaps between kernels, room beside attention CTAs), and where the forward
  // reaches a part that is not done it waits while the update runs alone. (The highest priority
  // measured the same on the H200: 32.25 against 32.20 ms per step, docs/benchmarks.md.)
  check_cuda(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, least), "cudaStreamCreateWithPriority (optimizer)");
  check_cuda(cudaEventCreateWithFlags(&computed_, cudaEventDisableTiming), "cudaEventCreate");
  updated_.resize(parts_.size());
  pending_.assign(parts_.size(), false);
  for (auto& e : updated_) check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
}

UpdateOverlap::~UpdateOverlap() {
  if (stream_) cudaStreamSynchronize(stream_);
  cudaStreamSynchronize(compute_);  // its waits on the events below
  for (auto e : updated_) cudaEventDestroy(e);
  if (computed_) cudaEventDestroy(computed_);
  if (stream_) cudaStreamDestroy(stream_);
}

void UpdateOverlap::after_compute() {
  check_cuda(cudaEventRecord(computed_, compute_), "cudaEventRecord (before the update)");
  check_cuda(cudaStreamWaitEvent(stream_, computed_), "cudaStreamWaitEvent (before the update)");
}

void UpdateOverlap::part_updated(int k) {
  if (k < 0 || k >= int(parts_.size())) throw std::logic_error("UpdateOverlap: part " + std::to_string(k) + " does not exist");
  check_cuda(cudaEventRecord(updated_[std::size_t(k)], stream_), "cudaEventRecord (part updated)");
  pending_[std::size_t(k)] = true;
}

void UpdateOverlap::parameters_needed(std::int64_t offset, std::int64_t count) {
  const auto [first, last] = optim::ranges_touching(parts_, {offset, offset + count});
  for (int part = first; part < last; ++part) {
    const std::size_t k = std::size_t(part);
    if (!pending_[k]) continue;
    pending_[k] = false;
    waits_.wait(updated_[k], "cudaStreamWaitEvent (part updated)");
  }
}

void UpdateOverlap::wait_for_all_parameters() {
  if (!parts_.empty()) parameters_needed(parts_.front().begin, parts_.back().end - parts_.front().begin);
}

bool UpdateOverlap::parameters_pending() const { return std::find(pending_.begin(), pending_.end(), true) != pending_.end(); }

void UpdateOverlap::synchronize() { check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (optimizer)"); }

double UpdateOverlap::take_wait_ms() { return waits_.take_ms(); }

}  // namespace stableflash::train
