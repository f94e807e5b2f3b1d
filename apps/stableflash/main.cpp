// stableflash: BF16 attention that does not blow up training, and the tools to see why.
#include <cstdio>
#include <exception>
#include <map>
#include <new>
#include <string>

#include "commands.hpp"
#include "stableflash/train/distributed.hpp"

namespace stableflash::cli {
namespace {
std::vector<std::string>& arguments() {
  static std::vector<std::string> args;
  return args;
}
}  // namespace

const std::vector<std::string>& program_arguments() { return arguments(); }

int launch_ranks_if_asked(int gpus) {
  if (gpus <= 1 || train::world_from_environment().distributed()) return -1;
  std::vector<std::string> args = {"/proc/self/exe"};
  const auto& all = program_arguments();
  for (std::size_t i = 1; i < all.size(); ++i) {
    if (all[i] == "--gpus") {
      ++i;  // and its value
      continue;
    }
    if (all[i].starts_with("--gpus=")) continue;
    args.push_back(all[i]);
  }
  return train::launch_local_ranks(gpus, args);
}
}  // namespace stableflash::cli

int main(int argc, char** argv) {
  stableflash::cli::arguments().assign(argv, argv + argc);
  CLI::App app{"stableflash: stable BF16 flash attention, its CPU oracle and the rounding-bias audit"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "stableflash 0.1.0");
  std::map<std::string, stableflash::cli::Runner> runners;
  runners["attention"] = stableflash::cli::add_attention_command(app);
  runners["audit"] = stableflash::cli::add_audit_command(app);
  runners["bench"] = stableflash::cli::add_bench_command(app);
  runners["encode"] = stableflash::cli::add_encode_command(app);
  runners["decode"] = stableflash::cli::add_decode_command(app);
  runners["prepare"] = stableflash::cli::add_prepare_command(app);
  runners["train"] = stableflash::cli::add_train_command(app);
  runners["sample"] = stableflash::cli::add_sample_command(app);
  runners["report"] = stableflash::cli::add_report_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (auto* sub : app.get_subcommands()) return runners.at(sub->get_name())();
  } catch (const std::bad_alloc&) {
    // The bare "std::bad_alloc" tells a user nothing; sizes come from their files and flags.
    std::fprintf(stderr, "stableflash: error: out of memory: this command needs more memory than the machine (or its limit, "
                         "ulimit -v / a cgroup) allows; check the sizes in the input files and flags\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "stableflash: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
