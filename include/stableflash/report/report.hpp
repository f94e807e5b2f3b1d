// `stableflash report`: turns run directories into plots and one HTML page. The C++ side checks
// the inputs (so a bad file is named with its line before anything is drawn) and starts the
// matplotlib script shipped in report/python/; the drawing itself lives in Python.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace stableflash::report {

// What the checks learned about one run directory.
struct RunCheck {
  std::string dir;
  std::int64_t lines = 0;  // metrics.jsonl's JSON objects (blank lines are not counted)
  std::int64_t last_step = -1;
};

// Checks that `dir` is a directory holding a readable metrics.jsonl whose every non-blank line is
// a JSON object with an integer "step" and a numeric "loss". Throws std::runtime_error naming the
// file and, for a bad line, its 1-based number ("RUN/metrics.jsonl:7: ...").
RunCheck check_run_dir(const std::string& dir);

struct ReportOptions {
  std::vector<std::string> run_dirs;
  std::string out_dir;  // empty: report_default_out_dir(run_dirs)
  std::string title;    // empty: the script's default
};

// RUN_DIR_1/report: next to the metrics it was drawn from, also when several runs are compared.
std::string report_default_out_dir(const std::vector<std::string>& run_dirs);

// The script that draws the report: $STABLEFLASH_REPORT_SCRIPT if set, else report/python/make_report.py
// of the source tree this program was built from. Throws if it is not there.
std::string report_script_path();

// Checks every run, then runs `python3 SCRIPT --out OUT [--title T] RUN...` with the project's
// .deps/python on PYTHONPATH, its output going to this process's stdout/stderr (progress lines).
// Returns the script's exit code; throws when a run fails its check or python3 cannot be started.
int make_report(const ReportOptions& options);

}  // namespace stableflash::report
