// Plain-data kernel parameters and tile traits of the attention kernels. Host code fills the
// params from ForwardArgs/BackwardArgs + AttentionOptions and the plan (entry.cu); the kernels only
// read them. The kernel lab's mma.sync traits are in lab/mma_traits.cuh.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>

#include "stableflash/attention/shift_policies.hpp"
#include "tail_pieces.hpp"

// Keys per step of the fused wgmma forward's fast path at head dim 64 (WgmmaForwardTraits);
// a build option for comparing tilings.
#ifndef SF_FORWARD_FAST_BLOCK_K_HD64
#define SF_FORWARD_FAST_BLOCK_K_HD64 64
#endif
namespace stableflash::attention::cuda {

// Element strides of one [B, H, T, D] or [B, T, H, D] tensor (head_dim is always contiguous).
struct TensorStrides {
  std::int64_t b = 0, h = 0, t = 0;
  __host__ __device__ std::int64_t head(int b_, int h_) const { return b_ * b + h_ * h; }
};

// Event counters of the forward (TieCounts), accumulated with atomics when requested.
struct DeviceTieCounters {
  unsigned long long tie_event_rows, repeated_max_rows, fallback_rows;
};

// One query row's events while a forward CTA counts them, in shared memory (EventCounters,
// forward_row_parts.cuh).
struct ForwardRowEvents {
  int ones;       // BF16(P-bar) == 1.0 entries in the current numerics tile
  float rep_max;  // the row's largest score so far, before any policy
  int rep_count;  // how often it occurred
  int flags;      // EventCounters::kTieEvent | kFellBack
};

struct ForwardParams {
  // wgmma kernel: bulk tensor copy maps of q, k, v as 4-d (D, T, H, B) tensors, boxes of
  // 64 x 64 elements in the 128-byte swizzle (tma.cuh); unused by the mma.sync kernel.
  CUtensorMap tma_q, tma_k, tma_v;
  CUtensorMap tma_o, tma_o_residual;  // wgmma kernel: the epilogue's bulk stores (o_residual's only if it is set)
  const std::uint16_t *q, *k, *v;  // BF16 bits; q [B, H, Tq, D], k, v [B, H_kv, Tk, D], any strides
  std::uint16_t *o, *o_residual;   // [B, H, Tq, D]; o_residual (may be null) shares o's strides
  float* lse;                      // [B, H, Tq]
  DeviceTieCounters* counters;     // [heads], one record per query head; null: no counting (the fast path)
  TensorStrides q_strides, k_strides, v_strides, o_strides;
  int batch, heads, q_len, k_len;
  int kv_group;  // query heads per K/V head: head h reads K/V head h / kv_group (1: multi-head)
  float scale;
  int causal;
  int tile_k;      // numerics key tile (multiple of kSubTile); fused without tie counts: kSubTile
  int round_bits;  // 1..7
  int normalizer_bf16;
  PolicyParams policy;
  int walk;          // ForwardWalk (plan.hpp): the plan's walk over the keys
  int store_by_tma;  // wgmma kernel: o (and o_residual) written by bulk copies (tma_o*); 0: element-wise
  int* tile_counters;  // warp-specialized kernel: {next tile, CTAs done} (next_tile_counters); null: fixed rounds
  int tail_tiles, tail_group;  // warp-specialized kernel: the last round's tiles taken as items (ForwardPlan::ws_tail)
  int lone_pairs;  // warp-specialized kernel: heads' lone last blocks computed two heads a CTA (ForwardPlan::ws_lone_pairs)
};

struct BackwardParams {
  CUtensorMap tma_q, tma_k, tma_v, tma_do;  // wgmma kernel: as ForwardParams' maps
  const std::uint16_t *q, *k, *v, *o, *o_residual, *d_o;
  const float* lse;   // [B, H, Tq]
  float* delta;       // [B, H, Tq] (written by the delta kernels, read by the main kernel)
  float* dq_accum;    // FP32, zeroed before the main kernel unless dq_first_store: [B, H, Tq, D] (mma.sync kernel) or
                      // DqFragmentOrder (wgmma kernel); entry.cu allocates the larger; unused with dq_direct
  int* dq_semaphore;  // [B, H, ceil(Tq / BlockQ)] deterministic mode only, zeroed
  // BackwardPlan::dq_first_store: dq_accum is not cleared; key block 0 stores a tile in deterministic
  // mode, else the block whose claim (dq_claims, zeroed: [B, H, ceil(Tq / BlockQ), D / 64], arrivals
  // plus kDqTileStored once the first one's store has landed) came first; the conversion reads a
  // tile that no block reached (its turn counter or claim 0) as zero.
  int dq_first_store;
  int* dq_claims;
  // dk, dv as the main kernel writes them: per query head [B, H, Tk, D]. With kv_group > 1 they
  // are a workspace that launch_group_sum adds up per K/V head (docs/numerics-contract.md: in ascending head order).
  std::uint16_t *dq, *dk, *dv;
  TensorStrides q_strides, k_strides, v_strides, o_strides, d_o_strides;  // o_residual shares o's
  TensorStrides dq_strides, dk_strides, dv_strides;
  int batch, heads, q_len, k_len;
  int kv_group;  // query heads per K/V head: head h reads K/V head h / kv_group (1: multi-head)
  float scale;
  int causal;
  int deterministic;
  int delta_source;  // DeltaSource
  // One key block per (b, h) (Tk <= the wgmma kernel's 128 keys; BackwardPlan::dq_direct): a query
  // block's dQ is one CTA's, so its consumers store it as BF16 themselves, with no dQ workspace, no
  // clearing of it and no conversion kernel (at T = 128 those were a third of the backward's time).
  int dq_direct;
  // The exact delta formed inside the main kernel (BackwardPlan::delta == DeltaPass::in_main; only
  // with dq_direct): its own instantiation, no delta pass before it.
  int delta_in_main;
  int main_ctas;  // BackwardPlan::main_ctas: the main kernel's grid where > 0, else a CTA per item
  int key_groups;  // BackwardPlan::key_groups: 64-key groups per CTA of the main kernel (2, or 1 on small grids)
  // The part of the workspace the main kernel needs zero (the dQ tile claims or turn counters; the
  // accumulator too where dq_first_store is off, as in the kernel lab), in 16-byte words, that the
  // δ pass (from the output, or the exact one) clears beside its own work: the same bytes as a
  // memset before it, but their stores overlap the pass's loads and a launch goes. Null: nothing to clear.
  uint4* zero_words;
  std::int64_t zero_word_count;
};

// ceil(len / block) for len >= 0, without the len + block - 1 that overflows an int near 2^31: the
// grids' and walks' block counts (check_tensors bounds the results).
__host__ __device__ constexpr int blocks_of(int len, int block) { return len / block + (len % block != 0); }

// dQ workspace order of the wgmma backward: per (b, h, 64-query block; Tq padded to the block), D / 64
// tiles of [64 queries, 64 dims], each in accumulator-fragment order [8 dim groups j][128 threads][4]:
// element (j, thread, e) is query 16 warp + g + 8 (e / 2), dim 64 tile + 8 j + 2 t + (e % 2)
// (warp = thread / 32, g = thread % 32 / 4, t = thread % 4). A warpgroup stores its 32 values with
// four conflict-free 16-byte stores, and the tile is one contiguous bulk reduction.
struct DqFragmentOrder {
  static constexpr int kBlockQ = 64;
  static constexpr int kTileFloats = kBlockQ * 64;
  __host__ __device__ static int blocks(int q_len) { return blocks_of(q_len, kBlockQ); }
};

// Bottom-right aligned causal visibility: query i sees keys j <= i + (Tk - Tq). Tk - Tq first: i +
// Tk would overflow where Tq + Tk passes 2^31 (i may run 64 rows past Tq: forward_ws_kernel.cuh).
__host__ __device__ inline int last_key(int i, int q_len, int k_len, bool causal) {
  if (!causal) return k_len - 1;
  const int last = i + (k_len - q_len);
  return last < k_len - 1 ? last : k_len - 1;
}

// Forward tiles of the wgmma kernel (forward_wgmma_kernel.cuh): one warpgroup, 64 query rows, 16
// per warp (the m64 of a wgmma), keys in sub-tiles of 64. Operand tiles use the SW128 layout
// (wgmma.cuh), whose blocks are 1024-byte aligned.
template <int kHeadDim_, bool kPaper_>
struct WgmmaForwardTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kPaper = kPaper_;
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 128;
  static constexpr int kRowTiles = 1;
  static constexpr int kBlockQ = 64;
  static constexpr int kBlockK = 64;
  // fused: S (kFastBlockK / 2) + O (D / 2) + P (kFastBlockK / 4) registers per thread; paper
  // adds O and its shadow. D = 64 with 128-key steps: three CTAs (smem 72 KiB each).
  // paper at D = 64: three CTAs (168 registers, no spills). Keeping the pre-pass's BF16 scores in
  // shared memory for the main pass (64 KiB, two CTAs) measured 9% slower at the GPT-2 causal shape
  // and 17% non-causal on the H200 (docs/benchmarks.md): the kernel is bound by ALU latency, so
  // warps beat the saved second S product.
  static constexpr int kMinBlocks =
      kPaper ? (kHeadDim == 64 ? 3 : 2) : (kHeadDim == 64 ? (SF_FORWARD_FAST_BLOCK_K_HD64 == 128 ? 3 : 4) : 2);
  // Keys per step of the fused fast path (forward_pipelined_walk): 128 at D = 64 halves the
  // per-step costs (barriers, row maxima, the shift choice) and feeds the tensor cores
  // m64n128 products; D = 128 keeps 64 so that two CTAs fit an SM. The shift m is then chosen
  // per such step (docs/numerics-contract.md lets fused kernels pick their tiling).
  static constexpr int kFastBlockK = (!kPaper && kHeadDim == 64) ? SF_FORWARD_FAST_BLOCK_K_HD64 : 64;
  static constexpr int kKeyTiles = kBlockK / 8;
  static constexpr int kDimTiles = kHeadDim / 8;
  static constexpr int kSmemQ = kBlockQ * kHeadDim * 2;
  static constexpr int kSmemKV = kFastBlockK * kHeadDim * 2;  // a K or V buffer (the slow walk uses 64 rows of it)
  // Q; one per K/V buffer (serial walk) or per K buffer (pipelined walk); one per V buffer
  static constexpr int kBarriers = 5;
  // Shared memory. Tiles in the SW128 layout (wgmma.cuh); the epilogue stages O and the residual in
  // the two K buffers.
  struct SharedStorage {
    std::uint16_t q[kBlockQ * kHeadDim];
    std::uint16_t k[2][kFastBlockK * kHeadDim];
    std::uint16_t v[2][kFastBlockK * kHeadDim];
    ForwardRowEvents events[kBlockQ];        // counting runs (EventCounters)
    float top[kRowTiles * 2 * 2][kThreads];  // the pre-pass's top-2 slots (TopTwoPrepass)
    std::uint64_t barriers[kBarriers];
  };
  static_assert(offsetof(SharedStorage, k) % 1024 == 0 && offsetof(SharedStorage, v) % 1024 == 0 && kSmemKV % 1024 == 0,
                "SW128 atoms are 1024-byte aligned");
  static constexpr int kSmemBytes = sizeof(SharedStorage);
  static_assert(kHeadDim == 64 || kHeadDim == 128, "head dims with kernels: 64, 128");
};

