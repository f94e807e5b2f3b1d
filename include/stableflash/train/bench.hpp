// `stableflash bench train`: the training step's speed on random tokens, timed the way the PyTorch
// peer (shared/peers/torch_peers.py gpt2) times its own: warm-up steps, then windows of steps,
// the median window's time per step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "stableflash/train/config.hpp"
#include "stableflash/train/distributed.hpp"
#include "stableflash/train/trainer.hpp"

namespace stableflash::train {

struct BenchTrainOptions {
  TrainDevice device = TrainDevice::automatic;
  int gpu = 0;
  int warmup_steps = 8;
  int steps = 30;  // timed steps, in 5 windows
  std::uint64_t seed = 0;
  World world;  // data parallel: rank r trains micro-batches r, r + ranks, ... of every step
};

struct BenchTrainResult {
  std::string device;
  int ranks = 1;
  double ms_per_step = 0, tokens_per_s = 0;
  double peak_memory_gib = -1;  // growth of GPU memory in use over the run (-1 on the CPU)
  double model_flops_per_step = 0;  // nanoGPT's estimate: 6 N + 12 L H Dh T per token
  double mfu = 0;                   // model FLOP/s over 989 TFLOP/s (H100/H200 dense BF16)
  double last_loss = 0;
  // Where a step's time goes (medians over the timed steps, each part timed alone after a
  // synchronization, so they add up to more than ms_per_step): forward of one micro-batch,
  // forward + backward of one (the host's staging of the batch included), and the gradient norm +
  // optimizer update.
  double forward_ms = 0, forward_backward_ms = 0, optimizer_ms = 0;
  // train.overlap_optimizer on a GPU (not ZeRO-1): the update runs on a second stream beside the
  // next forward, so a step holds only part of optimizer_ms: optimizer_wait_ms, how long the
  // forward's compute stream stood waiting for it per step (timed by CUDA events around its waits
  // over the timed steps: the gradient norm, the embeddings' update, any layer the forward caught
  // up with). 0 when not overlapped.
  bool optimizer_overlapped = false;
  double optimizer_wait_ms = 0;
  // train.cuda_graph on a GPU: the timed steps' micro-batches replayed from a CUDA graph (all of
  // them, when it works: the warm-up recorded it), and the engine's line on it (why not, if not).
  bool cuda_graph = false;
  std::string execution;
  // Data parallel: how long this rank's compute stream stood waiting for communication per step
  // (the last gradient reduction after the backward, the parameters' all-gather before the
  // forward reads them; timed by CUDA events over the timed steps), and its share of the step
  // time. 0 for one process. The host's scalar syncs (the loss; ZeRO-1 also the norm) are not counted: one
  // GPU has them too.
  double communication_wait_ms = 0, communication_wait_share = 0;
  // Per rank, in rank order (one value for one process).
  std::vector<double> peak_memory_gib_per_rank, communication_wait_share_per_rank;
  std::int64_t parameters = 0;
  // The probes' cost (single device only; train/probes.hpp), each the median over 7 tries of a
  // step with that probe alone minus a plain step: the W_Q norms (every train.probe_every steps),
  // the attention capture with its counters, row statistics, delta shadow and similarity (every
  // probe.attention_every), every matrix's norm (every probe.sigma_every). -1: not measured.
  double wq_probe_ms = -1, attention_probe_ms = -1, sigma_probe_ms = -1;
  std::int64_t probe_every = 0, attention_every = 0, sigma_every = 0;
  // The probes' share of the training time at those intervals: sum of ms / (interval x ms_per_step).
  double probe_share() const;
};

BenchTrainResult bench_training(const TrainConfig& config, const BenchTrainOptions& options);

}  // namespace stableflash::train
