// The run directory's logs: the batch log (one line per optimizer step with the start of every
// window it trained on: the paper's record/replay) and the metrics JSON lines.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "stableflash/data/shards.hpp"

namespace stableflash::train {

// Batch log format (text):
//   # stableflash batch log v1
//   # shards: train_000000.bin train_000001.bin      (file names, in index order)
//   # windows_per_step: 16 window_tokens: 129
//   0 0:123456 1:98765 ...                          (step, then shard:offset per window)
struct BatchLogHeader {
  std::vector<std::string> shards;  // file names (no folder), so a log replays on a moved corpus
  int windows_per_step = 0;
  int window_tokens = 0;
  bool operator==(const BatchLogHeader&) const = default;
};

struct BatchLog {
  BatchLogHeader header;
  std::vector<std::vector<data::WindowStart>> steps;  // steps[s]: the windows of step s
  // Reads and validates a whole log; errors name the file and line.
  static BatchLog read(const std::string& path);
};

class BatchLogWriter {
 public:
  // Opens `path` for appending after keeping only its lines of steps < first_step (a resumed run
  // rewrites what the interrupted run logged past its checkpoint). A new file gets the header.
  BatchLogWriter(const std::string& path, const BatchLogHeader& header, std::int64_t first_step);
  void append(std::int64_t step, const std::vector<data::WindowStart>& windows);  // flushed per line

 private:
  std::string path_;
  std::ofstream out_;
};

// Keeps only the JSON lines of `path` whose "step" is < first_step (atomically); no file: no-op.
void truncate_metrics(const std::string& path, std::int64_t first_step);

}  // namespace stableflash::train
