// The one-GPU optimizer step overlapped with the next step's forward (train.overlap_optimizer;
// also all-reduce data parallelism, where every rank runs the whole step). CUDA builds only;
// private to train/.
//
//   after the backward: the optimizer's stream waits for the compute stream (everything queued
//     there so far: the backward, and a data-parallel run's gradient reduction), then computes the
//     gradient norm and the clipping factor on the device and updates the parameters part by part
//     in the order the forward reads them (the embeddings, layer 0, ..., layer L-1, ln_f),
//     recording an event after each part (part_updated);
//   next forward: before it reads a part (the model's parameters-needed hook, the one ZeRO-1 uses
//     for its all-gather), the compute stream waits for that part's event, so the forward of layer
//     0 runs while layers 1, 2, ... update.
// Anything else that reads or writes the parameters (checkpoints, probes, set_params) first waits
// for every part (wait_for_all_parameters). The optimizer's stream has the device's lowest priority,
// below the compute stream's: the update fills what the forward leaves of the GPU, and runs alone
// where the forward waits for it.
//
// The update's arithmetic is unchanged (the same kernels and sums in the same order, only on
// another stream), so an overlapped run has the bits of one that updates on the compute stream.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "stableflash/optim/sharding.hpp"
#include "timed_stream_wait.hpp"

namespace stableflash::train {

class UpdateOverlap {
 public:
  // `parts`: ascending and contiguous (optim::forward_order_parts). Creates the optimizer's stream
  // (the device's highest priority) and one event per part.
  UpdateOverlap(std::vector<optim::FlatRange> parts, cudaStream_t compute);
  ~UpdateOverlap();
  UpdateOverlap(const UpdateOverlap&) = delete;
  UpdateOverlap& operator=(const UpdateOverlap&) = delete;

  cudaStream_t stream() const { return stream_; }
  const std::vector<optim::FlatRange>& parts() const { return parts_; }

  // The optimizer's stream waits for everything queued on the compute stream so far.
  void after_compute();
  // Part k's update is queued on the optimizer's stream: records its event.
  void part_updated(int k);
  // The compute stream waits for the updates of the parts touching [offset, offset + count) that
  // it has not waited for yet (the forward's parameters-needed hook).
  void parameters_needed(std::int64_t offset, std::int64_t count);
  // The same for every part: before anything else reads or writes the parameters.
  void wait_for_all_parameters();
  bool parameters_pending() const;
  // The host waits for the optimizer's stream.
  void synchronize();

  // With measuring on, each wait of the compute stream is bracketed by timing events;
  // take_wait_ms() synchronizes the compute stream and returns the milliseconds it stood waiting
  // since the last call.
  void measure_waits(bool on) { waits_.measure(on); }
  double take_wait_ms();

 private:
  std::vector<optim::FlatRange> parts_;
  cudaStream_t compute_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t computed_ = nullptr;     // the compute stream's work before the update
  std::vector<cudaEvent_t> updated_;   // per part: its update is done
  std::vector<bool> pending_;          // per part: updated_ not yet waited for by the compute stream
  TimedStreamWait waits_;              // the compute stream's waits for parts
};

}  // namespace stableflash::train
