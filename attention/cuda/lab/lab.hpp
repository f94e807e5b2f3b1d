// The kernel lab (llm.c's dev/ habit): the comparison kernels that production no longer runs, kept
// buildable and runnable through the same plan execution, bench and oracle check as production
// (the `kernel_lab` program). Host header.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "stableflash/attention/cuda.hpp"

namespace stableflash::attention::cuda::lab {

enum class ForwardChoice {
  production,     // the plan's kernel
  mma_sync,       // lab/forward_mma_kernel.cuh: FlashAttention-2 style, mma.sync, 128 rows per CTA
  one_warpgroup,  // the one-warpgroup wgmma kernel where the plan picks the warp-specialized one
  serial,         // the one-warpgroup kernel without the softmax / P V overlap (ForwardWalk::steps)
  warp_specialized,  // the warp-specialized kernel wherever the plan takes the fast path (D = 64 too)
  warp_specialized_rounds,    // the same with tiles fixed in advance (TileSchedule::rounds)
  warp_specialized_per_tile,  // the same with one CTA per tile (TileSchedule::per_cta)
  warp_specialized_two,       // the same with two consumers at D = 64 (ForwardPlan::ws_consumers)
  warp_specialized_three,     // the same with three consumers at D = 64
  warp_specialized_one,       // the same with one consumer (64-row tiles), both head dims
};
enum class BackwardChoice {
  production,  // the wgmma backward
  mma_sync,    // lab/backward_mma_kernel.cuh: FlashAttention-2 style, row-major dQ workspace
  dq_warpgroup,  // lab/backward_dqwg_kernel.cuh: the wgmma backward with a third warpgroup for dQ
  keys64,   // production's with the plan's key groups forced to 1 (64-key CTAs; head dim 128, not deterministic)
  keys128,  // ... forced to 2 (128-key CTAs, no persistent grid where the plan would take 64-key ones)
};

// Names: production, mma, wgmma-1wg, wgmma-serial (the former STABLEFLASH_FORWARD_KERNEL values),
// wgmma-ws, wgmma-ws-rounds, wgmma-ws-tiles, wgmma-ws-2c, wgmma-ws-3c; production, mma
// (STABLEFLASH_BACKWARD_KERNEL), wgmma-dqwg, wgmma-64k, wgmma-128k.
std::optional<ForwardChoice> parse_forward_choice(std::string_view name);
std::optional<BackwardChoice> parse_backward_choice(std::string_view name);
std::string to_string(ForwardChoice c);
std::string to_string(BackwardChoice c);

Kernels kernels(ForwardChoice forward, BackwardChoice backward);

// `kernel_lab --backward-parts` (lab/backward_parts.cu): the delta pass and the dQ conversion alone,
// the lab's earlier versions against production's, timed and compared bit for bit, and the dQ
// workspace memset, at each BxHxTxD of the comma-separated `shapes`; 1 if any output differed.
int run_backward_parts(const std::string& shapes, int repeats);

// `kernel_lab --forward-timeline` (lab/forward_timeline.cu): the warp-specialized forward with clock
// stamps at every phase of its steps, at each of `shapes` (Tq = Tk, multi-head); prints where a
// step's cycles go.
struct MaskedShape {
  AttentionShape shape;
  bool causal = false;
};
int run_forward_timeline(const std::vector<MaskedShape>& shapes);

}  // namespace stableflash::attention::cuda::lab
