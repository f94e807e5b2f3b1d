// The `stableflash` subcommands. Each registers its flags on the CLI and runs by calling the
// library; no numerics lives here.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace stableflash::cli {

// Registers a subcommand and returns the function that runs it once parsed (exit code).
using Runner = std::function<int()>;
Runner add_attention_command(CLI::App& app);
Runner add_audit_command(CLI::App& app);
Runner add_bench_command(CLI::App& app);
Runner add_encode_command(CLI::App& app);
Runner add_decode_command(CLI::App& app);
Runner add_prepare_command(CLI::App& app);
Runner add_train_command(CLI::App& app);
Runner add_sample_command(CLI::App& app);

}  // namespace stableflash::cli
