// A one-line progress bar on stderr (redrawn in place on a terminal, a line every ~5% otherwise):
// step, loss, validation loss, tokens/s and the time left.
#pragma once

#include <chrono>
#include <cstdint>

namespace stableflash::train {

struct StepMetrics;

class Progress {
 public:
  Progress(bool enabled, std::int64_t first_step, std::int64_t total_steps, std::int64_t tokens_per_step);
  void update(const StepMetrics& m);
  void finish();

 private:
  bool enabled_, tty_;
  std::int64_t first_, total_, tokens_per_step_;
  std::chrono::steady_clock::time_point start_;
  double last_val_ = -1;
  bool open_line_ = false;
};

}  // namespace stableflash::train
