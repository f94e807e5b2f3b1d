// The spike detector and its captures (see spikes.hpp).
#include "spikes.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include "stableflash/data/atomic_file.hpp"
#include "stableflash/train/run_files.hpp"

namespace stableflash::train {
namespace fs = std::filesystem;
namespace {

double median(std::deque<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void remember(std::deque<double>& h, double v, int window) {
  if (!std::isfinite(v)) return;
  h.push_back(v);
  while (int(h.size()) > window) h.pop_front();
}

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

// Hard links where the file system allows them (a capture then costs no space and survives the
// rotation that removes the original folder), else copies.
void link_or_copy_tree(const fs::path& from, const fs::path& to) {
  fs::create_directories(to);
  for (const auto& e : fs::directory_iterator(from)) {
    if (!e.is_regular_file()) continue;
    std::error_code ec;
    fs::create_hard_link(e.path(), to / e.path().filename(), ec);
    if (ec) fs::copy_file(e.path(), to / e.path().filename(), fs::copy_options::overwrite_existing);
  }
}

}  // namespace

std::optional<std::string> SpikeDetector::check(const StepMetrics& m) {
  std::optional<std::string> why;
  // The loss needs some history before a median means anything (at most the window).
  const std::size_t loss_history = std::size_t(std::min(s_.spike_window, 10));
  if (s_.spike_loss_factor > 0 && losses_.size() >= loss_history && std::isfinite(m.loss)) {
    const double med = median(losses_);
    if (m.loss > s_.spike_loss_factor * med)
      why = "loss " + fmt(m.loss) + " > " + fmt(s_.spike_loss_factor) + " x the median " + fmt(med) + " of the last " +
            std::to_string(losses_.size()) + " steps";
  }
  if (!why && s_.spike_sigma_factor > 0)
    for (const auto& [name, value] : m.sigmas) {
      const auto it = sigmas_.find(name);
      if (it == sigmas_.end() || it->second.size() < 3 || !std::isfinite(value)) continue;
      const double med = median(it->second);
      if (value > s_.spike_sigma_factor * med) {
        why = "spectral norm of " + name + " " + fmt(value) + " > " + fmt(s_.spike_sigma_factor) + " x the median " + fmt(med) +
              " of its last " + std::to_string(it->second.size()) + " probes";
        break;
      }
    }
  remember(losses_, m.loss, s_.spike_window);
  for (const auto& [name, value] : m.sigmas) remember(sigmas_[name], value, s_.spike_window);
  return why;
}

void SpikeDetector::restore(const std::string& metrics_path) {
  std::ifstream in(metrics_path);
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) continue;
    if (j.contains("loss") && j["loss"].is_number()) remember(losses_, j["loss"].get<double>(), s_.spike_window);
    if (j.contains("wq_sigma") && j["wq_sigma"].is_array())
      for (std::size_t l = 0; l < j["wq_sigma"].size(); ++l)
        if (j["wq_sigma"][l].is_number()) remember(sigmas_["h." + std::to_string(l) + ".wq"], j["wq_sigma"][l].get<double>(), s_.spike_window);
    if (j.contains("sigma") && j["sigma"].is_object())
      for (const auto& [name, v] : j["sigma"].items())
        if (v.is_number()) remember(sigmas_[name], v.get<double>(), s_.spike_window);
  }
}

SpikeCapture write_spike_capture(const std::string& run_dir, const TrainConfig& config, std::int64_t step, const std::string& reason,
                                 const std::string& checkpoint, std::int64_t checkpoint_step) {
  char name[32];
  std::snprintf(name, sizeof name, "step_%08lld", static_cast<long long>(step));
  const fs::path dir = fs::path(run_dir) / "captures" / name;
  fs::remove_all(dir);  // a rerun of the same step (after a resume) replaces its capture
  fs::create_directories(dir);
  const std::string d = dir.string();

  // The data order up to and including the spike's step: the replay's windows.
  const BatchLog log = BatchLog::read(run_dir + "/batches.log", step + 1);
  BatchLogWriter(d + "/replay.log", log.header, log.steps);
  // The probe history: every metrics line so far (the spike's step included).
  fs::copy_file(run_dir + "/metrics.jsonl", d + "/probe_history.jsonl", fs::copy_options::overwrite_existing);

  // The replay never needs a capture of its own.
  const std::string quiet = " --set probe.spike_captures=0";
  const std::string steps = " --steps " + std::to_string(step + 1);
  SpikeCapture out;
  out.dir = d;
  if (!checkpoint.empty()) {
    // A run directory that resumes from the checkpoint before the spike: config, the batch log up to
    // the checkpoint, and the checkpoint itself.
    fs::copy_file(run_dir + "/config.json", d + "/config.json", fs::copy_options::overwrite_existing);
    const std::vector<std::vector<data::WindowStart>> before(log.steps.begin(), log.steps.begin() + checkpoint_step);
    BatchLogWriter(d + "/batches.log", log.header, before);
    const std::string ckpt_name = fs::path(checkpoint).filename().string();
    link_or_copy_tree(checkpoint, dir / "checkpoints" / ckpt_name);
    data::write_file_atomically(d + "/checkpoints/latest", [&](std::ostream& o) { o << ckpt_name << "\n"; });
    out.replay_command = "stableflash train --run-dir " + d + " --resume --replay " + d + "/replay.log" + steps + quiet;
  } else {
    // No checkpoint yet: the replay starts from the seeded initialisation, with the run's settings.
    nlohmann::ordered_json settings;
    for (const auto& [k, v] : config.entries()) settings[k] = v;
    data::write_file_atomically(d + "/settings.json", [&](std::ostream& o) { o << settings.dump(2) << "\n"; });
    out.replay_command = "stableflash train --preset " + config.preset + " --config " + d + "/settings.json --run-dir " + d +
                         "/replay --replay " + d + "/replay.log" + steps + quiet;
  }
  nlohmann::ordered_json j;
  j["step"] = step;
  j["reason"] = reason;
  j["checkpoint_step"] = checkpoint.empty() ? 0 : checkpoint_step;
  j["replay"] = out.replay_command;
  data::write_file_atomically(d + "/capture.json", [&](std::ostream& o) { o << j.dump(2) << "\n"; });
  return out;
}

}  // namespace stableflash::train
