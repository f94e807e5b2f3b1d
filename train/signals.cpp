// Clean stop on SIGINT/SIGTERM (see signals.hpp).
#include "stableflash/train/signals.hpp"

#include <signal.h>

#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>

namespace stableflash::train {
namespace {

// Lock-free, so reading and writing it from a handler is async-signal-safe.
std::atomic<int> g_stop_signal{0};
std::atomic<std::int64_t> g_first_ns{0};
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<std::int64_t>::is_always_lock_free);

struct sigaction g_old_int {}, g_old_term {};

// A launcher that passes a terminal's Ctrl-C on (torchrun, srun, --gpus) makes a rank in the
// terminal's process group see it twice within milliseconds: that echo is still the first request.
constexpr std::int64_t kEchoWindowNs = 1'000'000'000;

std::int64_t now_ns() {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);  // async-signal-safe
  return std::int64_t(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
}

void on_stop_signal(int sig) {
  int expected = 0;
  if (g_stop_signal.compare_exchange_strong(expected, sig)) {
    g_first_ns = now_ns();
    return;
  }
  if (now_ns() - g_first_ns.load() < kEchoWindowNs) return;
  // A second request: the user does not want to wait for the step and the checkpoint. The default
  // action ends the process with the signal's status (a shell shows 130 / 143), as without us.
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

}  // namespace

StopOnSignals::StopOnSignals() {
  g_stop_signal = 0;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  // SA_RESTART: file writes and waits of the step in flight go on instead of failing with EINTR.
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, &g_old_int);
  sigaction(SIGTERM, &sa, &g_old_term);
  // A signal the parent chose to ignore (nohup, a background job of a script) stays ignored.
  if (g_old_int.sa_handler == SIG_IGN) sigaction(SIGINT, &g_old_int, nullptr);
  if (g_old_term.sa_handler == SIG_IGN) sigaction(SIGTERM, &g_old_term, nullptr);
}

StopOnSignals::~StopOnSignals() {
  sigaction(SIGINT, &g_old_int, nullptr);
  sigaction(SIGTERM, &g_old_term, nullptr);
}

int stop_signal() { return g_stop_signal.load(); }

const char* signal_name(int sig) {
  if (sig == SIGINT) return "SIGINT";
  if (sig == SIGTERM) return "SIGTERM";
  static thread_local char buf[32];
  std::snprintf(buf, sizeof buf, "signal %d", sig);
  return buf;
}

}  // namespace stableflash::train
