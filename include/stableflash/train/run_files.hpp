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
  // Reads and validates the log's first `max_steps` steps (all when negative); lines after them are
  // not read, so a last line torn by a kill or a full disk past them does no harm. Errors name the
  // file and line.
  static BatchLog read(const std::string& path, std::int64_t max_steps = -1);
};

// The batch log a resumed run continues: the first `steps` steps of the log at `path`, which must
// exist (a run's log cannot be rebuilt once its data order is lost), match `header` and hold
// them all. Reads only; errors name the file and what is missing.
std::vector<std::vector<data::WindowStart>> batch_log_for_resume(const std::string& path, const BatchLogHeader& header, std::int64_t steps);

class BatchLogWriter {
 public:
  // Replaces `path` (atomically) with the header and the steps `kept` (a resumed run's
  // batch_log_for_resume: what the interrupted run logged past its checkpoint is dropped), then
  // opens it for appending.
  BatchLogWriter(const std::string& path, const BatchLogHeader& header, const std::vector<std::vector<data::WindowStart>>& kept);
  void append(std::int64_t step, const std::vector<data::WindowStart>& windows);  // flushed per line

 private:
  std::string path_;
  std::ofstream out_;
};

// Keeps only the JSON lines of `path` whose "step" is < first_step (atomically); no file: no-op.
void truncate_metrics(const std::string& path, std::int64_t first_step);

}  // namespace stableflash::train
