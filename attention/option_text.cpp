// AttentionOptions from text (see option_text.hpp).
#include "stableflash/attention/option_text.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <utility>

namespace stableflash::attention {
namespace {

[[noreturn]] void bad(std::string_view where, std::string_view key, std::string_view value, const std::string& expected) {
  throw std::invalid_argument(std::string(where) + ": " + std::string(key) + " = '" + std::string(value) + "': " + expected);
}

template <class E>
E named(std::optional<E> v, std::string_view where, std::string_view key, std::string_view value, const std::string& valid) {
  if (!v) bad(where, key, value, "expected one of " + valid);
  return *v;
}

double number(std::string_view where, std::string_view key, std::string_view value) {
  const std::string s(value);
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end || errno || !std::isfinite(v)) bad(where, key, value, "expected a finite number");
  return v;
}

int integer(std::string_view where, std::string_view key, std::string_view value) {
  const std::string s(value);
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(s.c_str(), &end, 10);
  if (s.empty() || *end || errno || v < -(1L << 30) || v > (1L << 30)) bad(where, key, value, "expected an integer");
  return int(v);
}

bool boolean(std::string_view where, std::string_view key, std::string_view value) {
  if (value == "true" || value == "1") return true;
  if (value == "false" || value == "0") return false;
  bad(where, key, value, "expected true or false");
}

using Setter = std::function<void(AttentionOptions&, std::string_view where, std::string_view key, std::string_view value)>;

const std::vector<std::pair<std::string, Setter>>& setters() {
  static const std::vector<std::pair<std::string, Setter>> table = {
      {"numerics", [](AttentionOptions& o, auto w, auto k, auto v) { o.numerics = named(parse_numerics(v), w, k, v, valid_names_numerics()); }},
      {"policy", [](AttentionOptions& o, auto w, auto k, auto v) { o.policy = named(parse_shift_policy(v), w, k, v, valid_names_shift_policy()); }},
      {"beta", [](AttentionOptions& o, auto w, auto k, auto v) { o.policy_params.beta = float(number(w, k, v)); }},
      {"eps", [](AttentionOptions& o, auto w, auto k, auto v) { o.policy_params.eps = float(number(w, k, v)); }},
      {"tile_q", [](AttentionOptions& o, auto w, auto k, auto v) { o.tile_q = integer(w, k, v); }},
      {"tile_k", [](AttentionOptions& o, auto w, auto k, auto v) { o.tile_k = integer(w, k, v); }},
      {"normalizer", [](AttentionOptions& o, auto w, auto k, auto v) { o.normalizer = named(parse_normalizer(v), w, k, v, valid_names_normalizer()); }},
      {"round_bits", [](AttentionOptions& o, auto w, auto k, auto v) { o.round_bits = integer(w, k, v); }},
      {"delta_source",
       [](AttentionOptions& o, auto w, auto k, auto v) { o.delta_source = named(parse_delta_source(v), w, k, v, valid_names_delta_source()); }},
      {"causal", [](AttentionOptions& o, auto w, auto k, auto v) { o.causal = boolean(w, k, v); }},
      {"scale", [](AttentionOptions& o, auto w, auto k, auto v) { o.scale = float(number(w, k, v)); }},
      {"device", [](AttentionOptions& o, auto w, auto k, auto v) { o.device = named(parse_device(v), w, k, v, "cpu, cuda"); }},
      {"deterministic", [](AttentionOptions& o, auto w, auto k, auto v) { o.deterministic = boolean(w, k, v); }},
  };
  return table;
}

}  // namespace

const std::vector<std::string>& option_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const auto& [name, set] : setters()) out.push_back(name);
    return out;
  }();
  return names;
}

void set_option(AttentionOptions& options, std::string_view name, std::string_view value, std::string_view where) {
  for (const auto& [n, set] : setters())
    if (n == name) return set(options, where, name, value);
  std::string valid;
  for (const auto& n : option_names()) valid += (valid.empty() ? "" : ", ") + n;
  throw std::invalid_argument(std::string(where) + ": unknown attention setting '" + std::string(name) + "'; valid: " + valid);
}

const std::vector<std::pair<std::string, std::string>>& recommended_settings() {
  // Why these: docs/numerics-findings.md, "Recommendation" (hashed_offset until issue 11, compensated
  // until auto: the exact delta where it is the cheaper clean one).
  static const std::vector<std::pair<std::string, std::string>> settings = {
      {"numerics", "fused"}, {"policy", "standard"}, {"delta_source", "auto"}, {"normalizer", "fp32"}, {"round_bits", "7"}};
  return settings;
}

AttentionOptions recommended_options() {
  AttentionOptions o;
  for (const auto& [name, value] : recommended_settings()) set_option(o, name, value, "recommended attention");
  return o;
}

}  // namespace stableflash::attention
