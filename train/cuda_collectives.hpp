// NCCL between the ranks of a data-parallel run (CUDA builds only; private to train/): the
// communicator and its stream, the liveness watch of the rendezvous (a rank that dies or hangs ends
// every rank, naming it), and the collectives the CUDA engine needs. Errors name the rank.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "stableflash/train/distributed.hpp"

namespace stableflash::train {

class Collectives {
 public:
  // Joins the rendezvous of `world` and creates the communicator; `compute` is the stream the
  // model runs on.
  Collectives(const World& world, cudaStream_t compute);
  ~Collectives();
  Collectives(const Collectives&) = delete;
  Collectives& operator=(const Collectives&) = delete;

  int rank() const { return world_.rank; }
  int size() const { return world_.size; }
  // The communication stream: the collectives below run on it. Callers order them after compute
  // work with events (DataParallelSync).
  cudaStream_t stream() const { return stream_; }
  Rendezvous& rendezvous() { return *rendezvous_; }

  // Sums data[0, count) over the ranks, in place.
  void all_reduce(float* data, std::int64_t count);
  // bucket[0, count) summed over the ranks; rank r keeps the sum of the r-th of size() equal
  // pieces, in place (count is a multiple of size(); the other pieces are left undefined).
  void reduce_scatter_in_place(float* bucket, std::int64_t count);
  // Every rank's r-th piece of bucket[0, count) to every rank, in place.
  void all_gather_in_place(float* bucket, std::int64_t count);
  // Every rank's values[rank * per_rank, (rank + 1) * per_rank) to every rank, in place (device
  // int32 values, for counts).
  void all_gather_counts(std::int32_t* values, std::int64_t per_rank);
  // Rows of `row_size` floats with their int32 ids, to and from peers, in one NCCL group: each
  // transfer sends send_count rows (and ids) to `peer` and receives recv_count from it. Every peer
  // must post the matching counts; zero counts move nothing.
  struct RowTransfer {
    int peer = 0;
    const float* send_rows = nullptr;
    const std::int32_t* send_ids = nullptr;
    std::int64_t send_count = 0;
    float* recv_rows = nullptr;
    std::int32_t* recv_ids = nullptr;
    std::int64_t recv_count = 0;
  };
  void exchange_rows(std::span<const RowTransfer> transfers, std::int64_t row_size);

  // Host values, synchronous (they wait for the communication stream's earlier work):
  // the sum over the ranks (NCCL's order), and every rank's value in rank order.
  double sum(double value);
  std::vector<double> gather(double value);
  // Every rank passes `count` device values (the same count on each); rank 0 receives them rank by
  // rank through a small device buffer and calls on_rank(r, values) on the host for r = 0, 1, ...
  // (the other ranks only send). For checkpoints; synchronous.
  void gather_to_rank_zero(const float* device_values, std::int64_t count,
                           const std::function<void(int rank, std::span<const float> values)>& on_rank);

 private:
  void check(ncclResult_t r, const char* what) const;

  World world_;
  cudaStream_t compute_ = nullptr, stream_ = nullptr;
  std::unique_ptr<Rendezvous> rendezvous_;
  ncclComm_t comm_ = nullptr;
  double* scalars_ = nullptr;       // device, [size()]
  double* host_scalars_ = nullptr;  // pinned, [size()]
};

}  // namespace stableflash::train
