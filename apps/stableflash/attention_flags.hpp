// The numerics-contract flags shared by `attention` and `audit`, parsed into AttentionOptions.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "stableflash/attention/attention.hpp"

namespace stableflash::cli {

// Raw flag values, converted and validated by to_options() after parsing.
struct AttentionFlags {
  std::string numerics = "fused", policy = "standard", normalizer = "fp32", delta_source = "rounded";
  std::string layout = "bhtd", tile, device = "cpu";
  float beta = 2.0f, eps = 1e-3f, scale = 0.0f;
  int round_bits = 7;
  bool causal = false;
  bool deterministic = false;
};

void add_attention_flags(CLI::App& cmd, AttentionFlags& f);
// Throws std::invalid_argument naming the flag on a bad value.
attention::AttentionOptions to_options(const AttentionFlags& f);
attention::Layout to_layout(const AttentionFlags& f);
// Parses "BRxBC" (e.g. "128x64"); throws naming --tile.
std::pair<int, int> parse_tile(const std::string& s);

}  // namespace stableflash::cli
