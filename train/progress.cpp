// Progress bar of the trainer (see progress.hpp).
#include "stableflash/train/progress.hpp"

#include <unistd.h>

#include <cstdio>
#include <string>

#include "stableflash/train/trainer.hpp"

namespace stableflash::train {
namespace {

std::string duration(double s) {
  char buf[32];
  const long t = long(s + 0.5);
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, (t / 60) % 60);
  else std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  return buf;
}

}  // namespace

Progress::Progress(bool enabled, std::int64_t first_step, std::int64_t total_steps, std::int64_t tokens_per_step)
    : enabled_(enabled), tty_(::isatty(2) != 0), first_(first_step), total_(total_steps), tokens_per_step_(tokens_per_step),
      start_(std::chrono::steady_clock::now()) {}

void Progress::update(const StepMetrics& m) {
  if (!enabled_) return;
  if (m.val_loss) last_val_ = *m.val_loss;
  const std::int64_t done = m.step + 1;
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double per_step = elapsed / double(done - first_);
  const double tok_s = double(tokens_per_step_) / per_step;  // averaged over this invocation
  constexpr int kWidth = 24;
  const int filled = int(kWidth * double(done) / double(total_));
  std::string bar(std::size_t(filled), '=');
  bar.resize(kWidth, ' ');
  char line[256];
  char val[32] = "";
  if (last_val_ >= 0) std::snprintf(val, sizeof val, " val %.4f", last_val_);
  std::snprintf(line, sizeof line, "step %lld/%lld [%s] loss %.4f%s | %.0f tok/s | ETA %s", static_cast<long long>(done),
                static_cast<long long>(total_), bar.c_str(), m.loss, val, tok_s, duration(per_step * double(total_ - done)).c_str());
  const std::int64_t every = std::max<std::int64_t>(1, total_ / 20);
  if (tty_) {
    std::fprintf(stderr, "\r%s\033[K", line);
    open_line_ = true;
  } else if (done % every == 0 || done == total_ || m.val_loss) {
    std::fprintf(stderr, "%s\n", line);
  }
  std::fflush(stderr);
}

void Progress::finish() {
  if (enabled_ && open_line_) std::fprintf(stderr, "\n");
  open_line_ = false;
}

}  // namespace stableflash::train
