// The run directory lock (see run_lock.hpp).
#include "stableflash/train/run_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace stableflash::train {

RunLock::RunLock(const std::string& run_dir) {
  std::filesystem::create_directories(run_dir);
  const std::string path = run_dir + "/.lock";
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw std::runtime_error(path + ": cannot open the run directory's lock file: " + std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[32] = {};
    const ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
    std::string pid = n > 0 ? std::string(buf, std::size_t(n)) : "";
    while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
    ::close(fd_);
    fd_ = -1;
    if (err != EWOULDBLOCK) throw std::runtime_error(path + ": cannot lock the run directory: " + std::strerror(err));
    throw std::runtime_error(run_dir + " is in use by another stableflash train (" + (pid.empty() ? "pid unknown" : "pid " + pid) +
                             "); two trainers would overwrite each other's checkpoints and logs. Wait for it to end, stop it "
                             "(kill -INT " + (pid.empty() ? "PID" : pid) + " writes a checkpoint first), or choose another --run-dir");
  }
  // Ours now: the pid of the holder, for the message above.
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) != ssize_t(pid.size())) {
    // A full disk: the lock itself holds, only the pid for others' messages is missing.
  }
}

RunLock::~RunLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the flock
}

}  // namespace stableflash::train
