// Bucketed reduce-scatter / all-gather of a data-parallel step (see data_parallel_sync.hpp).
#include "data_parallel_sync.hpp"

#include <stdexcept>
#include <string>

#include "stableflash/model/cuda/device_array.hpp"
#include "stableflash/optim/cuda_optimizer.hpp"

namespace stableflash::train {

using model::cuda::check_cuda;

DataParallelSync::DataParallelSync(Collectives& collectives, optim::ShardPlan plan, cudaStream_t compute)
    : coll_(collectives), plan_(std::move(plan)), compute_(compute), waits_(compute) {
  const std::size_t n = plan_.buckets().size();
  ready_.resize(n), gathered_.resize(n), pending_.assign(n, false);
  for (auto* events : {&ready_, &gathered_})
    for (auto& e : *events) check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  check_cuda(cudaEventCreateWithFlags(&reduced_, cudaEventDisableTiming), "cudaEventCreate");
}

DataParallelSync::~DataParallelSync() {
  cudaStreamSynchronize(coll_.stream());
  for (auto* events : {&ready_, &gathered_})
    for (auto e : *events) cudaEventDestroy(e);
  if (reduced_) cudaEventDestroy(reduced_);
}

void DataParallelSync::compute_waits(cudaEvent_t event) { waits_.wait(event, "cudaStreamWaitEvent (communication)"); }

double DataParallelSync::take_wait_ms() { return waits_.take_ms(); }

void DataParallelSync::begin_backward(float* grads) {
  grads_ = grads;
  frontier_ = plan_.total();
  next_bucket_ = int(plan_.buckets().size()) - 1;
}

void DataParallelSync::gradient_ready(std::int64_t offset, std::int64_t count) {
  if (offset < 0 || count < 0 || offset + count != frontier_)
    throw std::logic_error("rank " + std::to_string(coll_.rank()) + ": the backward announced gradients [" + std::to_string(offset) + ", " +
                           std::to_string(offset + count) + ") after finishing [" + std::to_string(frontier_) +
                           ", end); the buckets need them from the top down without gaps");
  frontier_ = offset;
  while (next_bucket_ >= 0 && plan_.buckets()[std::size_t(next_bucket_)].range.begin >= frontier_) issue_reduction(next_bucket_--);
}

void DataParallelSync::issue_reduction(int bucket) {
  const optim::GradientBucket& b = plan_.buckets()[std::size_t(bucket)];
  check_cuda(cudaEventRecord(ready_[std::size_t(bucket)], compute_), "cudaEventRecord (gradients ready)");
  check_cuda(cudaStreamWaitEvent(coll_.stream(), ready_[std::size_t(bucket)]), "cudaStreamWaitEvent (gradients ready)");
  if (b.replicated) coll_.all_reduce(grads_ + b.range.begin, b.range.size());
  else coll_.reduce_scatter_in_place(grads_ + b.range.begin, b.range.size());
}

void DataParallelSync::end_backward() {
  if (next_bucket_ >= 0)
    throw std::logic_error("rank " + std::to_string(coll_.rank()) + ": the backward ended with gradients [0, " + std::to_string(frontier_) +
                           ") not announced; they were never summed over the ranks");
  check_cuda(cudaEventRecord(reduced_, coll_.stream()), "cudaEventRecord (gradients reduced)");
  compute_waits(reduced_);
}

void DataParallelSync::gather_after_update(int bucket, float* params, __nv_bfloat16* params_bf16) {
  const optim::GradientBucket& b = plan_.buckets()[std::size_t(bucket)];
  if (b.replicated) return;
  const cudaStream_t comm = coll_.stream();
  check_cuda(cudaEventRecord(ready_[std::size_t(bucket)], compute_), "cudaEventRecord (bucket updated)");
  check_cuda(cudaStreamWaitEvent(comm, ready_[std::size_t(bucket)]), "cudaStreamWaitEvent (bucket updated)");
  coll_.all_gather_in_place(params + b.range.begin, b.range.size());
  // The owner wrote the BF16 copy of its own piece in the update; the others' pieces arrive in FP32
  // and are rounded here the same way (round to nearest even), so the copies agree bit for bit.
  const optim::FlatRange own = b.owned(coll_.rank(), coll_.size());
  optim::to_bf16(params_bf16 + b.range.begin, params + b.range.begin, own.begin - b.range.begin, comm);
  optim::to_bf16(params_bf16 + own.end, params + own.end, b.range.end - own.end, comm);
  check_cuda(cudaEventRecord(gathered_[std::size_t(bucket)], comm), "cudaEventRecord (parameters gathered)");
  pending_[std::size_t(bucket)] = true;
}

void DataParallelSync::parameters_needed(std::int64_t offset, std::int64_t count) {
  const auto [first, last] = plan_.buckets_touching({offset, offset + count});
  for (int b = first; b < last; ++b)
    if (pending_[std::size_t(b)]) {
      compute_waits(gathered_[std::size_t(b)]);
      pending_[std::size_t(b)] = false;
    }
}

void DataParallelSync::wait_for_all_parameters() { parameters_needed(0, plan_.total()); }

bool DataParallelSync::parameters_pending() const {
  for (bool p : pending_)
    if (p) return true;
  return false;
}

}  // namespace stableflash::train
