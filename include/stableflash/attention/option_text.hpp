// The knobs of AttentionOptions by name, from text: the one parser behind the trainer's
// attention.default.KEY / attention.layer.N.KEY settings and the --flags of `attention`, `audit`
// and `bench attention`, so a name or a value means the same everywhere and every error reads alike.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "stableflash/attention/attention.hpp"

namespace stableflash::attention {

// The knob names: numerics, policy, beta, eps, tile_q, tile_k, normalizer, round_bits, delta_source
// (what a trainer layer sets), then causal, scale, device, deterministic.
const std::vector<std::string>& option_names();

// Sets one knob from its text. Throws std::invalid_argument "WHERE: KEY = 'VALUE': expected ..."
// for an unknown name or a bad value (`where` names the setting's source, e.g. "--set" or a flag).
void set_option(AttentionOptions& options, std::string_view name, std::string_view value, std::string_view where);

// The attention stableflash recommends, as (name, value) settings for set_option: `fused` numerics,
// the `standard` shift, delta from the `compensated` output, the FP32 normalizer, BF16 (7-bit)
// rounding (docs/numerics-findings.md, "Recommendation"). The one definition of the project's
// default: the trainer's (train::recommended_attention), the C ABI's sf_recommended_options and
// through it the Python package's read it. Knobs it does not name keep AttentionOptions' defaults.
const std::vector<std::pair<std::string, std::string>>& recommended_settings();
// AttentionOptions{} with recommended_settings() applied.
AttentionOptions recommended_options();

}  // namespace stableflash::attention
