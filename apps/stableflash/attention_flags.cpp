#include "attention_flags.hpp"

#include <stdexcept>

#include "stableflash/attention/option_text.hpp"

namespace stableflash::cli {

using namespace stableflash::attention;

namespace {
// The flag of a knob: delta_source -> delta-source.
std::string flag_name(std::string name) {
  for (char& c : name)
    if (c == '_') c = '-';
  return name;
}
}  // namespace

void add_attention_flags(CLI::App& cmd, AttentionFlags& f) {
  cmd.add_option("--numerics", f.numerics, "Rounding points: " + valid_names_numerics())->capture_default_str();
  cmd.add_option("--policy", f.policy, "Softmax shift policy: " + valid_names_shift_policy())->capture_default_str();
  cmd.add_option("--beta", f.beta, "beta of the published policy")->capture_default_str();
  cmd.add_option("--eps", f.eps, "tie tolerance of the published policy")->capture_default_str();
  cmd.add_option("--tile", f.tile, "Tile BRxBC (query rows x key columns); default: paper 512x512, fused 128x128");
  cmd.add_flag("--causal", f.causal, "Causal mask, bottom-right aligned");
  cmd.add_option("--scale", f.scale, "Softmax scale; 0 = 1/sqrt(D)")->capture_default_str();
  cmd.add_option("--layout", f.layout, "Tensor layout: bhtd ([B,H,T,D]) or bthd ([B,T,H,D])")->capture_default_str();
  cmd.add_option("--normalizer", f.normalizer, "fused: row sum from the FP32 P-bar or its BF16 rounding: " + valid_names_normalizer())
      ->capture_default_str();
  cmd.add_option("--round-bits", f.round_bits, "Significand bits at the output rounding points (7 = BF16; fewer magnify, experiments only)")
      ->capture_default_str();
  cmd.add_option("--delta-source", f.delta_source, "Backward delta from: " + valid_names_delta_source())->capture_default_str();
  cmd.add_option("--device", f.device, "Where attention runs: cpu, cuda (head_dim 64 or 128, key tile a multiple of 64)")
      ->capture_default_str();
  cmd.add_flag("--deterministic", f.deterministic, "cuda: accumulate dQ in a fixed order (bitwise reproducible backward)");
}

std::pair<int, int> parse_tile(const std::string& s) {
  const auto x = s.find('x');
  try {
    if (x == std::string::npos) throw std::invalid_argument("");
    std::size_t used1 = 0, used2 = 0;
    const int br = std::stoi(s.substr(0, x), &used1), bc = std::stoi(s.substr(x + 1), &used2);
    if (used1 != x || used2 != s.size() - x - 1 || br < 1 || bc < 1) throw std::invalid_argument("");
    return {br, bc};
  } catch (const std::exception&) {
    throw std::invalid_argument("--tile: expected BRxBC with positive integers (e.g. 128x64), got '" + s + "'");
  }
}

template <class T>
T require(std::optional<T> v, const std::string& flag, const std::string& got, const std::string& valid) {
  if (!v) throw std::invalid_argument(flag + ": unknown value '" + got + "' (expected one of: " + valid + ")");
  return *v;
}

// The named knobs through the library's one text parser (attention::set_option), as the trainer's
// keys; CLI11 has already typed the numeric flags.
AttentionOptions to_options(const AttentionFlags& f) {
  AttentionOptions o;
  const std::pair<const char*, const std::string*> named[] = {
      {"numerics", &f.numerics}, {"policy", &f.policy}, {"normalizer", &f.normalizer}, {"delta_source", &f.delta_source}, {"device", &f.device}};
  for (const auto& [name, value] : named) set_option(o, name, *value, "--" + flag_name(name));
  o.policy_params = {f.beta, f.eps};
  o.causal = f.causal;
  o.scale = f.scale;
  o.round_bits = f.round_bits;
  o.deterministic = f.deterministic;
  if (!f.tile.empty()) std::tie(o.tile_q, o.tile_k) = parse_tile(f.tile);
  return o;
}

Layout to_layout(const AttentionFlags& f) { return require(parse_layout(f.layout), "--layout", f.layout, "bhtd, bthd"); }

}  // namespace stableflash::cli