// Tiles of the warp-specialized fused forward (forward_ws_kernel.cuh): a producer warpgroup and
// kConsumers consumer warpgroups of 64 query rows (the m64 of a wgmma) sharing 128-key K/V tiles
// in a ring of kWsForwardStages (FlashAttention-3's tiles: 3 x 64 rows at D = 64, where the
// softmax's ALU work needs more warps per SM, 2 x 64 at D = 128; D = 64 also has a two-consumer
// build, which the plan picks where 192-row tiles would leave consumers idle, and both head dims a
// one-consumer build for grids too small to fill the SMs with 128-row tiles: ws_consumers_for).
// The consumers' count changes no output bit: every row runs the same walk over the same 128-key
// steps, whichever consumer of whichever tile holds it.
// kRowTiles / kKeyTiles / kDimTiles / kPaper are what ForwardRows reads. Both head dims are built;
// the plan runs the one-warpgroup kernel (4 CTAs per SM) instead at D = 64 on short causal rows,
// where it is faster (takes_warp_specialized_forward).
inline constexpr int kWsForwardStages = 2;
// Registers per thread a CTA of `threads` starts with at one CTA per SM (65536 / threads, in steps
// of 8): all that its warpgroups' setmaxnreg budgets can share, since setmaxnreg moves registers
// between warpgroups and adds none (a setmaxnreg.inc that asks for more waits forever).
constexpr int cta_start_registers(int threads) { return 65536 / threads / 8 * 8; }
// A warp-specialized forward's tile as its producer hands it to the consumers (forward_ws_kernel.cuh),
// decoded by the producer's one thread: the consumers' warps would otherwise each repeat the tile
// order's integer divisions (tens of instructions each) between two tiles.
struct alignas(16) WsTile {
  // The first query row (negative for a causal sequence's first tile, WsTileOrder), head and batch
  // of a consumer's staged outputs (SharedStorage::staged). The round's tile record carries only its
  // steps, and its head and batch where consumers share them (not in the lone pairs' build): each
  // consumer reads its first row from consumer_rows.
  int m0, h, b;
  int steps;  // its K/V steps: ring positions it takes (steps_of_rows of the whole tile); kEnd: no tile left
  static constexpr int kEnd = -1;
  // A consumer's first row where it has none (past a tail item's blocks, tail_pieces.hpp): before
  // row 0 by more than its 64 rows, as a causal sequence's first tile leaves its early consumers.
  static constexpr int kNoRows = -(1 << 20);
};

