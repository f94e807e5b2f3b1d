// The launch plan of one CUDA attention call: which kernel runs, with which template flags and
// which walk over the keys, and the backward's workspace. Host code without CUDA (a CPU build
// compiles it and tests/attention/launch_plan_test.cpp checks its choices); entry.cu computes one
// plan per call and executes it, the kernels read the choice from ForwardParams::walk.
#pragma once

#include <cstddef>
#include <cstdint>

#include "stableflash/attention/modes.hpp"
#include "stableflash/attention/shift_policies.hpp"

namespace stableflash::attention {
struct AttentionShape;
struct AttentionOptions;
struct ForwardArgs;
struct BackwardArgs;
}  // namespace stableflash::attention

namespace stableflash::attention::cuda {

// The fused fast path: one shift per key step, chosen from that step's scores (no pre-pass), the
// softmax of a step overlapped with the previous step's P V. A kernel instantiation can take it
// with `fused` numerics and a policy that needs no tile-wide tie count (the published rule's);
// a call takes it when it also counts no events (ForwardArgs::ties: the counts then mean the
// CPU's, so those runs walk the numerics tiles with a pre-pass). The one definition of the test:
// the plan below (host) and the kernels' `if constexpr` (device) use these two.
constexpr bool fast_path_instantiable(bool paper, bool tile_tie_count) { return !paper && !tile_tie_count; }
template <bool kPaper, class Policy>
inline constexpr bool kFastPathInstantiable = fast_path_instantiable(kPaper, Policy::needs_near_max_count);
bool takes_fast_path(Numerics numerics, ShiftPolicy policy, bool count_events);

// How a forward CTA walks its keys (ForwardParams::walk).
enum class ForwardWalk : int {
  pipelined = 0,  // the fast path: steps of the kernel's block of keys, one shift each, softmax || P V
  units = 1,      // numerics tiles (tile_k) with a pre-pass over a tile's keys where it has several sub-tiles
  steps = 2,      // kernel lab only: the fast path's numerics without the overlap (one shift per 64 keys)
};

enum class ForwardKernel {
  one_warpgroup,     // forward_wgmma_kernel.cuh: 64 rows per CTA, every numerics and walk
  warp_specialized,  // forward_ws_kernel.cuh: producer + 2 (D = 128) or 3 (D = 64) consumer warpgroups, fast path only
};

// Whether the fast path runs the warp-specialized kernel for this shape on `sms` SMs (plan_forward;
// measured crossovers in plan.cpp): past 128 keys, at D = 64 causal only where query rows see on
// average 384 keys or more (mean_visible_keys); up to 128 keys at D = 128 where the 128-row tiles
// make two rounds of the persistent grid or more.
bool takes_warp_specialized_forward(const AttentionShape& shape, bool causal, int sms);
double mean_visible_keys(const AttentionShape& shape, bool causal);

// How the warp-specialized kernel's CTAs take their tiles (forward_ws_kernel.cuh).
enum class TileSchedule {
  per_cta,  // kernel lab: one CTA per tile, handed out by the hardware
  rounds,   // one CTA per SM; CTA i's tile of round r fixed in advance (WsTileOrder::tile)
  dynamic,  // one CTA per SM; a CTA's next tile from a counter (next_tile_counters; rounds where none)
};

struct WsTailSplit {
  int tiles = 0;  // the last round's tiles, taken as items
  int group = 0;  // 64-row blocks an item
  bool operator==(const WsTailSplit&) const = default;
};

struct ForwardPlan {
  // template flags: launch_forward<head_dim, paper>, the policy struct (with_shift_policy)
  int head_dim = 0;
  bool paper = false;
  ShiftPolicy policy = ShiftPolicy::standard;
  ForwardWalk walk = ForwardWalk::units;
  ForwardKernel kernel = ForwardKernel::one_warpgroup;
  TileSchedule schedule = TileSchedule::dynamic;  // warp_specialized
  int ws_consumers = 0;  // warp_specialized: consumer warpgroups of 64 rows per CTA (ws_consumers_for)
  WsTailSplit ws_tail;    // warp_specialized: last-round tiles taken as pieces (ws_tail_for)
  bool ws_lone_pairs = false;  // warp_specialized: heads' lone last blocks two heads a tile (ws_lone_pairs_for)
  int sms = 0;           // warp_specialized: the device's multiprocessors, the persistent grid's CTAs at most
  bool count_events = false;  // ForwardArgs::ties or head_ties: a counter record per query head in the workspace
  bool store_by_tma = false;  // o (and o_residual) rows 16-byte aligned: the epilogue's bulk stores
  bool tensor_maps = true;    // q, k, v read by bulk tensor copies (every production kernel; not the lab's mma.sync)
};

// The warp-specialized forward's consumers per CTA: one on small grids (spreads_rows_over_sms);
// else 2 at D = 128; at D = 64 three (192-row tiles, each K/V tile shared three ways) unless two
// take less time over the persistent grid of `sms` CTAs, where three would leave most of a round
// idle (plan.cpp says how it is counted).
int ws_consumers_for(const AttentionShape& shape, bool causal, int sms);
// Full attention's last round of the persistent grid as pieces (tail_pieces.hpp): the tiles of a
// partial last round (the schedule's last ones) taken as items of `group` 64-row blocks of one head,
// fewer than a tile's consumers; none (tiles 0) where the tiles fill their rounds, the mask is
// causal, a CTA has one consumer, or no group fits (plan.cpp).
WsTailSplit ws_tail_for(const AttentionShape& shape, bool causal, int sms, int consumers);
// Whether full attention's heads end in a lone 64-row block of a three-consumer tile, which the
// warp-specialized kernel then computes two heads a tile, after the two heads' whole tiles (ForwardParams::lone_pairs).
bool ws_lone_pairs_for(const AttentionShape& shape, bool causal, int consumers, bool tail_split);
// Grids too small for 128-row tiles to fill the SMs, whose 64-row tiles (one consumer) spread over
// them instead (ws_consumers_for): at most one 64-row block an SM, two where causal.
bool spreads_rows_over_sms(const AttentionShape& shape, bool causal, int sms);

// The plan of a call whose arguments passed cuda::check_supported_args.
// `sms`: the device's multiprocessors (the persistent grid's CTAs; the H100's and H200's 132 where
// no device is asked, as in the CPU tests).
ForwardPlan plan_forward(const ForwardArgs& args, const AttentionOptions& options, int sms = 132);

// The backward's one workspace allocation: dQ accumulator | dQ tile claims (BackwardPlan::
// dq_first_store, not deterministic) | dQ turn counters (deterministic) | delta (unless
// BackwardArgs::delta) | per-query-head dK | dV (grouped-query heads), each part at a 256-byte
// boundary. The dQ accumulator is the wgmma kernel's fragment order (DqFragmentOrder, Tq padded to
// 64), which is also large enough for the lab's row-major [B, H, Tq, D] one. What must be zero
// before the main kernel, [zeroed_begin(), zeroed_end()): the counters, and the accumulator too
// unless the first key block to reach each tile stores it (dq_first_store).
struct BackwardWorkspace {
  std::size_t dq_bytes = 0, claims = 0, semaphores = 0, delta_bytes = 0, per_head_bytes = 0;
  std::size_t at_claims = 0, at_semaphores = 0, at_delta = 0, at_dk = 0, at_dv = 0, total = 0;
  bool accumulator_zeroed = true;
  std::size_t zeroed_begin() const { return accumulator_zeroed ? 0 : at_claims; }
  std::size_t zeroed_end() const { return at_semaphores + semaphores * sizeof(int); }
  std::size_t zeroed_bytes() const { return zeroed_end() - zeroed_begin(); }
};

enum class DeltaPass {
  from_output,  // rounded / compensated: rowsum(dO * O) (+ the residual), one thread per 8 elements
  exact,        // rowsum(dP * P): its own pass over the keys
  in_main,      // rowsum(dP * P) formed by the main kernel from its own P, dP: no pass (dq_direct only)
};

struct BackwardPlan {
  int head_dim = 0;
  bool paper = false;
  DeltaPass delta = DeltaPass::from_output;
  int kv_group = 1;  // > 1: per-query-head dK, dV in the workspace, then the group sum
  // One key block of the main kernel per (b, h) (Tk <= kBackwardBlockK): it stores dQ as BF16 itself,
  // and the workspace has no dQ accumulator or turn counters (nothing for the delta pass to clear, no
  // conversion kernel). The kernel lab's backwards turn it off (lab.cu).
  bool dq_direct = false;
  // The accumulator is not cleared (the wgmma kernel, not dq_direct): the first key block to reach a
  // dQ tile stores it, the later ones add, and the conversion reads a tile no block reached as zero.
  // Which block is first: deterministic mode's turn counters say it (key block 0), otherwise a
  // claim word per tile (docs/cuda-kernels.md). The lab's kernels add into a cleared accumulator.
  bool dq_first_store = false;
  // The main kernel's grid: one CTA per item (a (b, h) pair's 128-key block) where 0, else this
  // many CTAs that take every main_ctas-th item each (a persistent grid, one CTA per SM: the next
  // item's K, V and first query block load while the CTA stores the last item's dK, dV). Full
  // attention at head dim 128 with up to 8,192 query rows (where it measured faster), whose items
  // are all alike; causal ones differ in length, and there the hardware's CTA scheduler balances
  // them as they end.
  int main_ctas = 0;
  // 64-key groups per CTA of the main kernel: 2 (128-key items, a consumer's 64 keys each), or 1
  // (64-key items, twice the CTAs, both consumers on the same keys, each with half the dims of dK, dV
  // and dQ) on head dim 128 grids whose 128-key items would leave half the SMs idle or more
  // (backward_spreads_keys_over_sms). dK, dV have the same bits either way.
  int key_groups = 2;
  BackwardWorkspace workspace;
};

// Whether a backward call can take 64-key CTAs (BackwardPlan::key_groups = 1) at all: head dim 128,
// not in deterministic mode, whose dQ sum over key blocks would then change bits with the grid, and
// more than one 128-key block (with one, dq_direct: its CTA stores dQ itself).
bool backward_has_64_key_ctas(const AttentionShape& shape, const AttentionOptions& options);
// ... and whether it takes them: grids of few 128-key items (batch x heads x key blocks), which fill
// at most half the `sms` SMs with one CTA each, where 64-key CTAs spread over them instead. plan.cpp
// has the measurements.
bool backward_spreads_keys_over_sms(const AttentionShape& shape, const AttentionOptions& options, int sms);

// The plan of a backward (with_gradients) or attention_delta call (without: no workspace, and the
// exact delta is always its pass) whose arguments passed cuda::check_supported_args.
// sms: the device's SM count (the persistent grid's size); 0: a CTA per item.
BackwardPlan plan_backward(const BackwardArgs& args, const AttentionOptions& options, bool with_gradients = true, int sms = 0);
// What follows from plan's dq_direct: where the exact delta is formed (in_main with dq_direct, else
// its pass) and plan.workspace (for kv_group too). plan_backward's last step; the lab calls it
// again after turning dq_direct off.
void settle_backward_plan(BackwardPlan& plan, const BackwardArgs& args, const AttentionOptions& options);

// Queries per dQ block of the wgmma backward (BackwardParams::dq_semaphore: one turn counter each;
// DqFragmentOrder::kBlockQ).
inline constexpr int kBackwardBlockQ = 64;
// Keys per CTA of the wgmma backward (its grid: one CTA per batch element, head and key block).
inline constexpr int kBackwardBlockK = 128;
// Threads per CTA of the dK / dV group sum (group_sum.cu: one thread per 4 elements).
inline constexpr int kGroupSumThreads = 256;
// The most query rows of a forward CTA and keys of a fast-path step (forward_instances.cu.in
// asserts it of every kernel): the forward's 32-bit ints round q_len and k_len up to these.
inline constexpr int kForwardMaxBlock = 192;  // the warp-specialized kernel's CTA at D = 64

// The argument checks behind cuda::check_supported / check_supported_args (docs/cuda-kernels.md
// "Strided tensors"), host code: options and shape (head_dim_compiled: whether this build has
// kernels for the head dim; entry.cu knows), then the required pointers and each tensor's alignment,
// and the index ranges the kernels compute in 32 bits and their grids' limits.
void check_shape_options(const AttentionShape& shape, const AttentionOptions& options, bool head_dim_compiled);
void check_tensors(const ForwardArgs& args, const AttentionOptions& options);
void check_tensors(const BackwardArgs& args, const AttentionOptions& options);
// Every row (b, h, t) of a tensor starts `align` bytes aligned (base and the three strides).
bool rows_aligned(const void* ptr, std::int64_t stride_b, std::int64_t stride_h, std::int64_t stride_t, int align);

}  // namespace stableflash::attention::cuda
