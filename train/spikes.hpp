// The spike detector and its captures. A step whose loss exceeds probe.spike_loss_factor x the
// median of the last probe.spike_window losses, or a spectral norm above probe.spike_sigma_factor
// x the median of that matrix's last probe.spike_window probes, writes RUN/captures/step_N: what
// it takes to run the event again, bit for bit on the CPU (and on the GPU with train.deterministic),
// from the last checkpoint before it (docs/training.md, "Spike captures").
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>

#include "stableflash/train/config.hpp"
#include "stableflash/train/trainer.hpp"

namespace stableflash::train {

class SpikeDetector {
 public:
  explicit SpikeDetector(const ProbeSettings& settings) : s_(settings) {}
  // Why this step is a spike (empty: it is not); then adds the step to the history.
  std::optional<std::string> check(const StepMetrics& m);
  // Resume: the history as the metrics up to the checkpoint left it.
  void restore(const std::string& metrics_path);

 private:
  ProbeSettings s_;
  std::deque<double> losses_;
  std::map<std::string, std::deque<double>> sigmas_;
};

// Writes RUN/captures/step_NNNNNNNN for a spike at `step` (see docs/training.md) and returns the
// command that replays it. `checkpoint` is the run's last checkpoint folder (empty: none yet, the
// replay starts from the initialisation).
struct SpikeCapture {
  std::string dir, replay_command;
};
SpikeCapture write_spike_capture(const std::string& run_dir, const TrainConfig& config, std::int64_t step, const std::string& reason,
                                 const std::string& checkpoint, std::int64_t checkpoint_step);

}  // namespace stableflash::train
