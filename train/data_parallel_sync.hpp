// The gradient and parameter traffic of one data-parallel step, bucket by bucket, as the shard
// plan says (stableflash/optim/sharding.hpp). CUDA builds only; private to train/.
//
//   backward of the step's last micro-batch: each time the backward finishes gradients down to a
//     bucket's start (the model's gradient-ready hook), that bucket is reduce-scattered (sharded)
//     or all-reduced (replicated) on the communication stream, overlapping the rest of the
//     backward; at its end the compute stream waits for the last one (an exposed wait);
//   optimizer step: after each sharded bucket's owned piece is updated, its FP32 parameters are
//     all-gathered in place and the received pieces cast to the BF16 copy, on the communication
//     stream, while the next bucket updates;
//   next forward: before it reads a range (the model's parameters-needed hook), the compute
//     stream waits for the gathers of the buckets in it (an exposed wait when not done yet).
// Every rank thus holds identical FP32 master weights and BF16 copies after each step.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "cuda_collectives.hpp"
#include "stableflash/optim/sharding.hpp"
#include "timed_stream_wait.hpp"

namespace stableflash::train {

class DataParallelSync {
 public:
  DataParallelSync(Collectives& collectives, optim::ShardPlan plan, cudaStream_t compute);
  ~DataParallelSync();
  DataParallelSync(const DataParallelSync&) = delete;
  DataParallelSync& operator=(const DataParallelSync&) = delete;

  const optim::ShardPlan& plan() const { return plan_; }

  // Around the backward of a step's last micro-batch; gradient_ready is the model's hook. Throws
  // std::logic_error naming the rank when the backward announces ranges out of order or misses some.
  void begin_backward(float* grads);
  void gradient_ready(std::int64_t offset, std::int64_t count);
  void end_backward();

  // Queues the all-gather of bucket `bucket` after the compute stream's work so far (its update).
  // Replicated buckets: nothing to do (every rank updated all of it).
  void gather_after_update(int bucket, float* params, __nv_bfloat16* params_bf16);
  // The compute stream waits for the gathers of the buckets touching [offset, offset + count) that
  // it has not waited for yet (the forward's parameters-needed hook).
  void parameters_needed(std::int64_t offset, std::int64_t count);
  // The same for every bucket: before anything else reads or writes the parameters.
  void wait_for_all_parameters();
  bool parameters_pending() const;

  // Exposed communication: with measuring on, each wait of the compute stream above is bracketed
  // by timing events. take_wait_ms() synchronizes the compute stream and returns the milliseconds
  // it spent waiting since the last call.
  void measure_waits(bool on) { waits_.measure(on); }
  double take_wait_ms();

 private:
  void issue_reduction(int bucket);
  void compute_waits(cudaEvent_t event);

  Collectives& coll_;
  optim::ShardPlan plan_;
  cudaStream_t compute_;
  std::vector<cudaEvent_t> ready_;     // per bucket: compute reached its reduction / its update
  std::vector<cudaEvent_t> gathered_;  // per bucket: its all-gather and BF16 cast are done
  std::vector<bool> pending_;          // per bucket: gathered_ not yet waited for by the compute stream
  cudaEvent_t reduced_ = nullptr;      // every reduction of the backward is done
  float* grads_ = nullptr;
  std::int64_t frontier_ = 0;          // the backward has finished gradients [frontier_, total)
  int next_bucket_ = -1;               // the highest bucket not yet reduced
  TimedStreamWait waits_;              // the compute stream's exposed waits
};

}  // namespace stableflash::train
