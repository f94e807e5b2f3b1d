// `stableflash report RUN_DIR... [-o OUT_DIR] [--title T]`: plots and one HTML page from run directories.
#include <memory>

#include "commands.hpp"
#include "stableflash/report/report.hpp"

namespace stableflash::cli {

Runner add_report_command(CLI::App& app) {
  auto options = std::make_shared<report::ReportOptions>();
  auto* sub = app.add_subcommand("report", "Plots (PNG and SVG) and one HTML page from run directories, the runs overlaid");
  sub->add_option("run_dirs", options->run_dirs, "Run directories written by `stableflash train` (each holds metrics.jsonl)")
      ->required();
  sub->add_option("-o,--out", options->out_dir, "Output folder (default: report/ inside the first run directory)");
  sub->add_option("--title", options->title, "The page's title (default: the run directories' names)");
  return [options] { return report::make_report(*options); };
}

}  // namespace stableflash::cli
