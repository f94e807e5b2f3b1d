// Starts the report script. Python is a child process, not embedded: matplotlib stays out of the
// C++ build, and the script can be run (and tested) on its own.
#include <cstdio>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include <spawn.h>
#include <sys/wait.h>

#include "stableflash/report/report.hpp"

#ifndef STABLEFLASH_SOURCE_DIR
#error "STABLEFLASH_SOURCE_DIR must be defined by the build"
#endif

extern char** environ;

namespace stableflash::report {

namespace fs = std::filesystem;

std::string report_default_out_dir(const std::vector<std::string>& run_dirs) {
  if (run_dirs.empty()) throw std::invalid_argument("report: no run directories given");
  return (fs::path(run_dirs.front()) / "report").string();
}

std::string report_script_path() {
  const char* override_path = std::getenv("STABLEFLASH_REPORT_SCRIPT");
  const std::string path = override_path && *override_path ? std::string(override_path)
                                                            : std::string(STABLEFLASH_SOURCE_DIR) + "/report/python/make_report.py";
  if (!fs::is_regular_file(path))
    throw std::runtime_error(path + ": the report script is not there (this program finds it in the source tree it was built from, "
                                    "or at $STABLEFLASH_REPORT_SCRIPT)");
  return path;
}

namespace {

// This process's environment with the project's .deps/python first on PYTHONPATH (matplotlib is
// installed there by scripts/setup-deps.sh, never into the system's site-packages).
std::vector<std::string> child_environment() {
  const std::string deps = std::string(STABLEFLASH_SOURCE_DIR) + "/.deps/python";
  std::vector<std::string> env;
  std::string pythonpath = deps;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    if (kv.starts_with("PYTHONPATH=")) {
      if (kv.size() > 11) pythonpath += ":" + kv.substr(11);
    } else {
      env.push_back(kv);
    }
  }
  env.push_back("PYTHONPATH=" + pythonpath);
  // No display is needed or wanted: draw into files only.
  env.push_back("MPLBACKEND=Agg");
  return env;
}

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> p;
  for (auto& s : strings) p.push_back(s.data());
  p.push_back(nullptr);
  return p;
}

}  // namespace

int make_report(const ReportOptions& options) {
  if (options.run_dirs.empty()) throw std::invalid_argument("report: no run directories given");
  for (const auto& dir : options.run_dirs) {
    const RunCheck check = check_run_dir(dir);
    std::printf("report: %s: %lld steps (last step %lld)\n", dir.c_str(), static_cast<long long>(check.lines),
                static_cast<long long>(check.last_step));
  }
  std::fflush(stdout);  // before the child writes to the same stream

  std::vector<std::string> args = {"python3", report_script_path(), "--out",
                                   options.out_dir.empty() ? report_default_out_dir(options.run_dirs) : options.out_dir};
  if (!options.title.empty()) args.insert(args.end(), {"--title", options.title});
  args.push_back("--");  // run directories named like flags stay run directories
  args.insert(args.end(), options.run_dirs.begin(), options.run_dirs.end());
  auto env = child_environment();
  auto argv = pointers(args), envp = pointers(env);

  pid_t pid = 0;
  if (const int err = ::posix_spawnp(&pid, "python3", nullptr, nullptr, argv.data(), envp.data()); err != 0)
    throw std::runtime_error(std::string("report: cannot start python3 (") + std::strerror(err) + "); scripts/setup-deps.sh installs it");
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) throw std::runtime_error(std::string("report: waiting for python3: ") + std::strerror(errno));
  if (WIFSIGNALED(status)) throw std::runtime_error("report: python3 was killed by signal " + std::to_string(WTERMSIG(status)));
  return WEXITSTATUS(status);
}

}  // namespace stableflash::report