struct WsConsumerTile {
  int h, b, ring_slot0, arrivals;
};

// The warp-specialized forward's schedule length: every head's tiles of `consumers` 64-row blocks, the
// last round's p.tail_tiles of them taken as items (tail_pieces.hpp). The launch sizes its grid from it,
// WsTileOrder ends its schedule there. At most the 64-row blocks of whole 192-row tiles: < 2^31,
// check_forward_index_ranges.
// With p.lone_pairs, heads two by two: their whole tiles, then their lone last blocks in one tile.
__host__ __device__ inline int ws_schedule_length(const ForwardParams& p, int consumers) {
  const int batch_heads = p.batch * p.heads;
  if (p.lone_pairs) return (p.q_len + 64 * consumers - 1) / (64 * consumers) * batch_heads - batch_heads / 2;
  return WsTailPieces::of(p.q_len, batch_heads, consumers, p.tail_tiles, p.tail_group).schedule(batch_heads);
}

// kLonePairs: the build for ForwardPlan::ws_lone_pairs, whose tiles may pair two heads' lone last
// blocks (consumer 0 one head's, consumer 1 the other's): a second K/V ring for consumer 1's head,
// and each consumer's head read from the tile's record.
template <int kHeadDim_, int kConsumers_ = kHeadDim_ == 64 ? 3 : 2, bool kLonePairs_ = false>
struct WsForwardTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kPaper = false;
  static constexpr int kConsumers = kConsumers_;
  static constexpr bool kLonePairs = kLonePairs_;
  static constexpr int kRingSlots = kWsForwardStages * (kLonePairs ? 2 : 1);  // K/V stages in shared memory
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kCtaRows = 64 * kConsumers;
  static constexpr int kBlockK = 128;  // keys per step (one shift per row and step)
  static constexpr int kRowTiles = 1;
  static constexpr int kKeyTiles = kBlockK / 8;
  static constexpr int kDimTiles = kHeadDim / 8;
  // setmaxnreg budgets, adding up to no more than the CTA started with (cta_start_registers: 168
  // with two consumers, 128 with three; 32 / 240 / 240, 512 > 3 x 168, compiled and hung on the
  // H200). A consumer holds S (kBlockK / 2), O (D / 2) and P (kBlockK / 4) registers per thread:
  // 160 at D = 128, 128 at 64.
  // One consumer (256 threads, starting at 256 registers: the most a thread may have): the consumer
  // keeps all it starts with, as FlashAttention-3's one-consumer kernels do (56 / 256); a
  // setmaxnreg.inc below the start count is not allowed.
  static constexpr int kProducerRegisters = kConsumers == 3 ? 32 : kConsumers == 2 ? 40 : 56;
  static constexpr int kConsumerRegisters = kConsumers == 3 ? 160 : kConsumers == 2 ? 232 : 256;
  static_assert(kProducerRegisters + kConsumers * kConsumerRegisters <= (1 + kConsumers) * cta_start_registers(kThreads),
                "setmaxnreg only moves the CTA's registers between its warpgroups");
  static constexpr int kSmemQ = 64 * kHeadDim * 2;        // one consumer's Q (and its O, residual staging tiles)
  static constexpr int kSmemKV = kBlockK * kHeadDim * 2;  // a K or V stage
  // Shared memory, tiles in the SW128 layout. The epilogue stages a consumer's O and residual in
  // tiles of their own, so the producer can load the consumer's next Q while it stores.
  struct SharedStorage {
    std::uint16_t q[kConsumers][64 * kHeadDim];
    std::uint16_t k[kRingSlots][kBlockK * kHeadDim];  // slots kWsForwardStages ..: the second ring (kLonePairs)
    std::uint16_t v[kRingSlots][kBlockK * kHeadDim];
    std::uint16_t o[kConsumers][64 * kHeadDim];
    std::uint16_t residual[kConsumers][64 * kHeadDim];
    std::uint64_t barriers[4 * kConsumers + 4 * kRingSlots];  // WsBarriers
    WsTile tile;  // the round's tile: the producer's choice, read by the consumers
    int consumer_rows[kConsumers];  // the round's first row of each consumer's 64 (WsTile::kNoRows: none)
    // per consumer, the round's staged outputs for the store warp: the rows' tile (m0 of the
    // consumer's rows), steps 1 if staged, 0 if the consumer has no rows, kEnd past the last tile
    WsTile staged[kConsumers];
    // kLonePairs: per consumer the round's head and batch, the first K/V slot of its ring (0, or
    // kWsForwardStages: the second ring) and its arrivals a step on the first ring's empty barriers
    // (2 for the consumer without rows in a paired tile: it hands back the steps consumer 1 never reads)
    WsConsumerTile consumer_tiles[kLonePairs ? kConsumers : 1];
  };
  static_assert(offsetof(SharedStorage, k) % 1024 == 0 && offsetof(SharedStorage, o) % 1024 == 0 &&
                    offsetof(SharedStorage, residual) % 1024 == 0 &&
                    kSmemQ % 1024 == 0 && kSmemKV % 1024 == 0,
                "SW128 atoms are 1024-byte aligned");
  static constexpr int kSmemBytes = sizeof(SharedStorage);
  static_assert(kHeadDim == 64 || kHeadDim == 128, "head dims with kernels: 64, 128");
  static_assert(kConsumers == 1 || kConsumers == 2 || (kConsumers == 3 && kHeadDim == 64),
                "consumers: 1 or 2, or 3 at D = 64 (registers, shared memory)");
  static_assert(!kLonePairs || kConsumers == 3, "lone blocks paired: three consumers (ForwardPlan::ws_lone_pairs)");
  static_assert(kSmemBytes <= 227 * 1024, "an SM's shared memory");
};

}  // namespace stableflash::attention::cuda
