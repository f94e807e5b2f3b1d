// The trainer's view of a model and its optimizer on one device. The training loop
// (trainer.cpp) is written once against this interface; the CPU engine wraps Gpt2<float> and
// Optimizer<float>, the CUDA engine Gpt2Cuda and CudaOptimizer. Both hold the same state in the
// same flat layout, so checkpoints written by one resume on the other.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "stableflash/model/attention_capture.hpp"
#include "stableflash/train/checkpoint.hpp"
#include "stableflash/train/config.hpp"
#include "stableflash/train/distributed.hpp"

namespace stableflash::train {

class TrainingEngine {
 public:
  virtual ~TrainingEngine() = default;

  // "cpu (N threads)" or "cuda:0 (NVIDIA H200)", for the run summary.
  virtual std::string describe() const = 0;
  // True when work is queued and runs while the host prepares the next batch (the GPU).
  virtual bool asynchronous() const = 0;

  virtual void init_weights(std::uint64_t seed) = 0;
  // Weights and optimizer state from a checkpoint of the same config.
  virtual void load(const Checkpoint& checkpoint) = 0;
  // Host views of the weights and optimizer state, valid until the next call on the engine.
  // Data parallel: every rank calls it at the same point (ZeRO-1 gathers the optimizer shards on
  // rank 0); only rank 0's snapshot is complete.
  virtual TrainingSnapshot snapshot() = 0;
  // Copies params[offset, offset + out.size()) to the host (the probes read single tensors).
  virtual void read_parameters(std::int64_t offset, std::span<float> out) = 0;
  // All FP32 weights on the host (the CPU's own buffer; a host copy of the GPU's), valid until the
  // next call on the engine: what the spectral-norm probe reads.
  virtual std::span<const float> parameters_on_host() = 0;
  // Probes (model/attention_capture.hpp): the next train_micro_batch keeps what `request` asks
  // for; take_capture() (after it) hands it over. Never changes what the step computes.
  virtual void request_capture(const model::CaptureRequest& request) = 0;
  virtual model::Capture take_capture() = 0;

  virtual void zero_grad() = 0;
  // Forward and backward of one micro-batch: adds d(loss_scale * mean loss)/d(params) to the
  // gradients and the micro-batch's mean loss to the loss sum. `last`: this rank's last micro-batch
  // of the step (data parallel: the gradients are summed over the ranks during its backward).
  virtual void train_micro_batch(std::span<const int> tokens, std::span<const int> targets, int batch, int len, float loss_scale,
                                 bool last) = 0;
  // Forward only; adds the mean loss to the loss sum.
  virtual void eval_micro_batch(std::span<const int> tokens, std::span<const int> targets, int batch, int len) = 0;
  // The sum of mean losses since the last call, over every rank, then reset (waits for queued
  // work, an overlapped optimizer step included).
  virtual double take_loss_sum() = 0;
  // Global gradient-norm clipping (optim::clip_grad_norm's rule) for the next optimizer_step().
  // The GPU queues it: the norm and the factor are computed on the device, and the update reads
  // the factor there, with no host round trip in between. A norm that is not finite makes the
  // next optimizer_step() change nothing (the trainer then stops, "before updating the weights").
  virtual void clip_grad_norm(double max_norm) = 0;
  // The norm before clipping of the last clip_grad_norm (the GPU waits for that value only, not for
  // the update queued after it).
  virtual double grad_norm() = 0;
  virtual void optimizer_step(double lr) = 0;

  // Data parallel: this rank reached `step` (the watchdog's progress signal), and an orderly end.
  virtual void heartbeat(std::int64_t /*step*/) {}
  virtual void finish() {}
  // True when `local` is true on any rank; every rank calls it at the same point of every step, so
  // that a stop asked for by a signal (which reaches the ranks at slightly different moments)
  // ends them all after the same step.
  virtual bool any_rank(bool local) { return local; }
  // Every rank's `local`, in rank order (a collective; one process: {local}).
  virtual std::vector<double> from_every_rank(double local) { return {local}; }
  // Data parallel: with measuring on, the engine times how long its compute waits for
  // communication (the gradients' last reduction, the parameters' all-gather);
  // take_communication_wait_ms() waits for queued work and returns the milliseconds since the last
  // call (0 for one process).
  virtual void measure_communication(bool /*on*/) {}
  virtual double take_communication_wait_ms() { return 0.0; }
  // One GPU (and all-reduce data parallelism): the optimizer step runs on a second stream while the
  // next forward starts, each layer's forward waiting for that layer's update (train.overlap_optimizer).
  // With measuring on (measure_communication), the engine times those waits; take_update_wait_ms()
  // waits for queued work and returns the milliseconds the forward stood waiting for the update
  // (the gradient norm, the embeddings' update and whatever the forward caught up with) since the
  // last call. 0 where the update does not overlap.
  virtual double take_update_wait_ms() { return 0.0; }
  virtual bool optimizer_overlaps() const { return false; }
  // The GPU, train.cuda_graph: micro-batches replayed from a CUDA graph so far, and one line on how
  // the steps ran for the run summary (graphs used, or why not, or why they stopped); 0 and empty
  // on the CPU.
  virtual std::int64_t graph_replays() const { return 0; }
  virtual std::string execution_summary() const { return {}; }
};

// bf16_autocast: the CPU model emulates BF16 autocast (Gpt2::set_bf16_autocast).
std::unique_ptr<TrainingEngine> make_cpu_engine(const TrainConfig& config, bool bf16_autocast = false);
// The CUDA engine on GPU `device`, one rank of `world` (NCCL between the ranks when there are
// several); throws std::runtime_error in a build without CUDA or where no GPU is visible.
std::unique_ptr<TrainingEngine> make_cuda_engine(const TrainConfig& config, int device, const World& world = {});
// True when this build has the CUDA trainer and a GPU is visible.
bool cuda_training_available();
// Bytes of the current GPU's memory in use by anyone (total - free; -1 without CUDA): the
// benchmark's peak memory is its growth over the value before the engine existed.
std::int64_t cuda_memory_in_use();

}  // namespace stableflash::train
