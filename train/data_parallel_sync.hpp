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
//
// With the plan's token embedding split (optim/sharding.hpp), wte's bucket goes out as soon as the
// classifier's product is queued (the model's dense-ready hook), before every layer's; the
// embedding lookup's rows (written apart by the model, one per distinct token of the batch) go at
// the end only to the rank that owns them, counted ahead (an all-gather of per-owner counts queued
// before the forward), and the owner adds them to its reduced wte rows in rank order:
//   owner's wte gradient = (sum over ranks of the dense parts, NCCL) + rows of rank 0 + rows of rank 1 + ...
// instead of sum over ranks of (dense + rows): a different FP32 summation order than without the
// split (and than one GPU), fixed for a given world size, and the same in ZeRO-1 and all-reduce.
// What stays exposed after the backward: the lowest buckets (wpe, layer 0) and these rows.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "cuda_collectives.hpp"
#include "stableflash/model/cuda/device_array.hpp"
#include "stableflash/optim/sharding.hpp"
#include "timed_stream_wait.hpp"

namespace stableflash::train {

class DataParallelSync {
 public:
  // max_rows: the most rows (batch x sequence) of a micro-batch (the split's row buffers).
  DataParallelSync(Collectives& collectives, optim::ShardPlan plan, cudaStream_t compute, std::int64_t max_rows);
  ~DataParallelSync();
  DataParallelSync(const DataParallelSync&) = delete;
  DataParallelSync& operator=(const DataParallelSync&) = delete;

  const optim::ShardPlan& plan() const { return plan_; }

  // Around the backward of a step's last micro-batch; gradient_ready is the model's hook. Throws
  // std::logic_error naming the rank when the backward announces ranges out of order or misses some.
  // With the token embedding split: `tokens` are the micro-batch's input ids (before its forward is
  // queued), token_embedding_dense_ready() is the model's dense-ready hook, the model writes the
  // lookup rows to embedding_rows(), and end_backward gets the staged distinct ids (host and device).
  void begin_backward(float* grads, std::span<const int> tokens = {});
  void gradient_ready(std::int64_t offset, std::int64_t count);
  void token_embedding_dense_ready();
  float* embedding_rows() { return rows_.get(); }  // [max_rows, C]; null without the split
  bool splits_token_embedding() const { return plan_.token_embedding() != nullptr; }
  void end_backward(std::span<const int> staged_ids = {}, const int* staged_ids_device = nullptr);

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
  void exchange_embedding_rows(std::span<const int> staged_ids, const int* staged_ids_device);

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
  // The token embedding split (none: all empty).
  std::int64_t max_rows_ = 0;
  model::cuda::DeviceArray<float> rows_;          // [max_rows, C] this rank's lookup rows, ascending ids
  model::cuda::DeviceArray<float> recv_rows_;     // [world - 1, max_rows, C] from each peer (peer_slot)
  model::cuda::DeviceArray<std::int32_t> recv_ids_;  // [world - 1, max_rows]
  model::cuda::DeviceArray<std::int32_t> counts_;    // [world, world]: rows rank r sends rank q at r * world + q
  std::int32_t* host_counts_ = nullptr;           // pinned, [world + world * world]: this rank's row, then all
  cudaEvent_t counts_ready_ = nullptr, rows_ready_ = nullptr;
  bool dense_embedding_issued_ = false;
  std::vector<char> present_;                     // host scratch [Vp]: the batch's ids
};

}  // namespace stableflash::train
