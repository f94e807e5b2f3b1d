// `stableflash bench attention`'s table (TFLOP/s of the CUDA attention after an oracle check per
// configuration), shared with the kernel lab's program (attention/cuda/lab/kernel_lab.cpp), which
// runs it on its comparison kernels.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "stableflash/attention/cuda.hpp"

namespace stableflash::cli {

struct AttentionBenchConfig {
  // the four multi-head shapes of docs/benchmarks.md and a grouped-query one (Llama: 64 query, 8 KV heads)
  std::string shapes =
      "16x12x1024x64:causal,16x12x1024x64:full,8x16x4096x128:causal,2x16x16384x128:causal,2x64x4096x128:causal:kv8";
  std::string numerics = "fused", policies = "standard", delta_sources = "rounded", layout = "bhtd", json;
  std::string normalizer = "fp32";  // fused: the row sums' terms (one for the whole run)
  double warmup_s = 0.3, min_window_ms = 20.0;
  int windows = 7, check_len = 333;
  bool no_check = false, deterministic = false;
  std::uint64_t seed = 0;
};

// One shape of --shapes: "BxHxTxD:causal|full[:kvN]" (Tq = Tk = T; kvN: N KV heads, grouped-query).
struct BenchShape {
  attention::AttentionShape shape;
  bool causal = false;
};
// A comma-separated list of them; std::invalid_argument naming `flag` and the bad item otherwise.
std::vector<BenchShape> parse_bench_shapes(const std::string& list, const char* flag = "--shapes");

// Registers the table's flags on a (sub)command.
void add_attention_bench_flags(CLI::App* app, AttentionBenchConfig& c);
// Runs the table; exit code 1 when an oracle check failed.
int run_attention_bench(const AttentionBenchConfig& c, const attention::cuda::Kernels& kernels = {});

}  // namespace stableflash::cli
