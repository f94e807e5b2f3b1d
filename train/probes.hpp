// The trainer's probes (issue 11): what they measure, when, and the metrics.jsonl fields they
// write. Every computation is host code shared by the CPU and the GPU engine (diag/); an engine
// only supplies its weights and an attention capture (model/attention_capture.hpp) on probe steps,
// so nothing runs, and nothing is copied or synchronized, on the other steps. Probes never change
// what a step computes (tests/train/probes_test.cpp: bitwise equal losses with probes on and off).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <utility>
#include <string>
#include <vector>

#include "engine.hpp"
#include "stableflash/diag/weight_spectra.hpp"
#include "stableflash/train/config.hpp"
#include "stableflash/train/trainer.hpp"

namespace stableflash::train {

class TrainingProbes {
 public:
  explicit TrainingProbes(const TrainConfig& config);

  // What step `step` (the last of the run when `last`) measures.
  bool wq_step(std::int64_t step, bool last) const;         // W_Q norms (train.probe_every)
  bool sigma_step(std::int64_t step, bool last) const;      // every matrix's norm, per-head W_K, W_V, W_O (probe.sigma_every)
  bool attention_step(std::int64_t step, bool last) const;  // the capture's probes (probe.attention_every)
  // Before the step's last micro-batch: asks the engine to capture what this step needs.
  void before_last_micro_batch(std::int64_t step, bool last, TrainingEngine& engine) {
    request(engine, attention_step(step, last));
  }
  // After the step's update: fills m.wq_sigma(_heads), m.probe_fields and m.sigmas.
  void after_step(std::int64_t step, bool last, TrainingEngine& engine, StepMetrics& m) {
    measure(engine, m, wq_step(step, last), sigma_step(step, last), attention_step(step, last));
  }
  // The same with the parts chosen directly (the benchmark times each).
  void request(TrainingEngine& engine, bool attention);
  void measure(TrainingEngine& engine, StepMetrics& m, bool wq, bool sigma, bool attention);
  // Resume: the delta running sums as the metrics up to the checkpoint left them.
  void restore(const std::string& metrics_path);
  // The weights the W_Q probe reads, and only those: each layer's c_attn rows copied from the
  // engine (85 of GPT-2 124M's 498 MB) into a buffer in the flat layout whose other pages are never
  // written (so never resident). A whole-model copy made this probe 2.1-2.3% of the step at
  // train.probe_every = 100 on the H200.
  std::span<const float> wq_weights(TrainingEngine& engine);

  // Seconds spent in the probes so far (capture handling and host computation; not the
  // capture's share of the step itself): `stableflash bench train` reports it.
  double seconds() const { return seconds_; }

 private:
  TrainConfig config_;
  std::vector<int> layers_;
  diag::WeightSpectra spectra_;
  std::vector<double> delta_sum_;  // [layer] running sum of the delta shadow over the probed steps
  std::unique_ptr<float[]> wq_host_;                           // see wq_weights
  std::int64_t wq_host_size_ = 0;
  std::vector<std::pair<std::int64_t, std::int64_t>> wq_ranges_;  // [begin, end) of each W_Q view's rows
  double seconds_ = 0;
};

}  // namespace stableflash::train
