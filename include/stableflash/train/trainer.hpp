// The training loop, on the CPU or a GPU: seeded random windows (or a replayed batch log), gradient accumulation,
// clipping, the schedule, validation, metrics, progress, checkpoints and exact resume.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "stableflash/train/config.hpp"
#include "stableflash/train/distributed.hpp"

namespace stableflash::train {

struct StepMetrics {
  std::int64_t step = 0;  // 0-based index of the optimizer step; loss is measured before its update
  double loss = 0, lr = 0, grad_norm = 0, tokens_per_s = 0;
  std::optional<double> val_loss;  // after this step's update, when evaluated
  std::vector<double> wq_sigma;    // after this step's update, on probe steps: each layer's W_Q spectral norm
  std::vector<std::vector<double>> wq_sigma_heads;  // and each head's W_Q: [layer][head]
  // The other probes' fields, as JSON text appended to the metrics line (train/probes.hpp;
  // docs/training.md "Probes"), and the spectral norms measured this step by name (the spike
  // detector's input: "h.L.wq" on every probe step, every matrix on probe.sigma_every's steps).
  std::string probe_fields;
  std::map<std::string, double> sigmas;
  std::string capture_dir;  // set when the spike detector wrote a capture after this step
};

// Where the steps run. `automatic`: the GPU when this build has CUDA and one is visible, else the CPU.
enum class TrainDevice : std::uint8_t { automatic, cpu, cuda };

struct TrainOptions {
  std::string run_dir;
  TrainDevice device = TrainDevice::automatic;
  int gpu = 0;                  // which GPU for TrainDevice::cuda
  // CPU only: emulate PyTorch's BF16 autocast (Gpt2::set_bf16_autocast), the naive BF16 baseline
  // the CUDA trainer's agreement with the CPU trainer is measured against.
  bool cpu_bf16_autocast = false;
  // Data parallel: this process's rank (world_from_environment()); rank r trains on GPU local_rank.
  World world;
  bool resume = false;          // continue from RUN/checkpoints/latest
  std::string replay_log;       // train on exactly these windows (a batch log of an earlier run)
  bool progress = true;         // progress bar on stderr
  // SIGINT/SIGTERM during the steps finish the step, write a checkpoint and return (stopped_by_signal);
  // a second one ends the process (signals.hpp). The command line sets it; a library caller may not want it.
  bool stop_on_signals = false;
  std::function<void(const StepMetrics&)> on_step;  // called after every step (tests, tools)
};

struct TrainResult {
  std::vector<StepMetrics> steps;  // the steps this call ran
  std::string last_checkpoint;
  int stopped_by_signal = 0;       // SIGINT or SIGTERM when one stopped the run before train.steps
  // How the engine ran the steps, one line (the GPU: CUDA graphs used, or why not); empty on the CPU.
  std::string execution;
  std::int64_t graph_replays = 0;  // micro-batches replayed from a CUDA graph
};

// Thrown when the loss (or the gradient norm) is NaN or infinite: names the step and the last good
// checkpoint, which is left as it was.
struct NonFiniteLoss : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Validates the config, prepares RUN_DIR (config.json, metrics.jsonl, batches.log,
// checkpoints/) and trains up to config.train.steps. Errors name what is wrong (missing shards,
// a mismatched or damaged checkpoint, a replay log for other data).
TrainResult run_training(const TrainConfig& config, const TrainOptions& options);

// When sampling by seed, step s draws its batch_size * grad_accum windows (seq_len + 1 tokens each)
// from SplitMix64(data_seed(train.seed), s): the data position is the step number itself.
std::uint64_t data_seed(std::uint64_t seed);

}  // namespace stableflash::train
