// Batch log and metrics files of a run directory (see run_files.hpp).
#include "stableflash/train/run_files.hpp"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <sstream>
#include <stdexcept>

#include "stableflash/data/atomic_file.hpp"

namespace stableflash::train {
namespace {

constexpr const char* kMagicLine = "# stableflash batch log v1";

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot open");
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::string header_text(const BatchLogHeader& h) {
  std::string s = std::string(kMagicLine) + "\n# shards:";
  for (const auto& name : h.shards) s += " " + name;
  s += "\n# windows_per_step: " + std::to_string(h.windows_per_step) + " window_tokens: " + std::to_string(h.window_tokens) + "\n";
  return s;
}

}  // namespace

BatchLog BatchLog::read(const std::string& path, std::int64_t max_steps) {
  const auto lines = read_lines(path);
  auto fail = [&](std::size_t line, const std::string& what) -> void {
    throw std::runtime_error(path + ":" + std::to_string(line + 1) + ": " + what);
  };
  if (lines.size() < 3 || lines[0] != kMagicLine) fail(0, "not a stableflash batch log (expected '" + std::string(kMagicLine) + "')");
  BatchLog log;
  {
    std::istringstream s(lines[1]);
    std::string hash, tag, name;
    s >> hash >> tag;
    if (hash != "#" || tag != "shards:") fail(1, "expected '# shards: NAME...'");
    while (s >> name) log.header.shards.push_back(name);
  }
  {
    std::istringstream s(lines[2]);
    std::string hash, t1, t2;
    s >> hash >> t1 >> log.header.windows_per_step >> t2 >> log.header.window_tokens;
    if (hash != "#" || t1 != "windows_per_step:" || t2 != "window_tokens:" || !s || log.header.windows_per_step < 1)
      fail(2, "expected '# windows_per_step: N window_tokens: M'");
  }
  for (std::size_t i = 3; i < lines.size(); ++i) {
    if (max_steps >= 0 && std::int64_t(log.steps.size()) >= max_steps) break;
    if (lines[i].empty()) continue;
    std::istringstream s(lines[i]);
    std::int64_t step = -1;
    s >> step;
    if (step != std::int64_t(log.steps.size()))
      fail(i, "expected step " + std::to_string(log.steps.size()) + " (steps must be consecutive from 0)");
    std::vector<data::WindowStart> windows;
    std::string tok;
    while (s >> tok) {
      const auto colon = tok.find(':');
      try {
        if (colon == std::string::npos) throw std::invalid_argument("no colon");
        windows.push_back({std::uint32_t(std::stoul(tok.substr(0, colon))), std::uint64_t(std::stoull(tok.substr(colon + 1)))});
      } catch (const std::exception&) {
        fail(i, "bad window '" + tok + "' (expected shard:offset)");
      }
    }
    if (int(windows.size()) != log.header.windows_per_step)
      fail(i, std::to_string(windows.size()) + " windows, the header says " + std::to_string(log.header.windows_per_step));
    log.steps.push_back(std::move(windows));
  }
  return log;
}

std::vector<std::vector<data::WindowStart>> batch_log_for_resume(const std::string& path, const BatchLogHeader& header, std::int64_t steps) {
  if (!std::filesystem::exists(path))
    throw std::runtime_error(path + " is missing: the windows of the run's first " + std::to_string(steps) +
                             " steps are lost with it, so the run could no longer be replayed; restore the file, or start a new run "
                             "(--replay and a seeded run draw the same data)");
  BatchLog old = BatchLog::read(path, steps);
  if (!(old.header == header))
    throw std::runtime_error(path + ": the existing batch log was written for other shards or batch shape; refusing to mix them");
  if (std::int64_t(old.steps.size()) < steps)
    throw std::runtime_error(path + ": holds " + std::to_string(old.steps.size()) + " steps, the checkpoint is at step " +
                             std::to_string(steps) + "; the log of the steps before it is incomplete");
  return std::move(old.steps);
}

BatchLogWriter::BatchLogWriter(const std::string& path, const BatchLogHeader& header, const std::vector<std::vector<data::WindowStart>>& kept)
    : path_(path) {
  std::string keep = header_text(header);
  for (std::size_t s = 0; s < kept.size(); ++s) {
    keep += std::to_string(s);
    for (const auto& w : kept[s]) keep += " " + std::to_string(w.shard) + ":" + std::to_string(w.offset);
    keep += "\n";
  }
  data::write_file_atomically(path, [&](std::ostream& o) { o << keep; });
  out_.open(path, std::ios::app);
  if (!out_) throw std::runtime_error(path + ": cannot open for appending");
}

void BatchLogWriter::append(std::int64_t step, const std::vector<data::WindowStart>& windows) {
  out_ << step;
  for (const auto& w : windows) out_ << ' ' << w.shard << ':' << w.offset;
  out_ << '\n';
  out_.flush();
  if (!out_) throw std::runtime_error(path_ + ": write failed");
}

void truncate_metrics(const std::string& path, std::int64_t first_step) {
  if (!std::filesystem::exists(path)) return;
  std::string keep;
  for (const auto& line : read_lines(path)) {
    if (line.empty()) continue;
    try {
      if (nlohmann::json::parse(line).at("step").get<std::int64_t>() >= first_step) continue;
    } catch (const std::exception&) {
      continue;  // a line cut by a crash
    }
    keep += line + "\n";
  }
  data::write_file_atomically(path, [&](std::ostream& o) { o << keep; });
}

}  // namespace stableflash::train
