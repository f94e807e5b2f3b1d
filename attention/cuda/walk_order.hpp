// Where a backward CTA's walk over its query blocks starts (host and device: the kernel's
// BackwardItem::order and the CPU test of the rule, tests/attention/launch_plan_test.cpp).
//
// In full attention outside deterministic mode every key block of a head walks the same query
// blocks; started together at block 0 they walk in step and reach each dQ tile at once (its bulk
// reductions and the claims' waits for its first store). So the walk of the head's r-th 128 keys
// starts r / (the head's 128-key blocks) of the way along and wraps around. Counted in 128-key
// units: a 64-key CTA (BackwardPlan::key_groups) starts where its 128-key block does, so it sums
// dK, dV in the 128-key CTA's order and keeps its bits. Causal walks start at their own diagonals
// already, and deterministic mode adds dQ in key-block order (a rotated walk would wait for every
// block before it): start 0 there, as for a single key block.
#pragma once

#include "stableflash/numerics/host_device.hpp"

namespace stableflash::attention::cuda {

// The unit the start counts keys in: a 128-key CTA's keys (kBackwardBlockK, plan.cpp checks).
inline constexpr int kWalkStartKeys = 128;

// The first walk index of the CTA whose keys start at k0, over a walk of `count` query blocks:
// floor((k0 / 128) x count / blocks), in 32 bits. Exact while (Tk / 128) x count < 2^32 (Tk x Tq <
// 2^45 at 64-row blocks); past that the product wraps, which only moves the start: a wrapped
// product is below 2^32 < blocks x count, so the quotient is still below count.
SF_HD int walk_start(int k0, int count, int k_len, bool causal, bool deterministic) {
  const unsigned blocks = (unsigned(k_len) + kWalkStartKeys - 1) / kWalkStartKeys;
  if (causal || deterministic || blocks < 2 || count <= 0) return 0;
  return int(unsigned(k0 / kWalkStartKeys) * unsigned(count) / blocks);
}

}  // namespace stableflash::attention::cuda
