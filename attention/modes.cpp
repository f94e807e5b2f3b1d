// Names of the numerics-contract enums and the resolution/validation of attention options.
#include <array>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

#include "stableflash/attention/attention.hpp"
#include "stableflash/attention/modes.hpp"

namespace stableflash::attention {
namespace {

template <class E, std::size_t N>
using NameTable = std::array<std::pair<E, std::string_view>, N>;

constexpr NameTable<Numerics, 3> kNumerics{{{Numerics::reference, "reference"}, {Numerics::paper, "paper"}, {Numerics::fused, "fused"}}};
constexpr NameTable<Normalizer, 2> kNormalizer{{{Normalizer::fp32, "fp32"}, {Normalizer::bf16, "bf16"}}};
constexpr NameTable<DeltaSource, 4> kDeltaSource{{{DeltaSource::rounded, "rounded"},
                                                  {DeltaSource::compensated, "compensated"},
                                                  {DeltaSource::exact, "exact"},
                                                  {DeltaSource::automatic, "auto"}}};
constexpr NameTable<ShiftPolicy, 4> kShiftPolicy{{{ShiftPolicy::standard, "standard"},
                                                  {ShiftPolicy::paper, "paper"},
                                                  {ShiftPolicy::hashed_offset, "hashed_offset"},
                                                  {ShiftPolicy::fixed_offset, "fixed_offset"}}};
constexpr NameTable<Layout, 2> kLayout{{{Layout::bhtd, "bhtd"}, {Layout::bthd, "bthd"}}};

template <class E, std::size_t N>
std::string_view name_of(const NameTable<E, N>& table, E v) {
  for (const auto& [e, n] : table)
    if (e == v) return n;
  return "?";
}

template <class E, std::size_t N>
std::optional<E> parse_in(const NameTable<E, N>& table, std::string_view s) {
  for (const auto& [e, n] : table)
    if (n == s) return e;
  return std::nullopt;
}

template <class E, std::size_t N>
std::string all_names(const NameTable<E, N>& table) {
  std::string out;
  for (const auto& [e, n] : table) out += (out.empty() ? "" : ", ") + std::string(n);
  return out;
}

}  // namespace

std::string_view to_string(Numerics v) { return name_of(kNumerics, v); }
std::string_view to_string(Normalizer v) { return name_of(kNormalizer, v); }
std::string_view to_string(DeltaSource v) { return name_of(kDeltaSource, v); }
std::string_view to_string(ShiftPolicy v) { return name_of(kShiftPolicy, v); }
std::string_view to_string(Layout v) { return name_of(kLayout, v); }

std::optional<Numerics> parse_numerics(std::string_view s) { return parse_in(kNumerics, s); }
std::optional<Normalizer> parse_normalizer(std::string_view s) { return parse_in(kNormalizer, s); }
std::optional<DeltaSource> parse_delta_source(std::string_view s) { return parse_in(kDeltaSource, s); }
std::optional<ShiftPolicy> parse_shift_policy(std::string_view s) { return parse_in(kShiftPolicy, s); }
std::optional<Layout> parse_layout(std::string_view s) { return parse_in(kLayout, s); }

std::string valid_names_numerics() { return all_names(kNumerics); }
std::string valid_names_normalizer() { return all_names(kNormalizer); }
std::string valid_names_delta_source() { return all_names(kDeltaSource); }
std::string valid_names_shift_policy() { return all_names(kShiftPolicy); }

HeadStrides HeadStrides::of(Layout layout, int heads, int len, int head_dim) {
  if (layout == Layout::bthd)
    return {std::int64_t(len) * heads * head_dim, head_dim, std::int64_t(heads) * head_dim};
  return {std::int64_t(heads) * len * head_dim, std::int64_t(len) * head_dim, head_dim};
}

float AttentionOptions::resolved_scale(int head_dim) const {
  return scale != 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
}

int AttentionOptions::resolved_tile_q() const {
  if (tile_q > 0) return tile_q;
  return numerics == Numerics::paper ? 512 : 128;
}

int AttentionOptions::resolved_tile_k() const {
  if (tile_k > 0) return tile_k;
  return numerics == Numerics::paper ? 512 : 128;
}

DeltaSource AttentionOptions::resolved_delta_source(const AttentionShape& shape) const {
  if (delta_source != DeltaSource::automatic) return delta_source;
  return shape.k_len > residual_above_keys() ? DeltaSource::compensated : DeltaSource::exact;
}

AttentionOptions AttentionOptions::for_shape(const AttentionShape& shape) const {
  AttentionOptions o = *this;
  o.delta_source = resolved_delta_source(shape);
  return o;
}

int AttentionOptions::residual_above_keys() const {
  switch (delta_source) {
    case DeltaSource::compensated: return 0;
    // auto's one rule: the exact delta up to kAutoExactMaxKeys keys in fused numerics (attention.hpp
    // says why), the compensated one elsewhere
    case DeltaSource::automatic: return numerics == Numerics::fused ? kAutoExactMaxKeys : 0;
    case DeltaSource::rounded:
    case DeltaSource::exact: break;
  }
  return std::numeric_limits<int>::max();
}

void AttentionOptions::require_residual(const AttentionShape& shape, bool present, const char* what) const {
  if (present || !needs_residual(shape)) return;
  throw std::invalid_argument("delta_source: 'compensated' (and 'auto' above " + std::to_string(kAutoExactMaxKeys) +
                              " keys in fused numerics, every length in paper numerics) needs " + what);
}

void AttentionOptions::validate(const AttentionShape& s) const {
  auto fail = [](const std::string& what) { throw std::invalid_argument(what); };
  if (s.batch < 1 || s.heads < 1 || s.q_len < 1 || s.k_len < 1)
    fail("shape: batch, heads, q_len and k_len must be >= 1");
  if (s.kv_heads < 0 || s.heads % s.resolved_kv_heads() != 0)
    fail("shape: kv_heads (" + std::to_string(s.kv_heads) + ") must divide heads (" + std::to_string(s.heads) +
         "); 0 means kv_heads = heads");
  if (s.head_dim < 1 || s.head_dim > kMaxHeadDim)
    fail("shape: head_dim must be in 1.." + std::to_string(kMaxHeadDim) + ", got " + std::to_string(s.head_dim));
  if (tile_q < 0 || tile_k < 0) fail("tile: sizes must be positive (or 0 for the mode's default)");
  if (round_bits < 1 || round_bits > 7) fail("round_bits: must be in 1..7 (7 = BF16), got " + std::to_string(round_bits));
  if (!std::isfinite(scale) || scale < 0.0f) fail("scale: must be a positive finite number (or 0 for 1/sqrt(D))");
  if (policy == ShiftPolicy::paper) {
    if (!(policy_params.beta >= 1.0f) || !std::isfinite(policy_params.beta)) fail("beta: must be a finite number >= 1");
    if (!(policy_params.eps >= 0.0f) || !std::isfinite(policy_params.eps)) fail("eps: must be a finite number >= 0");
  }
  if (normalizer == Normalizer::bf16 && numerics != Numerics::fused)
    fail("normalizer: 'bf16' is a knob of fused numerics only");
}

}  // namespace stableflash::attention
