// One trainer per run directory: an exclusive flock on RUN/.lock, held while the run lives, with
// the holder's pid written into the file so that a refused second trainer can name it. The kernel
// drops the lock when the holder exits in any way (SIGKILL included), so a stale file never blocks.
#pragma once

#include <string>

namespace stableflash::train {

class RunLock {
 public:
  // Creates RUN (and RUN/.lock) when missing. Throws naming the run directory and the pid of the
  // process holding it, or the reason the lock file cannot be used.
  explicit RunLock(const std::string& run_dir);
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace stableflash::train
