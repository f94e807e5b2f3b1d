// NCCL collectives of the CUDA engine (see cuda_collectives.hpp).
#include "cuda_collectives.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "stableflash/model/cuda/device_array.hpp"

namespace stableflash::train {
namespace {

using model::cuda::check_cuda;

double env_seconds(const char* name, double fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atof(v) : fallback;
}

// Values per point-to-point message of a checkpoint gather (64 MB of FP32).
constexpr std::int64_t kGatherChunk = std::int64_t(16) << 20;

}  // namespace

void Collectives::check(ncclResult_t r, const char* what) const {
  if (r != ncclSuccess)
    throw std::runtime_error("rank " + std::to_string(world_.rank) + ": NCCL error in " + what + ": " + ncclGetErrorString(r));
}

Collectives::Collectives(const World& world, cudaStream_t compute) : world_(world), compute_(compute) {
  ncclUniqueId id{};
  if (world.rank == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  rendezvous_ = std::make_unique<Rendezvous>(world, std::vector<char>(id.internal, id.internal + sizeof id.internal),
                                             env_seconds("STABLEFLASH_RENDEZVOUS_TIMEOUT", 300), env_seconds("STABLEFLASH_HANG_TIMEOUT", 600));
  std::copy(rendezvous_->payload().begin(), rendezvous_->payload().end(), id.internal);
  rendezvous_->start_monitor([rank = world.rank](const std::string& why) {
    std::fprintf(stderr, "stableflash: rank %d: %s\n", rank, why.c_str());
    std::fflush(stderr);
    std::_Exit(3);  // NCCL calls of this process may be blocked for good; the OS frees the GPU
  });
  check(ncclCommInitRank(&comm_, world.size, id, world.rank), "ncclCommInitRank");
  // The highest priority: a reduction whose gradients are ready starts as soon as an SM frees up,
  // instead of queueing behind the backward's kernels (it is what hides the communication).
  int least = 0, greatest = 0;
  check_cuda(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
  check_cuda(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest), "cudaStreamCreateWithPriority");
  check_cuda(cudaMalloc(&scalars_, std::size_t(world.size) * sizeof(double)), "cudaMalloc (collective scalars)");
  check_cuda(cudaMallocHost(&host_scalars_, std::size_t(world.size) * sizeof(double)), "cudaMallocHost (collective scalars)");
}

Collectives::~Collectives() {
  if (stream_) cudaStreamSynchronize(stream_);
  if (scalars_) cudaFree(scalars_);
  if (host_scalars_) cudaFreeHost(host_scalars_);
  if (comm_) ncclCommDestroy(comm_);
  if (stream_) cudaStreamDestroy(stream_);
}

void Collectives::all_reduce(float* data, std::int64_t count) {
  check(ncclAllReduce(data, data, std::size_t(count), ncclFloat, ncclSum, comm_, stream_), "ncclAllReduce (gradients)");
}

void Collectives::reduce_scatter_in_place(float* bucket, std::int64_t count) {
  const std::int64_t piece = count / world_.size;
  // In place: NCCL's recvbuff = sendbuff + rank * recvcount.
  check(ncclReduceScatter(bucket, bucket + world_.rank * piece, std::size_t(piece), ncclFloat, ncclSum, comm_, stream_),
        "ncclReduceScatter (gradients)");
}

void Collectives::all_gather_in_place(float* bucket, std::int64_t count) {
  const std::int64_t piece = count / world_.size;
  // In place: NCCL's sendbuff = recvbuff + rank * sendcount.
  check(ncclAllGather(bucket + world_.rank * piece, bucket, std::size_t(piece), ncclFloat, comm_, stream_), "ncclAllGather (parameters)");
}

void Collectives::all_gather_counts(std::int32_t* values, std::int64_t per_rank) {
  check(ncclAllGather(values + world_.rank * per_rank, values, std::size_t(per_rank), ncclInt32, comm_, stream_), "ncclAllGather (counts)");
}

void Collectives::exchange_rows(std::span<const RowTransfer> transfers, std::int64_t row_size) {
  check(ncclGroupStart(), "ncclGroupStart (row exchange)");
  for (const RowTransfer& t : transfers) {
    if (t.send_count > 0) {
      check(ncclSend(t.send_rows, std::size_t(t.send_count * row_size), ncclFloat, t.peer, comm_, stream_), "ncclSend (rows)");
      check(ncclSend(t.send_ids, std::size_t(t.send_count), ncclInt32, t.peer, comm_, stream_), "ncclSend (row ids)");
    }
    if (t.recv_count > 0) {
      check(ncclRecv(t.recv_rows, std::size_t(t.recv_count * row_size), ncclFloat, t.peer, comm_, stream_), "ncclRecv (rows)");
      check(ncclRecv(t.recv_ids, std::size_t(t.recv_count), ncclInt32, t.peer, comm_, stream_), "ncclRecv (row ids)");
    }
  }
  check(ncclGroupEnd(), "ncclGroupEnd (row exchange)");
}

double Collectives::sum(double value) {
  host_scalars_[0] = value;
  check_cuda(cudaMemcpyAsync(scalars_, host_scalars_, sizeof(double), cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync");
  check(ncclAllReduce(scalars_, scalars_, 1, ncclDouble, ncclSum, comm_, stream_), "ncclAllReduce (scalar)");
  check_cuda(cudaMemcpyAsync(host_scalars_, scalars_, sizeof(double), cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync");
  check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (scalar sum)");
  return host_scalars_[0];
}

std::vector<double> Collectives::gather(double value) {
  host_scalars_[0] = value;
  check_cuda(cudaMemcpyAsync(scalars_ + world_.rank, host_scalars_, sizeof(double), cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync");
  check(ncclAllGather(scalars_ + world_.rank, scalars_, 1, ncclDouble, comm_, stream_), "ncclAllGather (scalar)");
  check_cuda(cudaMemcpyAsync(host_scalars_, scalars_, std::size_t(world_.size) * sizeof(double), cudaMemcpyDeviceToHost, stream_),
             "cudaMemcpyAsync");
  check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (scalar gather)");
  return std::vector<double>(host_scalars_, host_scalars_ + world_.size);
}

void Collectives::gather_to_rank_zero(const float* device_values, std::int64_t count,
                                      const std::function<void(int rank, std::span<const float> values)>& on_rank) {
  // The values may have been written on the compute stream.
  check_cuda(cudaStreamSynchronize(compute_), "cudaStreamSynchronize (before a checkpoint gather)");
  if (world_.rank != 0) {
    for (std::int64_t at = 0; at < count; at += kGatherChunk)
      check(ncclSend(device_values + at, std::size_t(std::min(kGatherChunk, count - at)), ncclFloat, 0, comm_, stream_),
            "ncclSend (checkpoint gather)");
    check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (checkpoint gather)");
    return;
  }
  std::vector<float> host(static_cast<std::size_t>(count));
  check_cuda(cudaMemcpy(host.data(), device_values, std::size_t(count) * sizeof(float), cudaMemcpyDeviceToHost),
             "cudaMemcpy (checkpoint gather)");
  on_rank(0, host);
  if (world_.size == 1) return;
  float* staging = nullptr;
  check_cuda(cudaMalloc(&staging, std::size_t(std::min(kGatherChunk, std::max<std::int64_t>(count, 1))) * sizeof(float)),
             "cudaMalloc (checkpoint gather)");
  try {
    for (int r = 1; r < world_.size; ++r) {
      for (std::int64_t at = 0; at < count; at += kGatherChunk) {
        const std::int64_t n = std::min(kGatherChunk, count - at);
        const std::string what = "ncclRecv (checkpoint gather from rank " + std::to_string(r) + ")";
        check(ncclRecv(staging, std::size_t(n), ncclFloat, r, comm_, stream_), what.c_str());
        check_cuda(cudaMemcpyAsync(host.data() + at, staging, std::size_t(n) * sizeof(float), cudaMemcpyDeviceToHost, stream_),
                   "cudaMemcpyAsync (checkpoint gather)");
        check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (checkpoint gather)");
      }
      on_rank(r, host);
    }
  } catch (...) {
    cudaFree(staging);
    throw;
  }
  cudaFree(staging);
}

}  // namespace stableflash::train
