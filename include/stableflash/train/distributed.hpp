// Data-parallel training, the parts that are not CUDA: who is who (the environment variables
// torchrun and Slurm set), starting one process per GPU (`stableflash train --gpus N`), and the
// rendezvous that hands NCCL's unique id to every rank and then watches that every rank is alive.
//
// Launches (docs/training.md):
//   one node:    stableflash train --gpus 2 ...
//   torchrun:    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-endpoint HOST:PORT --no-python
//                  stableflash train ...          (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT)
//   Slurm:       MASTER_ADDR=host MASTER_PORT=29500 srun --ntasks-per-node 8 stableflash train ...
//                (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID stand in for RANK, WORLD_SIZE, LOCAL_RANK)
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace stableflash::train {

struct World {
  int rank = 0, size = 1, local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  // Tests on one GPU: the data-parallel code path (NCCL, gradient buckets, ZeRO-1) with a single
  // rank, which must give what the plain one-GPU path gives.
  bool force_collectives = false;
  bool distributed() const { return size > 1; }
  bool uses_collectives() const { return size > 1 || force_collectives; }
};

// The world of this process from RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT, or the Slurm
// variables when those are unset; a single process when neither is set. Errors name the variable
// and what was expected.
World world_from_environment();
// The same from an explicit lookup (tests).
World world_from(const std::function<const char*(const char*)>& getenv);

// `--gpus N`: runs `argv` N times with the torchrun variables set (rank i on GPU i, the rendezvous
// on 127.0.0.1 and a free port), in the environment of this process (so NCCL settings such as
// NCCL_NVLS_ENABLE reach every rank). SIGINT and SIGTERM are passed on. When a rank exits with an
// error or a signal, the others are stopped (SIGTERM, then SIGKILL after `grace_s`) and the
// message names the rank. Returns 0 when every rank succeeded, else the first failure's code.
int launch_local_ranks(int n, const std::vector<std::string>& argv, double grace_s = 10.0);

// The rendezvous and liveness channel. Rank 0 listens on master_addr:master_port (that address
// only) and sends every other rank `payload` (NCCL's unique id); the others connect, retrying for
// up to `connect_timeout_s`. The connections stay open afterwards:
//   - a rank that exits without finish() (crash, kill) closes its socket; rank 0 sees it at once
//     and tells the others; every rank then runs on_failure with a message naming that rank;
//   - every rank reports its step (heartbeat()); when no rank advances for `hang_timeout_s`, rank 0
//     stops the run, naming the ranks that are behind (or all, when none is).
class Rendezvous {
 public:
  Rendezvous(const World& world, std::vector<char> payload, double connect_timeout_s, double hang_timeout_s);
  ~Rendezvous();
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  // Rank 0's payload, as received (rank 0: its own).
  const std::vector<char>& payload() const { return payload_; }
  // Starts watching; on_failure runs on the watcher thread (it should abort and exit).
  void start_monitor(std::function<void(const std::string&)> on_failure);
  void heartbeat(std::int64_t step);
  // An orderly end: a closed connection after this is no failure.
  void finish();

 private:
  void monitor_loop();
  World world_;
  std::vector<char> payload_;
  double hang_timeout_s_;
  int listen_fd_ = -1;
  std::vector<int> peers_;  // rank 0: the socket of rank i at [i] (-1 for itself); others: [0] = rank 0
  std::function<void(const std::string&)> on_failure_;
  std::atomic<bool> finishing_{false}, stop_{false};
  std::atomic<std::int64_t> last_step_self_{-1};  // rank 0's own step
  std::thread monitor_;
};

}  // namespace stableflash::train
