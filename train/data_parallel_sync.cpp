// Bucketed reduce-scatter / all-gather of a data-parallel step (see data_parallel_sync.hpp).
#include "data_parallel_sync.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "stableflash/model/cuda/device_array.hpp"
#include "stableflash/model/cuda/layer_kernels.hpp"
#include "stableflash/optim/cuda_optimizer.hpp"

namespace stableflash::train {

using model::cuda::check_cuda;

namespace {
// Where rank r's rows land on this rank: peers only, in rank order.
std::int64_t peer_slot(int r, int me) { return r < me ? r : r - 1; }
}  // namespace

DataParallelSync::DataParallelSync(Collectives& collectives, optim::ShardPlan plan, cudaStream_t compute, std::int64_t max_rows)
    : coll_(collectives), plan_(std::move(plan)), compute_(compute), waits_(compute), max_rows_(max_rows) {
  const std::size_t n = plan_.buckets().size();
  ready_.resize(n), gathered_.resize(n), pending_.assign(n, false);
  for (auto* events : {&ready_, &gathered_})
    for (auto& e : *events) check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  check_cuda(cudaEventCreateWithFlags(&reduced_, cudaEventDisableTiming), "cudaEventCreate");
  if (const optim::TokenEmbeddingSplit* e = plan_.token_embedding()) {
    const std::int64_t W = coll_.size(), C = e->row_size;
    rows_ = model::cuda::DeviceArray<float>(std::size_t(max_rows * C));
    recv_rows_ = model::cuda::DeviceArray<float>(std::size_t((W - 1) * max_rows * C));
    recv_ids_ = model::cuda::DeviceArray<std::int32_t>(std::size_t((W - 1) * max_rows));
    counts_ = model::cuda::DeviceArray<std::int32_t>(std::size_t(W * W));
    check_cuda(cudaMallocHost(&host_counts_, std::size_t(W + W * W) * sizeof(std::int32_t)), "cudaMallocHost (row counts)");
    check_cuda(cudaEventCreateWithFlags(&counts_ready_, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaEventCreateWithFlags(&rows_ready_, cudaEventDisableTiming), "cudaEventCreate");
    present_.assign(std::size_t(e->rows), 0);
  }
}

DataParallelSync::~DataParallelSync() {
  cudaStreamSynchronize(coll_.stream());
  for (auto* events : {&ready_, &gathered_})
    for (auto e : *events) cudaEventDestroy(e);
  if (reduced_) cudaEventDestroy(reduced_);
  if (counts_ready_) cudaEventDestroy(counts_ready_);
  if (rows_ready_) cudaEventDestroy(rows_ready_);
  if (host_counts_) cudaFreeHost(host_counts_);
}

void DataParallelSync::compute_waits(cudaEvent_t event) { waits_.wait(event, "cudaStreamWaitEvent (communication)"); }

double DataParallelSync::take_wait_ms() { return waits_.take_ms(); }

void DataParallelSync::begin_backward(float* grads, std::span<const int> tokens) {
  grads_ = grads;
  frontier_ = plan_.total();
  next_bucket_ = int(plan_.buckets().size()) - 1;
  dense_embedding_issued_ = false;
  if (!splits_token_embedding()) return;
  // The rows this rank will send each owner: its distinct ids per owner's rows, counted now, so
  // that every rank knows what it receives (the all-gather runs during the forward) before the
  // end of the backward.
  const int W = coll_.size(), me = coll_.rank();
  std::fill(present_.begin(), present_.end(), 0);
  for (int t : tokens) {
    if (t < 0 || std::size_t(t) >= present_.size())
      throw std::out_of_range("rank " + std::to_string(me) + ": token id " + std::to_string(t) + " outside the embedding");
    present_[std::size_t(t)] = 1;
  }
  for (int q = 0; q < W; ++q) {
    const optim::FlatRange rows = plan_.owned_token_rows(q);
    host_counts_[q] = std::int32_t(std::count(present_.begin() + rows.begin, present_.begin() + rows.end, char(1)));
  }
  const cudaStream_t comm = coll_.stream();
  check_cuda(cudaMemcpyAsync(counts_.get() + me * W, host_counts_, std::size_t(W) * sizeof(std::int32_t), cudaMemcpyHostToDevice, comm),
             "cudaMemcpyAsync (row counts)");
  coll_.all_gather_counts(counts_.get(), W);
  check_cuda(cudaMemcpyAsync(host_counts_ + W, counts_.get(), std::size_t(W * W) * sizeof(std::int32_t), cudaMemcpyDeviceToHost, comm),
             "cudaMemcpyAsync (row counts)");
  check_cuda(cudaEventRecord(counts_ready_, comm), "cudaEventRecord (row counts)");
}

void DataParallelSync::token_embedding_dense_ready() {
  if (!splits_token_embedding() || dense_embedding_issued_) return;
  issue_reduction(0);  // wte's bucket, before every layer's: it overlaps the whole backward
  dense_embedding_issued_ = true;
}

void DataParallelSync::gradient_ready(std::int64_t offset, std::int64_t count) {
  if (offset < 0 || count < 0 || offset + count != frontier_)
    throw std::logic_error("rank " + std::to_string(coll_.rank()) + ": the backward announced gradients [" + std::to_string(offset) + ", " +
                           std::to_string(offset + count) + ") after finishing [" + std::to_string(frontier_) +
                           ", end); the buckets need them from the top down without gaps");
  frontier_ = offset;
  while (next_bucket_ >= 0 && plan_.buckets()[std::size_t(next_bucket_)].range.begin >= frontier_) {
    // wte's bucket went out early (token_embedding_dense_ready); its lookup rows follow at the end.
    if (!(next_bucket_ == 0 && dense_embedding_issued_)) issue_reduction(next_bucket_);
    --next_bucket_;
  }
}

void DataParallelSync::issue_reduction(int bucket) {
  const optim::GradientBucket& b = plan_.buckets()[std::size_t(bucket)];
  check_cuda(cudaEventRecord(ready_[std::size_t(bucket)], compute_), "cudaEventRecord (gradients ready)");
  check_cuda(cudaStreamWaitEvent(coll_.stream(), ready_[std::size_t(bucket)]), "cudaStreamWaitEvent (gradients ready)");
  if (b.replicated) coll_.all_reduce(grads_ + b.range.begin, b.range.size());
  else coll_.reduce_scatter_in_place(grads_ + b.range.begin, b.range.size());
}

void DataParallelSync::end_backward(std::span<const int> staged_ids, const int* staged_ids_device) {
  if (next_bucket_ >= 0)
    throw std::logic_error("rank " + std::to_string(coll_.rank()) + ": the backward ended with gradients [0, " + std::to_string(frontier_) +
                           ") not announced; they were never summed over the ranks");
  if (splits_token_embedding()) {
    if (!dense_embedding_issued_)
      throw std::logic_error("rank " + std::to_string(coll_.rank()) +
                             ": the backward never announced wte's dense gradient (set_token_embedding_split); its lookup rows are apart");
    exchange_embedding_rows(staged_ids, staged_ids_device);
  }
  check_cuda(cudaEventRecord(reduced_, coll_.stream()), "cudaEventRecord (gradients reduced)");
  compute_waits(reduced_);
}

void DataParallelSync::exchange_embedding_rows(std::span<const int> staged_ids, const int* staged_ids_device) {
  const int W = coll_.size(), me = coll_.rank();
  const std::int64_t C = plan_.token_embedding()->row_size;
  const std::string who = "rank " + std::to_string(me) + ": ";
  check_cuda(cudaEventSynchronize(counts_ready_), "cudaEventSynchronize (row counts)");  // long done: queued before the forward
  const std::vector<optim::FlatRange> runs = plan_.token_rows_by_owner(staged_ids);
  const std::int32_t* all = host_counts_ + W;  // all[r * W + q]: rows rank r sends rank q
  for (int q = 0; q < W; ++q)
    if (runs[std::size_t(q)].size() != all[me * W + q])
      throw std::logic_error(who + "the staged batch has " + std::to_string(runs[std::size_t(q)].size()) + " distinct ids in rank " +
                             std::to_string(q) + "'s embedding rows, the tokens given to begin_backward " + std::to_string(all[me * W + q]));
  const cudaStream_t comm = coll_.stream();
  check_cuda(cudaEventRecord(rows_ready_, compute_), "cudaEventRecord (embedding rows written)");
  check_cuda(cudaStreamWaitEvent(comm, rows_ready_), "cudaStreamWaitEvent (embedding rows written)");
  std::vector<Collectives::RowTransfer> transfers;
  for (int q = 0; q < W; ++q) {
    if (q == me) continue;
    const std::int64_t from = all[q * W + me];
    if (from < 0 || from > max_rows_)
      throw std::logic_error(who + "rank " + std::to_string(q) + " would send " + std::to_string(from) + " embedding rows, at most " +
                             std::to_string(max_rows_) + " fit");
    const std::int64_t slot = peer_slot(q, me);
    transfers.push_back({q, rows_.get() + runs[std::size_t(q)].begin * C, staged_ids_device + runs[std::size_t(q)].begin,
                         runs[std::size_t(q)].size(), recv_rows_.get() + slot * max_rows_ * C, recv_ids_.get() + slot * max_rows_, from});
  }
  coll_.exchange_rows(transfers, C);
  // Added in rank order on the communication stream, after wte's reduction (queued earlier there):
  // the same order on every rank and in every run of this world size.
  for (int r = 0; r < W; ++r) {
    if (r == me) {
      const optim::FlatRange own = runs[std::size_t(me)];
      model::cuda::add_embedding_rows(grads_, rows_.get() + own.begin * C, staged_ids_device + own.begin, int(own.size()), int(C), comm);
    } else {
      const std::int64_t slot = peer_slot(r, me);
      model::cuda::add_embedding_rows(grads_, recv_rows_.get() + slot * max_rows_ * C, recv_ids_.get() + slot * max_rows_,
                                      all[r * W + me], int(C), comm);
    }
  }
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
