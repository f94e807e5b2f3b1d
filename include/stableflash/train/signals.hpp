// Stopping a training run cleanly on Ctrl-C (SIGINT) or SIGTERM: the first signal only raises a
// flag that the loop reads after each step (it then writes a checkpoint and returns); a second one
// ends the process at once, as the signal's default action would (one arriving within a second of
// the first counts as its echo through a launcher, not as a second request).
#pragma once

namespace stableflash::train {

// Installs the handlers for as long as it lives and restores the previous ones afterwards.
// Not re-entrant: one per process at a time (the trainer's loop).
class StopOnSignals {
 public:
  StopOnSignals();
  ~StopOnSignals();
  StopOnSignals(const StopOnSignals&) = delete;
  StopOnSignals& operator=(const StopOnSignals&) = delete;
};

// The signal that asked to stop (SIGINT or SIGTERM), 0 when none did since the handlers went in.
int stop_signal();

// "SIGINT" / "SIGTERM" / "signal N".
const char* signal_name(int sig);

}  // namespace stableflash::train
