// The `stableflash` subcommands. Each registers its flags on the CLI and runs by calling the
// library; no numerics lives here.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace stableflash::cli {

// Registers a subcommand and returns the function that runs it once parsed (exit code).
using Runner = std::function<int()>;
// The command line this process was started with (argv), for commands that start copies of it.
const std::vector<std::string>& program_arguments();
// `--gpus N` (N > 1) outside a launched rank: runs N ranks of this command line without --gpus and
// returns their exit code; otherwise returns -1 and the caller runs as one process.
int launch_ranks_if_asked(int gpus);
Runner add_attention_command(CLI::App& app);
Runner add_audit_command(CLI::App& app);
Runner add_bench_command(CLI::App& app);
Runner add_encode_command(CLI::App& app);
Runner add_decode_command(CLI::App& app);
Runner add_prepare_command(CLI::App& app);
Runner add_train_command(CLI::App& app);
Runner add_sample_command(CLI::App& app);
Runner add_report_command(CLI::App& app);

}  // namespace stableflash::cli
