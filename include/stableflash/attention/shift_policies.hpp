// Shift policies: the choice of the softmax shift m' for one query row and one key tile
// (docs/numerics-contract.md "Shift policies"). Each policy is a small struct so kernels take it as a
// compile-time parameter (`standard` pays nothing for the others); the CPU oracle uses the very
// same structs. A policy sees the tile row maximum r_m (and, if it asks for it, how many entries
// are within eps of r_m), the logical row identity, and the precision m is carried in.
//
// Contract for every policy: m' >= r_m, so P-bar = exp(S - m) <= 1 and nothing overflows; the
// online-softmax update then takes m_new = max(m_old, m'). Exact arithmetic is unchanged because
// softmax is shift invariant.
#pragma once

#include <cmath>
#include <cstdint>

#include "stableflash/attention/modes.hpp"
#include "stableflash/numerics/bf16.hpp"
#include "stableflash/numerics/fp32_ops.hpp"

namespace stableflash::attention {

// The logical identity of a query row. Anything a policy varies per row is a function of this
// (and of the key-tile index), never of threads or memory layout, so CPU, GPU and layouts agree.
struct RowId {
  std::uint32_t b = 0, h = 0, i = 0;
};

// The precision the running maximum m is carried in: BF16 in `paper` numerics (the authors keep m
// in a BF16 tensor), FP32 in `fused`.
enum class ShiftPrecision : std::uint8_t { bf16, fp32 };

SF_HD float round_shift(float x, ShiftPrecision p) { return p == ShiftPrecision::bf16 ? round_bf16(x) : x; }

// Run-time parameters of the published policy (ignored by the others).
struct PolicyParams {
  float beta = 2.0f;   // the authors' code uses 2 (earlier 7)
  float eps = 1e-3f;   // tie tolerance of their code (the paper text uses exact equality)
};

// What a policy decided for one row and tile; `fell_back` marks a policy that had to use the
// standard shift because the precision of m could not hold its offset (counted by the audit).
struct ShiftChoice {
  float m = 0.0f;
  bool fell_back = false;
};

// m' = r_m: the usual safe softmax.
struct StandardShift {
  static constexpr ShiftPolicy kind = ShiftPolicy::standard;
  static constexpr bool needs_near_max_count = false;
  SF_HD ShiftChoice choose(float r_m, int /*near_max_count*/, RowId, ShiftPrecision) const { return {r_m, false}; }
};

// The published rule (docs/paper.md, "The fix"), per key tile, gaps included: ties are only seen
// inside one tile, and r_m == 0 is left unchanged.
struct PublishedShift {
  static constexpr ShiftPolicy kind = ShiftPolicy::paper;
  static constexpr bool needs_near_max_count = true;
  PolicyParams params;

  // Entries S >= threshold count as repeated maxima. In `paper` numerics r_m - eps is itself a
  // BF16 tensor operation, so the threshold is rounded (for |r_m| >= 0.5 that makes it r_m).
  SF_HD float near_max_threshold(float r_m, ShiftPrecision p) const { return round_shift(sub_rn(r_m, params.eps), p); }

  SF_HD ShiftChoice choose(float r_m, int near_max_count, RowId, ShiftPrecision p) const {
    if (near_max_count > 1 && r_m > 0.0f) return {round_shift(mul_rn(params.beta, r_m), p), false};
    if (near_max_count > 1 && r_m < 0.0f) return {0.0f, false};
    return {r_m, false};
  }
};

// Adds a bounded offset to every row's shift: m' = r_m + o. Because o <= 1, P-bar's largest entry
// exp(-o) >= exp(-1) never underflows at any logit scale; because o >= 0.5 > 0, no entry of P-bar
// is an exact 1.0, which removes the midpoint structure behind the bias (docs/paper.md, Mechanism 2).
// Where the precision of m cannot hold the offset (|r_m| so large that r_m + o rounds back to r_m
// in BF16), the policy falls back to the standard shift instead of shifting by a whole coarse ulp.
SF_HD ShiftChoice offset_shift(float r_m, float offset, ShiftPrecision p) {
  const float m = round_shift(add_rn(r_m, offset), p);
  // After rounding, the shift is at most 2 * offset <= 2 (round-to-nearest moves by at most half
  // an ulp, and the offset exceeded half an ulp for m to move at all).
  if (!(m > r_m)) return {r_m, true};
  return {m, false};
}

// The offset of our tuning-free policy: o(row) in [0.5, 1), a hash of the logical row identity,
// so the rounding of BF16(P-bar_max) = BF16(exp(-o)) has no fixed direction across rows (a fixed
// offset rounds the same way in every row and stays biased; docs/numerics-contract.md "Measured already").
// The 23 hash bits make o an exact FP32 value.
SF_HD std::uint32_t mix_bits(std::uint32_t x) {  // a well-mixed 32-bit integer hash (lowbias32)
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

SF_HD float hashed_row_offset(RowId row) {
  const std::uint32_t h = mix_bits(row.i ^ mix_bits(row.h ^ mix_bits(row.b ^ 0x9e3779b9u)));
  return 0.5f + static_cast<float>(h >> 9) * (1.0f / 16777216.0f);  // 0.5 + k * 2^-24, k < 2^23
}

struct HashedOffsetShift {
  static constexpr ShiftPolicy kind = ShiftPolicy::hashed_offset;
  static constexpr bool needs_near_max_count = false;
  SF_HD ShiftChoice choose(float r_m, int, RowId row, ShiftPrecision p) const {
    return offset_shift(r_m, hashed_row_offset(row), p);
  }
  // The offset depends on the row alone: kernels that call choose() once per row and key tile
  // compute it once (row_constant) and pass it back (choose_with); same result as choose().
  static constexpr bool has_row_constant = true;
  SF_HD float row_constant(RowId row) const { return hashed_row_offset(row); }
  SF_HD ShiftChoice choose_with(float row_constant_value, float r_m, int, ShiftPrecision p) const {
    return offset_shift(r_m, row_constant_value, p);
  }
};

// The same offset idea with one constant offset ln(4/3) (P-bar max = 0.75 in every row). Kept as
// the control that shows why the per-row variation matters; not a recommended policy.
struct FixedOffsetShift {
  static constexpr ShiftPolicy kind = ShiftPolicy::fixed_offset;
  static constexpr bool needs_near_max_count = false;
  static constexpr float kOffset = 0.28768207245178090f;  // ln(4/3)
  SF_HD ShiftChoice choose(float r_m, int, RowId, ShiftPrecision p) const { return offset_shift(r_m, kOffset, p); }
};

// Calls f(policy_struct) with the compile-time policy matching the run-time choice: the single
// place where a run-time policy name becomes a template parameter (CPU dispatch, kernel launch).
template <class F>
decltype(auto) with_shift_policy(ShiftPolicy kind, const PolicyParams& params, F&& f) {
  switch (kind) {
    case ShiftPolicy::paper: return f(PublishedShift{params});
    case ShiftPolicy::hashed_offset: return f(HashedOffsetShift{});
    case ShiftPolicy::fixed_offset: return f(FixedOffsetShift{});
    case ShiftPolicy::standard: break;
  }
  return f(StandardShift{});
}

}  // namespace stableflash::attention
