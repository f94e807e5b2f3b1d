// Checks a run directory before anything is drawn: a report that dies half-way inside matplotlib
// on line 812 of one of 14 files helps nobody, a message naming the file and line does.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "stableflash/report/report.hpp"

namespace stableflash::report {

namespace fs = std::filesystem;

RunCheck check_run_dir(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) throw std::runtime_error(dir + ": no such run directory");
  if (!fs::is_directory(dir, ec)) throw std::runtime_error(dir + ": not a directory (give run directories, not their files)");
  const std::string path = (fs::path(dir) / "metrics.jsonl").string();
  if (!fs::exists(path, ec)) throw std::runtime_error(path + ": not found; is " + dir + " a run directory of `stableflash train`?");
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot be read");

  RunCheck check{dir};
  std::string line;
  for (std::int64_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(number) + ": ";
    nlohmann::json row;
    try {
      row = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      // nlohmann's "byte N" is the column within this line, since each line is parsed alone.
      throw std::runtime_error(where + "malformed JSON (" + e.what() + ")");
    }
    if (!row.is_object()) throw std::runtime_error(where + "not a JSON object");
    const auto step = row.find("step");
    if (step == row.end() || !step->is_number_integer()) throw std::runtime_error(where + "no integer \"step\"");
    const auto loss = row.find("loss");
    if (loss == row.end() || !loss->is_number()) throw std::runtime_error(where + "no numeric \"loss\"");
    ++check.lines;
    check.last_step = step->get<std::int64_t>();
  }
  if (in.bad()) throw std::runtime_error(path + ": read error");
  if (check.lines == 0) throw std::runtime_error(path + ": holds no steps yet; nothing to report");
  return check;
}

}  // namespace stableflash::report
