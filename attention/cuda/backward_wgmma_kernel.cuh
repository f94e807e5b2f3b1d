// Flash-attention backward for sm_90a with warpgroup MMA (wgmma) and bulk tensor copies, in
// `fused` or `paper` numerics: the mma.sync kernel's algorithm (kernel lab, lab/backward_mma_kernel.cuh) with the five products on the
// tensor cores' asynchronous path, in FlashAttention-3's CTA layout: a producer warpgroup and two
// consumer warpgroups owning 128 keys of one (b, h), 64 each (16 per warp, the m64 of a wgmma), that
// walk the query blocks of 64 that see them and share each block's Q, dO, so every copy serves 128
// keys (on small head dim 128 grids 64-key CTAs instead: both consumers on the same keys, each with
// half the dims of dV, dK and dQ; WgmmaBackwardTraits::kDimSplit). Per consumer and block:
//   S^T = K Q^T, dP^T = V dO^T        wgmma, A and B from shared memory (K-major)
//   P, dS (rounding points)           prob_of_score, dscore_of (backward_common.cuh) on the fragments;
//                                     at head dim 64 P while dP^T still runs
//   dV += P^T dO, dK += dS^T Q        wgmma, A = P^T / dS^T from registers, B = dO / Q (MN-major)
//   dQ                                wgmma, A = dS read as the transpose of the stored dS^T
//                                     tiles, B = K (both MN-major); see below
// dQ of a block is computed over all 128 keys (through both consumers' dS^T tiles) one block
// later, behind the next block's dV, dK products, so the consumers never meet per block: they run
// about half a block apart, one's P, dS arithmetic beside the other's products. It is split so
// that a consumer holds a [64 queries, 64] FP32 accumulator (32 registers): head dim 128 splits
// the dims (consumer c: dims 64c..), head dim 64 alternates blocks (consumer i % 2 computes
// block i's). The accumulator goes to
// shared memory in fragment order and the copy engine adds the 16 KB tile into the FP32 workspace
// (one bulk reduction, asynchronous: no per-element atomics). Deterministic mode instead has the
// consumers add the CTA's block in key-block order (turn counters) with plain loads and stores.
// With one key block per (b, h) (Tk <= 128, BackwardParams::dq_direct) a consumer's part is final:
// it stores it to dq as BF16 itself (no workspace, no conversion kernel; its own instantiation).
// A CTA's work is one item (a (b, h) pair's 128 keys and their walk) or, at head dim 128 in full
// attention (BackwardPlan::main_ctas, Traits::kPersistent), every gridDim.x-th item of a grid of one
// CTA per SM: the rings of query slots and dS^T buffers and the dQ hand-over run on from item to
// item, and the next item's first Q, dO and its K, V load (once every consumer warp arrived on
// `kv_free` after its last product reading K, V) while the consumers store the last item's dK, dV.
// The producer warpgroup (24 registers after setmaxnreg, the consumers 240) keeps the copies and
// the reductions off the consumers' path:
//   warp 0   one thread issues the copies: K and V once an item, Q and dO per query block into kSlots
//            slots, a slot reloaded once all eight consumer warps arrived on its `free` barrier;
//   warp 1   the lse and delta rows of each block into the slot (arriving on its `full` barrier
//            beside the copies);
//   warps 2, 3  the dQ reductions of consumer 0, 1: wait until the consumer has stored its tile
//            (named barrier dq_full), issue the bulk reduction, wait until the copy engine has read
//            the tile, hand it back (dq_empty). A consumer only arrives: no group barrier, no
//            thread of it waiting on a bulk group.
#pragma once

#include <cstdint>
#include <type_traits>

#include "backward_common.cuh"
#include "exact_delta_order.cuh"
#include "kernel_params.cuh"
#include "stableflash/attention/rounding_points.hpp"
#include "tma.cuh"
#include "walk_order.hpp"
#include "warp_mma.cuh"
#include "warpgroup_registers.cuh"
#include "wgmma.cuh"

namespace stableflash::attention::cuda {

// kKeyGroups_: 64-key groups per CTA. Two (128 keys, a consumer's 64 each) everywhere but on head dim
// 128 grids too small to fill the SMs with 128-key CTAs, where one (64-key CTAs, twice as many:
// BackwardPlan::key_groups) has both consumers walk the same 64 keys, each computing S^T, dP^T, P, dS
// in full and its half of the dims of dV, dK and dQ (kDimSplit). Every dK, dV element sums the same
// products in the same order either way, so their bits do not depend on the grid; dQ of a block is
// then added as two 64-key parts instead of one 128-key one (its bits depend on the key blocks'
// arrival order anyway outside deterministic mode, which keeps 128-key CTAs).
template <int kHeadDim_, bool kPaper_, int kKeyGroups_ = 2>
struct WgmmaBackwardTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kPaper = kPaper_;
  static constexpr int kKeyGroups = kKeyGroups_;
  static constexpr bool kDimSplit = kKeyGroups == 1;
  static_assert(kKeyGroups == 2 || (kDimSplit && kHeadDim == 128), "64-key CTAs at head dim 128 (64-dim dQ tiles per consumer)");
  static constexpr int kWarpgroups = 2;  // consumers (key warpgroups)
  static constexpr int kConsumerThreads = 128 * kWarpgroups;
  static constexpr int kThreads = 128 + kConsumerThreads;  // and the producer warpgroup
  // setmaxnreg budgets (FlashAttention-3's): the CTA starts at cta_start_registers(384) = 168 a
  // thread; a consumer holds dK, dV (D / 2 each), S^T, dP^T (16 each), P, dS and the dQ part (32)
  // per thread. At 40 / 232 ptxas (CUDA 13.0) serialized the D = 128 kernel's wgmma for want of
  // registers (C7512); at 24 / 240 nothing serializes, and the producer's loops spill a few words
  // (36-60 bytes at D = 128; at 64 the one-key-block kernel with the exact delta inside, 80). Head
  // dim 64 at 40 / 232 spills nothing and measured the same (-1.9...+1.2%, docs/benchmarks.md), so
  // both keep one budget.
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters = 240;
  static_assert(kProducerRegisters + kWarpgroups * kConsumerRegisters <= (1 + kWarpgroups) * cta_start_registers(kThreads),
                "setmaxnreg only moves the CTA's registers between its warpgroups");
  static constexpr int kGroupKeys = 64;                     // keys per consumer (wgmma m64)
  static constexpr int kBlockK = kGroupKeys * kKeyGroups;  // keys per CTA (deterministic turns count these)
  // dims of dK, dV (and dQ) a consumer computes: all, or its half where both own the same keys
  static constexpr int kConsumerDims = kDimSplit ? kHeadDim / 2 : kHeadDim;
  static constexpr int kBlockQ = 64;  // queries per step (entry.cu sizes the dQ turn counters by it)
  // Query blocks whose Q, dO, lse and delta are in flight (the producer loads block i + kSlots - 1
  // while the consumers compute block i): three at head dim 64, whose blocks are short against a
  // copy's latency (+0.5-3% backward over two, measured), two at 128 (a third does not fit)
  static constexpr int kSlots = kHeadDim == 64 ? 3 : 2;
  static constexpr int kQueryTiles = kBlockQ / 8;
  static constexpr int kDimTiles = kConsumerDims / 8;  // of a consumer's dK, dV accumulators
  // dQ split: head dim 128 over dims, 64 over blocks (one consumer computes a block's whole dQ)
  static constexpr bool kDqAlternate = kHeadDim == 64;
  // dQ of block i issued at block i + 1, so that the consumers do not meet per block: +1.3-5.8%
  // backward at head dim 128, -0.8-5.3% at 64 (measured; docs/benchmarks.md), which keeps the
  // walk as it was, the dQ with its own block after a named barrier of both consumers
  static constexpr bool kDqLate = kHeadDim == 128;
  // A CTA may take several items (the persistent grid, BackwardPlan::main_ctas): head dim 128 only,
  // where it measured +0.9 to +5.5% backward at full attention; at 64 it measured -3.3 to +1.3%,
  // and there the kernel keeps one item a CTA at compile time (its code as before)
  static constexpr bool kPersistent = kHeadDim == 128 && !kDimSplit;  // 64-key CTAs: small grids only
  // S^T and dP^T in separate commit groups (P formed while dP^T runs): where it measured faster
  static constexpr bool kSplitScores = kHeadDim == 64;
  static constexpr int kTile = kGroupKeys * kHeadDim * 2;  // one [64, D] SW128 tile
  static constexpr int kDsTile = kGroupKeys * kBlockQ * 2;  // one consumer's dS^T [64 keys, 64 queries]
  // dS^T of block i is read by both consumers' dQ products (with kDqLate one block later), so a
  // consumer may write block i's tile while the other still reads an earlier one: kSlots + 1
  // buffers, because a consumer at block i has waited for its query slot, which the producer
  // reloaded only once both consumers were done with block i - kSlots, the dQ of block
  // i - kSlots - 1 (the buffer's previous use) included. No barrier of its own guards the reuse.
  // Without kDqLate both consumers meet at a named barrier once their block's tiles are stored,
  // and two buffers do.
  static constexpr int kDsBuffers = kDqLate ? kSlots + 1 : 2;
  static constexpr int kDqTile = kBlockQ * 64 * 4;  // one consumer's FP32 dQ part
  // Shared memory. K, V (a [64, D] tile per key group), Q and dO (kSlots query-block slots) and dS^T
  // in the SW128 layout; the barriers: K/V, then per slot full and free.
  struct SharedStorage {
    std::uint16_t k[kKeyGroups][kGroupKeys * kHeadDim];
    std::uint16_t v[kKeyGroups][kGroupKeys * kHeadDim];
    std::uint16_t q[kSlots][kBlockQ * kHeadDim];
    std::uint16_t d_o[kSlots][kBlockQ * kHeadDim];
    std::uint16_t ds[kDsBuffers][kWarpgroups][kGroupKeys * kBlockQ];  // dS^T [64 keys, 64 queries]
    float dq[kWarpgroups][kBlockQ * 64];                             // fragment order (DqFragmentOrder)
    float rowvals[kSlots][2][kBlockQ];                                // [slot][lse | delta][query]
    std::uint64_t barriers[2 + 2 * kSlots + (kDqLate ? kDsBuffers * kWarpgroups : 0)];
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage);
  static_assert(offsetof(SharedStorage, q) % 1024 == 0 && offsetof(SharedStorage, ds) % 1024 == 0 && kTile % 1024 == 0,
                "SW128 atoms are 1024-byte aligned");
  static_assert(kHeadDim == 64 || kHeadDim == 128, "head dims with kernels: 64, 128");
  static_assert(kBlockQ == 64, "dS^T rows are one 128-byte SW128 block");
  static_assert(kSmemBytes <= 227 * 1024, "fits one CTA per SM");
};

// The order the CTAs start in (a 1-d grid; CTAs start in blockIdx order). A causal key block kb
// walks the query blocks from its diagonal on, so key block 0 is the longest. The (batch, head)
// pairs go in groups of about one wave (kWaveCtas CTAs), and within a group key block 0 of every
// pair first, then key block 1, ...: the grid ends on its last group's short CTAs, not on the long
// key-block-0 CTAs of its last heads (as with the key block varying fastest), while one head's
// CTAs still run close together (its Q and dO shared in L2). Non-causal: groups of one pair, key
// blocks in order. Deterministic mode needs key block kb - 1 of a pair to start before kb: it does.
struct BackwardCtaOrder {
  static constexpr int kWaveCtas = 128;  // about one CTA per SM of an H100 / H200 (132 SMs)
  int key_blocks, pairs, group;
  __host__ __device__ BackwardCtaOrder(int key_blocks_, int pairs_, bool causal)
      : key_blocks(key_blocks_), pairs(pairs_), group(causal && kWaveCtas / key_blocks_ > 1 ? kWaveCtas / key_blocks_ : 1) {}
  // CTA index -> key block kb and pair b * heads + h
  __device__ void decode(int cta, int& kb, int& pair) const {
    const int first_pair = cta / (group * key_blocks) * group;
    const int in_group = pairs - first_pair < group ? pairs - first_pair : group;  // the last group may be short
    const int r = cta - first_pair * key_blocks;
    kb = r / in_group;
    pair = first_pair + r % in_group;
  }
};

// A walk's order: block(i) is the query block of walk index i, from `start` (walk_start,
// walk_order.hpp) round to the walk's end and on from its beginning: rotated in full attention
// outside deterministic mode, so that key blocks walking in step do not reach each dQ tile at once
// (1 x 1 x 8,192 keys in 64-key CTAs measured 0.75x the 128-key CTAs for that alone, 1.04x rotated:
// docs/benchmarks.md). Only the producers follow it (the copies, row values and dQ reductions); the
// consumers take the blocks as the slots bring them, needing a block's index only for the causal
// mask and the deterministic turns, where nothing rotates. kMayRotate false (one key block: the
// kDqDirect kernels) keeps the plain walk at compile time.
template <bool kMayRotate>
struct QueryWalk {
  int begin, count, start;
  __device__ int block(int i) const {
    if constexpr (!kMayRotate) return begin + i;
    const int r = start + i;
    return begin + (r >= count ? r - count : r);
  }
};

// One item of a backward CTA's work: a (batch, head) pair's key block kb (keys k0 .. k0 + 128) and
// the query blocks that see it, [qb_begin, qb_end), walked in order(p). Items go in
// BackwardCtaOrder's order; a grid of fewer CTAs than items (the persistent grid,
// BackwardPlan::main_ctas) has each CTA take every gridDim.x-th.
struct BackwardItem {
  int kb, b, h, kv_h, k0, qb_begin, qb_end;
  std::int64_t row_base;  // of the pair's lse and delta rows
  __device__ int walk() const { return qb_end - qb_begin; }
  template <bool kMayRotate>
  __device__ QueryWalk<kMayRotate> order(const BackwardParams& p) const {
    if constexpr (!kMayRotate) return {qb_begin, walk(), 0};
    return {qb_begin, walk(), walk_start(k0, walk(), p.k_len, p.causal != 0, p.deterministic != 0)};
  }
  template <int BK, int BQ>
  __device__ static BackwardItem at(const BackwardParams& p, const BackwardCtaOrder& order, int item, int n_qblocks) {
    BackwardItem it;
    int pair;
    order.decode(item, it.kb, pair);
    it.b = pair / p.heads, it.h = pair % p.heads, it.k0 = it.kb * BK;
    it.kv_h = it.h / p.kv_group;  // grouped-query heads share K/V
    it.row_base = std::int64_t(pair) * p.q_len;
    const int first_query = p.causal ? max(0, it.k0 - (p.k_len - p.q_len)) : 0;
    it.qb_begin = first_query / BQ, it.qb_end = n_qblocks;
    return it;
  }
};

// A key (consumer) warpgroup's per-block steps, shared with the kernel lab's dQ-warpgroup variant
// (lab/backward_dqwg_kernel.cuh). Element (nq, e) of st, dpt is key `key` + 8 (e / 2) of the
// group (key = its warp's 16 keys' first + g), query 8 nq + 2t + (e % 2) of the block. (The dS
// loop stays in each kernel: called as a function, it changed how ptxas schedules the D = 128
// kernel, which these helpers leave instruction for instruction as measured.)

// K and V of the CTA's 64 kGroups keys from k0 (each group's [64, D] tiles), on barrier bar
template <int D, int kGroups = 2>
__device__ __forceinline__ void load_key_tiles(const BackwardParams& p, std::uint32_t s_k, std::uint32_t s_v, int k0, int kv_h, int b,
                                               std::uint32_t bar) {
  constexpr int kBoxBytes = 64 * 64 * 2, kBoxes = D / 64, kTile = 64 * D * 2;
  mbar_arrive_expect_tx(bar, 2 * kGroups * kBoxes * kBoxBytes);
#pragma unroll
  for (int grp = 0; grp < kGroups; ++grp)
#pragma unroll
    for (int x = 0; x < kBoxes; ++x) {
      tma_load_4d(s_k + grp * kTile + x * kBoxBytes, &p.tma_k, 64 * x, k0 + grp * 64, kv_h, b, bar);
      tma_load_4d(s_v + grp * kTile + x * kBoxBytes, &p.tma_v, 64 * x, k0 + grp * 64, kv_h, b, bar);
    }
}

// Q and dO of query block qb (64 rows) into the tiles at s_q, s_do, on barrier bar
template <int D>
__device__ __forceinline__ void load_query_block(const BackwardParams& p, std::uint32_t s_q, std::uint32_t s_do, int qb, int h, int b,
                                                 std::uint32_t bar) {
  constexpr int kBoxBytes = 64 * 64 * 2, kBoxes = D / 64;
  mbar_arrive_expect_tx(bar, 2 * kBoxes * kBoxBytes);
#pragma unroll
  for (int x = 0; x < kBoxes; ++x) {
    tma_load_4d(s_q + x * kBoxBytes, &p.tma_q, 64 * x, qb * 64, h, b, bar);
    tma_load_4d(s_do + x * kBoxBytes, &p.tma_do, 64 * x, qb * 64, h, b, bar);
  }
}

// S^T = K Q^T and dP^T = V dO^T of 64 keys and a block of queries (K-major operands: step kk is 32
// bytes into a block). kSplitScores commits S^T as its own group, so that P can be formed while
// dP^T runs; otherwise one group.
template <int D, bool kSplitScores, int NQ>
__device__ __forceinline__ void issue_scores_and_dprobs(float (&st)[NQ][4], float (&dpt)[NQ][4], std::uint32_t s_k,
                                                        std::uint32_t s_q, std::uint32_t s_v, std::uint32_t s_do) {
  using Tile = WgmmaTile<64, D>;
  const Sw128Desc k_desc(s_k, 16, 1024), q_desc(s_q, 16, 1024), v_desc(s_v, 16, 1024), do_desc(s_do, 16, 1024);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const std::uint32_t off = (kk / 4) * Tile::kBlockBytes + (kk % 4) * 32;
    wgmma_ss<64>(st, k_desc.at(off), q_desc.at(off), kk > 0);
  }
  if constexpr (kSplitScores) wgmma_commit();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const std::uint32_t off = (kk / 4) * Tile::kBlockBytes + (kk % 4) * 32;
    wgmma_ss<64>(dpt, v_desc.at(off), do_desc.at(off), kk > 0);
  }
  wgmma_commit();
}

// BF16(P) of query tile nq into the A fragments of dV += P^T dO
template <int NQ>
__device__ __forceinline__ void pack_prob_tile(const float (&st)[NQ][4], std::uint32_t (&pa)[NQ / 2][4], int nq) {
  pa[nq / 2][(nq % 2) * 2 + 0] = pack_bf16x2(st[nq][0], st[nq][1]);
  pa[nq / 2][(nq % 2) * 2 + 1] = pack_bf16x2(st[nq][2], st[nq][3]);
}
template <int NQ>
__device__ __forceinline__ void pack_probs(const float (&st)[NQ][4], std::uint32_t (&pa)[NQ / 2][4]) {
#pragma unroll
  for (int nq = 0; nq < NQ; ++nq) pack_prob_tile(st, pa, nq);
}

// P at the mode's rounding points, in place of S^T (masked scores already -inf), and BF16(P) as
// the A fragments of dV += P^T dO; kPack false: P only (the caller packs later, pack_probs)
template <bool kPaper, int NQ, bool kPack = true>
__device__ __forceinline__ void form_probs(const BackwardParams& p, float (&st)[NQ][4], std::uint32_t (&pa)[NQ / 2][4],
                                           const float* s_lse, int t) {
#pragma unroll
  for (int nq = 0; nq < NQ; ++nq) {
#pragma unroll
    for (int e = 0; e < 4; ++e) st[nq][e] = prob_of_score<kPaper>(p, st[nq][e], s_lse[nq * 8 + 2 * t + (e & 1)]);
    if constexpr (kPack) pack_prob_tile(st, pa, nq);
  }
}

// dV += BF16(P)^T dO, dK += BF16(dS)^T Q, one commit group (B MN-major: 16 queries step 2048 bytes),
// over the DT x 8 dims of dO, Q from s_do, s_q (all D, or a 64-dim block of them: kDimSplit)
template <int D, int BQ, int DT>
__device__ __forceinline__ void issue_dv_dk(float (&acc_dv)[DT][4], float (&acc_dk)[DT][4], const std::uint32_t (&pa)[BQ / 16][4],
                                            const std::uint32_t (&dsa)[BQ / 16][4], std::uint32_t s_do, std::uint32_t s_q) {
  using Tile = WgmmaTile<64, D>;
  const Sw128Desc do_mn(s_do, Tile::kBlockBytes, 1024), q_mn(s_q, Tile::kBlockBytes, 1024);
  wgmma_fence();
#pragma unroll
  for (int kq = 0; kq < BQ / 16; ++kq) {
    wgmma_pv<DT * 8>(acc_dv, pa[kq], do_mn.at(kq * 2048));
    wgmma_pv<DT * 8>(acc_dk, dsa[kq], q_mn.at(kq * 2048));
  }
  wgmma_commit();
}

// The barriers of one backward CTA: K/V landed; per slot `full` (Q, dO copies landed and the row
// warp stored lse, delta: 1 + 32 arrivals) and `free` (every consumer warp is done with the slot);
// K/V free (every consumer warp is done with the item's K and V: the persistent grid's next item
// may load its own); per dS^T buffer and consumer `ds_full` (its 128 threads stored the tile); named barriers: the
// second consumer's start (once, below), a consumer's dQ tile stored (dq_full) and read by the
// copy engine (dq_empty), each with the reducing warp, and the consumers' own (the deterministic
// turns).
template <int kSlots>
struct BackwardBarriers {
  std::uint32_t base;
  __device__ std::uint32_t kv() const { return base; }
  __device__ std::uint32_t full(int slot) const { return base + 8 * (1 + slot); }
  __device__ std::uint32_t free(int slot) const { return base + 8 * (1 + kSlots + slot); }
  __device__ std::uint32_t kv_free() const { return base + 8 * (1 + 2 * kSlots); }
  __device__ std::uint32_t ds_full(int buffer, int consumer) const { return base + 8 * (2 + 2 * kSlots + 2 * buffer + consumer); }
  static constexpr int kStagger = 1, kDsStored = 1, kConsumers = 6;  // kDqLate uses the one, else the other
  static constexpr int kRowWarpArrivals = 32;
  static constexpr int kDqHandshake = 128 + 32;  // a consumer and its reducing warp
  __device__ static int dq_full(int consumer) { return 2 + consumer; }
  __device__ static int dq_empty(int consumer) { return 4 + consumer; }
  // the delta inside the main kernel (block_exact_delta): both consumers' groups stored, a
  // consumer's delta formed
  static constexpr int kDeltaGroups = 7;
  __device__ static int delta_formed(int consumer) { return 8 + consumer; }
};

// Query block i of a CTA's walk (its position over all the CTA's items: the slots' ring runs on
// from one item to the next): its slot and which use of the slot it is (the phase of the slot's
// barriers that it completes: use & 1; it waits for the free barrier's phase (use - 1) & 1).
template <int kSlots>
struct QuerySlot {
  int slot, use;
  __device__ explicit QuerySlot(int i) : slot(i % kSlots), use(i / kSlots) {}
};

// Producer warp 1: lse and delta of the CTA's query blocks into their slots, a block ahead of the
// consumers (rows past Tq: lse = +inf, so P = 0 there, and delta = 0). kLoadDelta false: the
// consumers form the delta themselves (DeltaPass::in_main), lse only.
template <class Traits, bool kLoadDelta, bool kMayRotate>
__device__ __forceinline__ void produce_row_values(const BackwardParams& p, typename Traits::SharedStorage& shared,
                                                   const BackwardBarriers<Traits::kSlots>& bars, std::int64_t row_base,
                                                   QueryWalk<kMayRotate> walk, int position, int lane) {
  constexpr int BQ = Traits::kBlockQ;
  for (int i = 0; i < walk.count; ++i) {
    const int qb = walk.block(i);
    const QuerySlot<Traits::kSlots> at(position + i);
    if (at.use > 0) mbar_wait(bars.free(at.slot), (at.use - 1) & 1);
#pragma unroll
    for (int r = lane; r < BQ; r += 32) {
      const int q = qb * BQ + r;
      shared.rowvals[at.slot][0][r] = q < p.q_len ? p.lse[row_base + q] : __builtin_huge_valf();
      if constexpr (kLoadDelta) shared.rowvals[at.slot][1][r] = q < p.q_len ? p.delta[row_base + q] : 0.0f;
    }
    mbar_arrive(bars.full(at.slot));  // release: the stores above are seen after the slot's wait
  }
}

// Producer warps 2, 3: consumer c's dQ tiles (one per block it computes: every block at head dim
// 128, every other at 64) added into the workspace as they are stored. The tile goes back to the
// consumer once the copy engine has read it, except after the CTA's last (last_item: the item's last
// tile is the CTA's; the consumer waits for none after it).
// With claims (BackwardParams::dq_first_store, [n_qblocks][D / 64] words of this (b, h)) nothing
// cleared the workspace: the key block whose claim on a tile comes first stores it (a bulk copy,
// no read of the old bytes at L2), waits until the store has landed and then marks the claim
// kDqTileStored; a later block waits for that mark before its reduction. The first block holds its
// claim while it runs, so a wait never depends on a CTA that has not started.
inline constexpr int kDqTileStored = 1 << 30;  // claim word: arrivals in the low bits
template <class Traits, bool kMayRotate>
__device__ __forceinline__ void reduce_dq_tiles(const BackwardBarriers<Traits::kSlots>& bars, float* dq_head, int* claims_head,
                                                std::uint32_t s_dq_c, int c, QueryWalk<kMayRotate> walk, bool last_item, int lane) {
  constexpr int BQ = Traits::kBlockQ, D = Traits::kHeadDim;
  constexpr bool kAlternate = Traits::kDqAlternate;
  constexpr int kStep = kAlternate ? 2 : 1;
  const int dq_tile = kAlternate ? 0 : c;  // 64-dim tile of a block
  for (int i = kAlternate ? c : 0; i < walk.count; i += kStep) {  // walk index i (consumer c's, alternating)
    const int qb = walk.block(i);
    named_barrier_sync(bars.dq_full(c), bars.kDqHandshake);
    int* stored_claim = nullptr;  // this block stored the tile: mark it once the store has landed
    if (lane == 0) {
      float* dst = dq_head + std::int64_t(qb) * BQ * D + dq_tile * DqFragmentOrder::kTileFloats;
      int* claim = claims_head ? claims_head + qb * (D / 64) + dq_tile : nullptr;
      if (claim && atomicAdd(claim, 1) == 0) {
        bulk_store(dst, s_dq_c, Traits::kDqTile);
        stored_claim = claim;
      } else {
        if (claim) {
          while ((load_acquire_gpu(claim) & kDqTileStored) == 0) __nanosleep(32);
          fence_proxy_async_global();  // the reduction below comes after the store it saw
        }
        bulk_reduce_add_f32(dst, s_dq_c, Traits::kDqTile);
      }
      bulk_commit_group();
      bulk_wait_group_read<0>();
    }
    __syncwarp();
    if (i + kStep < walk.count || !last_item) named_barrier_arrive(bars.dq_empty(c), bars.kDqHandshake);
    if (stored_claim) {  // lane 0, with the tile handed back: the later blocks may add once it has landed
      bulk_wait_group<0>();
      fence_proxy_async_global();
      or_release_gpu(stored_claim, kDqTileStored);
    }
  }
  if (last_item && lane == 0) bulk_wait_group<0>();  // the last reduction is done before the CTA's memory goes
}

// dS^T query tiles nq, nq + 1 of a warp's 16 keys ([key][query] in the SW128 layout: the dQ
// product's A operand) from its packed dS fragments, one stmatrix of four 8 x 8 matrices in dsa's
// order: (nq, rows g), (nq, g + 8), (nq + 1, g), (nq + 1, g + 8); lane l addresses row l % 8 of
// matrix l / 8. (Four instructions a block where 16 32-bit stores were.)
template <class DsTile>
__device__ __forceinline__ void store_ds_pair(std::uint32_t s_ds_group, int key_row, int nq, const std::uint32_t (&ds)[4], int lane) {
  const int m = lane / 8;
  stmatrix_x4(s_ds_group + DsTile::offset(key_row + lane % 8 + 8 * (m % 2), nq + m / 2), ds);
}

// A consumer's [64 queries, 64] FP32 dQ part -> its shared tile in fragment order (DqFragmentOrder:
// four conflict-free 16-byte stores per thread and 8-dim group)
__device__ __forceinline__ void store_dq_part(std::uint32_t s_dq_group, const float (&acc_dq)[8][4], int tid) {
#pragma unroll
  for (int j = 0; j < 8; ++j)
    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(s_dq_group + (j * 128 + tid) * 16), "f"(acc_dq[j][0]),
                 "f"(acc_dq[j][1]), "f"(acc_dq[j][2]), "f"(acc_dq[j][3])
                 : "memory");
}

// One key block (BackwardParams::dq_direct), producer warps 2, 3 (idle otherwise): causal with
// Tq > Tk, the query blocks before the CTA's first see no key at all (there is one key block), so
// their dQ is zero, which the workspace's conversion would have written; warp c writes consumer c's
// dims of them (head dim 64: every other block, as the consumers alternate), eight lanes a row.
template <class Traits>
__device__ __forceinline__ void zero_unseen_dq_blocks(const BackwardParams& p, int c, int b, int h, int qb_begin, int lane) {
  constexpr int BQ = Traits::kBlockQ;
  constexpr bool kAlternate = Traits::kDqAlternate;
  std::uint16_t* dq_head = p.dq + p.dq_strides.head(b, h);
  const bool store16 = rows_16_byte_aligned(dq_head, p.dq_strides.t);
  const std::uint32_t zeros[4] = {0, 0, 0, 0};
  for (int qb = kAlternate ? c : 0; qb < qb_begin; qb += kAlternate ? 2 : 1)
    for (int i = 0; i < BQ * 8 / 32; ++i) {
      const int q = qb * BQ + i * 4 + lane / 8;
      if (q < p.q_len) store_row8(dq_head + std::int64_t(q) * p.dq_strides.t + (kAlternate ? 0 : c * 64) + (lane % 8) * 8, zeros, store16);
    }
}

// kDqDirect: BackwardParams::dq_direct (one key block), a kernel of its own so that the others' code
// and registers stay as they are (as a run-time branch it moved the head dim 128 kernel's register
// allocation and added spills inside the walk). Its consumers store dQ to global memory themselves:
// staged through shared memory for the producer's warps to copy, compute-sanitizer's racecheck
// reported the named-barrier hand-over between the two (generic reads, unlike the bulk reduction's).
// kDeltaInMain (DeltaPass::in_main, one key block only): the consumers form the exact delta of each
// query block from their P and dP (block_exact_delta, exact_delta_order.cuh) before its dS, and store
// it; no pass before this kernel computes it, the producer loads lse only. The consumers then meet
// once per block, so they start together (no stagger).
template <class Traits, bool kDqDirect, bool kDeltaInMain = false>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    attention_backward_wgmma_kernel(const __grid_constant__ BackwardParams p) {
  static_assert(kDqDirect || !kDeltaInMain, "the delta inside the main kernel needs every key of a row in the CTA");
  static_assert(!kDqDirect || !Traits::kDimSplit, "one key block of 128 keys: a consumer's 64 each");
  constexpr int D = Traits::kHeadDim, BQ = Traits::kBlockQ, BK = Traits::kBlockK, GK = Traits::kGroupKeys;
  constexpr int NQ = Traits::kQueryTiles, DT = Traits::kDimTiles, kSlots = Traits::kSlots;
  constexpr bool kPaper = Traits::kPaper, kAlternate = Traits::kDqAlternate, kSplitScores = Traits::kSplitScores;
  constexpr int kTile = Traits::kTile, kDsTile = Traits::kDsTile, kConsumerThreads = Traits::kConsumerThreads;
  using Tile = WgmmaTile<64, D>;
  using DsTile = WgmmaTile<64, 64>;
  using Bars = BackwardBarriers<kSlots>;

  extern __shared__ __align__(1024) unsigned char smem[];
  auto& shared = *reinterpret_cast<typename Traits::SharedStorage*>(smem);
  const std::uint32_t s_k = smem_u32(shared.k), s_v = smem_u32(shared.v), s_q0 = smem_u32(shared.q), s_do0 = smem_u32(shared.d_o);
  const std::uint32_t s_ds = smem_u32(shared.ds), s_dq = smem_u32(shared.dq);
  const Bars bars{smem_u32(shared.barriers)};

  const bool causal = p.causal != 0;
  const int key_blocks = blocks_of(p.k_len, BK);
  const BackwardCtaOrder order(key_blocks, p.batch * p.heads, causal);
  const int n_items = key_blocks * p.batch * p.heads;  // < 2^31 (check_tensors)
  const int n_qblocks = DqFragmentOrder::blocks(p.q_len);  // BQ: its kBlockQ
  // (without kPersistent the item is blockIdx.x itself, which the compiler knows to be uniform)
  const auto item_at = [&](int item) {
    return BackwardItem::at<BK, BQ>(p, order, Traits::kPersistent ? item : int(blockIdx.x), n_qblocks);
  };
  // The warpgroup index broadcast from lane 0: the compiler then knows it is warp-uniform and keeps
  // the shared-memory addresses derived from it (wgmma descriptors) in uniform registers instead of
  // moving them over (R2UR) before every product (CUTLASS's canonical_warp_group_idx does the same).
  const int wg = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0), tid = threadIdx.x % 128;
  const int warp = tid / 32, lane = tid % 32;
  // walk block i of item `it`, at ring position `position` + i
  const auto issue_query_block = [&](const BackwardItem& it, const QueryWalk<!kDqDirect>& walk, int i, int position) {
    const int slot = QuerySlot<kSlots>(position + i).slot;
    load_query_block<D>(p, s_q0 + slot * kTile, s_do0 + slot * kTile, walk.block(i), it.h, it.b, bars.full(slot));
  };
  // the CTA's items: blockIdx.x, then every gridDim.x-th (one each where the grid has a CTA per item).
  // Without kPersistent one item at compile time: the rounds and ring positions below stay 0 (so
  // the code is that of a CTA per item)
  const auto next_item = [&](int item) { return Traits::kPersistent ? item + int(gridDim.x) : n_items; };
  constexpr int kNextRound = Traits::kPersistent ? 1 : 0;
  // A producer role's walk over the CTA's items: work(it, round, position, last) with the item's
  // round (items before it), the ring position of its first query block (the walks before it) and
  // whether it is the CTA's last item. The producer roles' use leaves every backward kernel's SASS as
  // it was, instruction for instruction; the consumers keep their loop written out, since their walk
  // inside this lambda changed the D = 128 kernels' SASS in some 4,800 lines (register allocation).
  const auto for_each_item = [&](auto&& work) {
    int position = 0;
    for (int item = blockIdx.x, round = 0; item < n_items; item = next_item(item), round += kNextRound) {
      const BackwardItem it = item_at(item);
      work(it, round, position, next_item(item) >= n_items);
      position += kNextRound * it.walk();
    }
  };

  if (threadIdx.x == 0) {
    mbar_init(bars.kv(), 1);
    mbar_init(bars.kv_free(), 8);  // every consumer warp
    for (int s = 0; s < kSlots; ++s) mbar_init(bars.full(s), 1 + Bars::kRowWarpArrivals), mbar_init(bars.free(s), 8);
    if constexpr (Traits::kDqLate) {
      for (int d = 0; d < Traits::kDsBuffers; ++d)
        for (int c = 0; c < Traits::kWarpgroups; ++c) mbar_init(bars.ds_full(d, c), 128);  // every thread of consumer c
    }
    mbar_fence_init();
  }
  __syncthreads();  // the last CTA-wide barrier
  // Without a delta pass before it (kDeltaInMain: one key block, the exact delta formed here) the
  // kernel this one depends on is whatever came before it in the stream, which may be what writes
  // q, k, v or dO and may let this kernel start before it ends (a GEMM producing dO, say): then
  // nothing is read before the wait. After a pass (an ordinary launch, so it started only once all
  // the work before it had ended) the prologue's inputs are complete already.
  if constexpr (kDeltaInMain) grid_dependency_wait();
  if (threadIdx.x == 0) {  // inputs of the first item that the delta pass before this kernel does not write
    const BackwardItem it = item_at(blockIdx.x);
    load_key_tiles<D, Traits::kKeyGroups>(p, s_k, s_v, it.k0, it.kv_h, it.b, bars.kv());
    if (it.walk() > 0) issue_query_block(it, it.template order<!kDqDirect>(p), 0, 0);
  }
  // Launched as the delta pass's programmatic dependent (launch_after_previous): delta, the dQ
  // workspace and the claims or turn counters the pass cleared are read or written only after this wait.
  grid_dependency_wait();
  allow_dependent_launch();  // the dQ conversion's CTAs may start once every CTA here has (they wait too)

  if (wg == 0) {  // the producer warpgroup
    release_registers<Traits::kProducerRegisters>();
    if (warp == 0) {
      if (lane == 0) {
        for_each_item([&](const BackwardItem& it, int round, int position, bool) {
          const QueryWalk<!kDqDirect> walk = it.template order<!kDqDirect>(p);
          const auto issue = [&](int i) {
            const QuerySlot<kSlots> at(position + i);
            if (at.use > 0) mbar_wait(bars.free(at.slot), (at.use - 1) & 1);
            issue_query_block(it, walk, i, position);
          };
          if (round > 0) {  // the first item's K, V and first block went before the dependency wait
            if (it.walk() > 0) issue(0);  // its slot frees before the last item's K, V do
            mbar_wait(bars.kv_free(), (round - 1) & 1);
            load_key_tiles<D, Traits::kKeyGroups>(p, s_k, s_v, it.k0, it.kv_h, it.b, bars.kv());
          }
          for (int i = 1; i < it.walk(); ++i) issue(i);
        });
      }
    } else if (warp == 1) {
      for_each_item([&](const BackwardItem& it, int, int position, bool) {
        produce_row_values<Traits, !kDeltaInMain>(p, shared, bars, it.row_base, it.template order<!kDqDirect>(p), position, lane);
      });
    } else if (kDqDirect) {
      for_each_item([&](const BackwardItem& it, int, int, bool) {
        zero_unseen_dq_blocks<Traits>(p, warp - 2, it.b, it.h, it.qb_begin, lane);
        if (kDeltaInMain && warp == 2) {  // rows before the walk's first block see no key: delta 0, as the pass writes
          for (int q = lane; q < min(it.qb_begin * BQ, p.q_len); q += 32) p.delta[it.row_base + q] = 0.0f;
        }
      });
    } else if (!p.deterministic) {
      const int c = warp - 2;
      for_each_item([&](const BackwardItem& it, int, int, bool last) {
        const std::int64_t pair = std::int64_t(it.b) * p.heads + it.h;
        int* claims_head = p.dq_claims ? p.dq_claims + pair * n_qblocks * (D / 64) : nullptr;
        reduce_dq_tiles<Traits>(bars, p.dq_accum + pair * n_qblocks * BQ * D, claims_head, s_dq + c * Traits::kDqTile, c,
                                it.template order<!kDqDirect>(p), last, lane);
      });
    }
    return;
  }
  claim_registers<Traits::kConsumerRegisters>();

  const int cw = wg - 1;  // this consumer's 64 keys: k0 + 64 cw .. (kDimSplit: k0 .., dims 64 cw ..)
  constexpr bool kDimSplit = Traits::kDimSplit;
  const int own_group = kDimSplit ? 0 : cw;  // the consumer's K, V tile
  const int g = lane / 4, t = lane % 4;
  const std::uint32_t s_k_group = s_k + own_group * kTile, s_v_group = s_v + own_group * kTile;
  // kDimSplit: the 64-dim block of dO, Q (B of dV, dK) and of dK, dV's columns this consumer computes
  const std::uint32_t dim_block = kDimSplit ? cw * Tile::kBlockBytes : 0;
  const int dim0 = kDimSplit ? cw * Traits::kConsumerDims : 0;
  const std::uint32_t s_dq_group = s_dq + cw * Traits::kDqTile;
  const int key_row = warp * 16;
  const auto consumers_sync = [] { named_barrier_sync(Bars::kConsumers, kConsumerThreads); };
  int position = 0;   // of the item's first block in the slots' and the dS^T buffers' rings
  int dq_stored = 0;  // dQ tiles this consumer handed to its reducing warp
  for (int item = blockIdx.x, round = 0; item < n_items; item = next_item(item), round += kNextRound) {
    const BackwardItem it = item_at(item);
    const int kb = it.kb, b = it.b, h = it.h, qb_begin = it.qb_begin, qb_end = it.qb_end;
    const std::int64_t row_base = it.row_base;
    const int group_k0 = it.k0 + own_group * GK;
    float* dq_head = p.dq_accum + (std::int64_t(b) * p.heads + h) * n_qblocks * BQ * D;  // fragment order

    float acc_dk[DT][4], acc_dv[DT][4];  // this warp's 16 keys x its dims (all D, or half: kDimSplit)
#pragma unroll
    for (int nd = 0; nd < DT; ++nd)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_dk[nd][e] = acc_dv[nd][e] = 0.0f;
    mbar_wait(bars.kv(), round & 1);
    // kDeltaInMain: the delta of walk block j from the block's P (st) and dP^T (dpt), in the unused dQ
    // staging tiles: two partials buffers [8 groups][64 queries], then each consumer's delta [64]
    const auto exact_delta_of_block = [&](int j, const float (&st)[NQ][4], const float (&dpt)[NQ][4]) {
      float* scratch = &shared.dq[0][0];
      const int q0 = (qb_begin + j) * BQ;
      return block_exact_delta<kPaper, NQ>(st, dpt, scratch + (j & 1) * kExactDeltaGroups * BQ, scratch + 2 * kExactDeltaGroups * BQ + cw * BQ,
                                           cw, tid, Bars::kDeltaGroups, Bars::delta_formed(cw), p.delta + row_base + q0, p.q_len - q0);
    };
    static_assert(!kDeltaInMain || (2 * kExactDeltaGroups + Traits::kWarpgroups) * BQ <= int(sizeof(shared.dq) / sizeof(float)),
                  "the delta's scratch fits the dQ staging tiles");
    // kDqDirect: the dQ part of walk block j is final (one key block), so it goes to dq as BF16 here,
    // as the conversion would write it: 0 + acc first (the workspace's sum: a -0 part reads +0 there),
    // then mul_rn by the scale (fused; paper's dS has it) and RN
    const auto store_dq_direct = [&](int j, const float (&acc_dq)[8][4]) {
      std::uint16_t* dq_rows = p.dq + p.dq_strides.head(b, h);
      const bool dq16 = rows_16_byte_aligned(dq_rows, p.dq_strides.t);
      const int q0 = (qb_begin + j) * BQ, dq_tile = kAlternate ? 0 : cw;
      store_dq_part_rows(dq_rows + std::int64_t(q0) * p.dq_strides.t + dq_tile * 64, p.dq_strides.t, p.q_len - q0, kPaper ? 1.0f : p.scale,
                         dq16, warp, lane, [&](int k) {
                           return make_float4(__fadd_rn(acc_dq[k][0], 0.0f), __fadd_rn(acc_dq[k][1], 0.0f), __fadd_rn(acc_dq[k][2], 0.0f),
                                              __fadd_rn(acc_dq[k][3], 0.0f));
                         });
    };
    // Traits::kDqLate (head dim 128): the late dQ below. Head dim 64: the walk as it was before,
    // both consumers meeting at a named barrier per block, kept as written then: the late dQ lost
    // 1-5% there, and a version sharing the late dQ's code with a compile-time switch, whose SASS
    // differed only in register allocation, still lost 2-4% (docs/benchmarks.md). The two walks'
    // common steps (S^T, dP^T, P, dS, the dQ product and its hand-over) stay written out in each:
    // shared as lambdas they left the head dim 128 SASS as it is but changed the register
    // allocation of the head dim 64 kernel again, which is what measured slower.
    // the dS^T buffer of walk block j (both consumers' tiles), in its ring position
    const auto ds_buffer = [&](int j) { return s_ds + ((position + j) % Traits::kDsBuffers) * 2 * kDsTile; };
    if constexpr (Traits::kDqLate) {
      // dQ of block j (j: the walk's index) is issued at block j + 1, behind that block's dV,
      // dK products (the last block's after the walk), so neither consumer waits for the other's dS^T
      // of the block it is on: the two run about half a block apart (consumer 1 starts once consumer 0
      // has issued its first dV, dK) and one's P, dS arithmetic runs while the other's products keep
      // the tensor cores busy, where waiting for both tiles of the block had them compute their P, dS
      // at the same time. A consumer holds a [64 queries, 64] part: head dim 128 its half of the
      // dims, 64 the whole block, consumer j % 2 computing block j's.
      const auto has_dq = [&](int j) { return !kAlternate || (j & 1) == cw; };
      const auto wait_ds = [&](int j) {  // both consumers' dS^T tiles of block j are stored (kDimSplit: its own)
        const int buffer = (position + j) % Traits::kDsBuffers, use = (position + j) / Traits::kDsBuffers;
#pragma unroll
        for (int c = 0; c < Traits::kWarpgroups; ++c)
          if (!kDimSplit || c == cw) mbar_wait(bars.ds_full(buffer, c), use & 1);
      };
      // dQ of block j over the CTA's 128 keys (k-step kk: consumer kk / 4's tile), once both tiles are
      // stored; kDimSplit: over its 64 keys, from its own copy of the block's dS^T
      const auto issue_dq = [&](int j, float (&acc_dq)[8][4]) {
        const int dq_tile = kAlternate ? 0 : cw;  // 64-dim tile of the block
        const std::uint32_t s_ds_first = ds_buffer(j) + (kDimSplit ? cw * kDsTile : 0);
        const Sw128Desc ds_mn(s_ds_first, DsTile::kBlockBytes, 1024), k_mn(s_k + dq_tile * Tile::kBlockBytes, Tile::kBlockBytes, 1024);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
          const std::uint32_t a = (kk / 4) * kDsTile + (kk % 4) * 2048;
          const std::uint32_t b = (kk / 4) * kTile + (kk % 4) * 2048;
          wgmma_ss<64, 1>(acc_dq, ds_mn.at(a), k_mn.at(b), kk > 0);
        }
        wgmma_commit();
      };
      // dQ of block j landed (acc_dq): to shared memory (fragment order), then to the workspace by the
      // reducing warp's bulk reduction, or in key-block order (deterministic)
      const auto hand_dq = [&](int j, const float (&acc_dq)[8][4]) {
        const int qb = qb_begin + j;
        if constexpr (kDqDirect) {
          if (has_dq(j)) store_dq_direct(j, acc_dq);
          return;
        }
        if (!p.deterministic) {
          if (has_dq(j)) {
            if (dq_stored > 0) named_barrier_sync(Bars::dq_empty(cw), Bars::kDqHandshake);  // the last tile was read
            store_dq_part(s_dq_group, acc_dq, tid);
            fence_proxy_async_smem();  // the copy engine reads the tile
            named_barrier_arrive(Bars::dq_full(cw), Bars::kDqHandshake);
            ++dq_stored;
          }
          return;
        }
        if (has_dq(j)) store_dq_part(s_dq_group, acc_dq, tid);
        // key-block order: this CTA adds its whole [64, D] block (128: both consumers' tiles, which are
        // the block's two dim tiles in order; 64: the owning consumer's tile)
        float* dq_block = dq_head + std::int64_t(qb) * BQ * D;
        int* turn = p.dq_semaphore + ((std::int64_t(b) * p.heads + h) * n_qblocks + qb);
        const int ctid = threadIdx.x - 128;  // 0 .. kConsumerThreads
        wait_turn(turn, kb, ctid == 0, consumers_sync);  // its barrier: the dQ tiles are stored
        const float4* tiles = reinterpret_cast<const float4*>(shared.dq[kAlternate ? (j & 1) : 0]);
        float4* dst = reinterpret_cast<float4*>(dq_block);
        constexpr int kVecs = BQ * D / 4;
        // dq_first_store: key block 0 adds first into every block any key block reaches (a query
        // that sees a key sees key 0), so it adds to zero instead of reading the uncleared block
        const bool first = p.dq_first_store && kb == 0;
        for (int v = ctid; v < kVecs; v += kConsumerThreads) {
          const float4 add = tiles[v];
          float4 cur = first ? make_float4(0.0f, 0.0f, 0.0f, 0.0f) : __ldcg(dst + v);
          cur.x += add.x, cur.y += add.y, cur.z += add.z, cur.w += add.w;
          __stcg(dst + v, cur);
        }
        pass_turn(turn, kb + 1, ctid == 0, consumers_sync);  // its barrier also ends the reads of the dQ tiles
      };
      const int n_walk = qb_end - qb_begin;
      if (!kDeltaInMain && cw == 1 && n_walk > 0) named_barrier_sync(Bars::kStagger, kConsumerThreads);
      // Block i of the walk; kFirst: i = 0, which has no previous block's dQ (a separate copy: with a
      // run-time condition on the dQ product ptxas serialized the head dim 128 kernel's wgmma, C7512)
      const auto walk_block = [&](int i, auto first) {
        constexpr bool kFirst = decltype(first)::value;
        const int q0 = (qb_begin + i) * BQ;
        const QuerySlot<kSlots> at(position + i);
        const int slot = at.slot;
        const std::uint32_t s_q = s_q0 + slot * kTile, s_do = s_do0 + slot * kTile;
        mbar_wait(bars.full(slot), at.use & 1);
        const std::uint32_t s_ds_buf = ds_buffer(i);

        // The walk's first block on the causal diagonal, where no query of it sees this consumer's
        // keys (consumer 1 where the block starts at the CTA's first key; consumer 0 always sees
        // some): every P and dS is 0, so its dV, dK products add exact zeros and are left out. What
        // stays is its dS^T tile for both consumers' dQ products (zeros) and the arrivals the other
        // side counts on.
        if constexpr (kFirst && !kDeltaInMain) {
          if (causal && group_k0 > q0 + BQ - 1 + p.k_len - p.q_len) {
            const std::uint32_t zeros[4] = {0u, 0u, 0u, 0u};
#pragma unroll
            for (int nq = 0; nq < NQ; nq += 2) store_ds_pair<DsTile>(s_ds_buf + cw * kDsTile, key_row, nq, zeros, lane);
            fence_proxy_async_smem();
            mbar_arrive(bars.ds_full((position + i) % Traits::kDsBuffers, cw));
            if (lane == 0) mbar_arrive(bars.free(slot));
            return;
          }
        }

        // ---- S^T = K Q^T and dP^T = V dO^T. Head dim 64: S^T in its own group, so that P is formed
        // while dP^T runs (+2-4% backward; at 128 it measured -2% to +1%, so there one group and P
        // after both products)
        float st[NQ][4], dpt[NQ][4];
        issue_scores_and_dprobs<D, kSplitScores>(st, dpt, s_k_group, s_q, s_v_group, s_do);
        wgmma_wait<kSplitScores ? 1 : 0>();  // S^T landed (with the split dP^T may still run)
        fence_registers(st);

        // ---- P, then dS, at the mode's rounding points (backward_common.cuh's element mapping):
        // element (nq, e) is key group_k0 + key_row + g + 8 (e / 2), query q0 + 8 nq + 2t + (e % 2).
        // P overwrites S^T in place.
        const float* s_lse = shared.rowvals[slot][0];
        const float* s_delta = shared.rowvals[slot][1];  // kDeltaInMain: replaced once dP^T has landed
        const bool need_mask = group_k0 + GK > p.k_len || (causal && group_k0 + GK - 1 > q0 + p.k_len - p.q_len);
        if (need_mask) mask_transposed_scores(p, st, group_k0 + key_row + g, q0, t, causal);
        std::uint32_t pa[NQ / 2][4], dsa[NQ / 2][4];
        // kDeltaInMain: BF16(P) packed after dS, so that it is not live across the delta's barriers
        form_probs<kPaper, NQ, !kDeltaInMain>(p, st, pa, s_lse, t);
        wgmma_wait<0>();
        fence_registers(dpt);
        if constexpr (kDeltaInMain) s_delta = exact_delta_of_block(i, st, dpt);
#pragma unroll
        for (int nq = 0; nq < NQ; ++nq) {
          float dsv[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) dsv[e] = dscore_of<kPaper>(p, st[nq][e], dpt[nq][e], s_delta[nq * 8 + 2 * t + (e & 1)]);
          dsa[nq / 2][(nq % 2) * 2 + 0] = pack_bf16x2(dsv[0], dsv[1]);
          dsa[nq / 2][(nq % 2) * 2 + 1] = pack_bf16x2(dsv[2], dsv[3]);
          if (nq % 2 == 1) store_ds_pair<DsTile>(s_ds_buf + cw * kDsTile, key_row, nq - 1, dsa[nq / 2], lane);  // dS^T for dQ
        }
        if constexpr (kDeltaInMain) pack_probs(st, pa);

        // ---- dV += BF16(P)^T dO, dK += BF16(dS)^T Q, then the previous block's dQ (its dS^T tiles
        // waited for first: a wait between the issues kept more registers live than the 240 allow)
        const bool dq_before = !kFirst && has_dq(i - 1);
        if (dq_before) wait_ds(i - 1);
        issue_dv_dk<D, BQ>(acc_dv, acc_dk, pa, dsa, s_do + dim_block, s_q + dim_block);
        // The dS^T stores are read by the dQ products (async proxy) after this arrival: fenced behind
        // the dV, dK issue, which reads none of them, so that the fence's wait for the stores runs
        // beside those products instead of before them.
        fence_proxy_async_smem();
        mbar_arrive(bars.ds_full((position + i) % Traits::kDsBuffers, cw));
        if (!kDeltaInMain && kFirst && cw == 0) named_barrier_arrive(Bars::kStagger, kConsumerThreads);  // consumer 1 may start
        float acc_dq[8][4];
        if (dq_before) issue_dq(i - 1, acc_dq);
        wgmma_wait_all();  // pa and dsa are read asynchronously: keep them until here
        fence_registers(pa);
        fence_registers(dsa);
        fence_registers(acc_dq);
        if (lane == 0) mbar_arrive(bars.free(slot));  // this warp no longer reads Q, dO and the rows of the slot
        if (!kFirst) hand_dq(i - 1, acc_dq);
      };
      if (n_walk > 0) walk_block(0, std::true_type{});
      for (int i = 1; i < n_walk; ++i) walk_block(i, std::false_type{});
      if (n_walk > 0) {  // the last block's dQ
        float acc_dq[8][4];
        if (has_dq(n_walk - 1)) {
          wait_ds(n_walk - 1);
          issue_dq(n_walk - 1, acc_dq);
        }
        wgmma_wait_all();
        fence_registers(acc_dq);
        hand_dq(n_walk - 1, acc_dq);
      }
    } else {
      for (int qb = qb_begin; qb < qb_end; ++qb) {
        const int i = qb - qb_begin, q0 = qb * BQ;
        const QuerySlot<kSlots> at(position + i);
        const int slot = at.slot;
        const std::uint32_t s_q = s_q0 + slot * kTile, s_do = s_do0 + slot * kTile;
        mbar_wait(bars.full(slot), at.use & 1);

        // ---- S^T = K Q^T and dP^T = V dO^T. Head dim 64: S^T in its own group, so that P is formed
        // while dP^T runs (+2-4% backward; at 128 it measured -2% to +1%, so there one group and P
        // after both products)
        float st[NQ][4], dpt[NQ][4];
        issue_scores_and_dprobs<D, kSplitScores>(st, dpt, s_k_group, s_q, s_v_group, s_do);
        wgmma_wait<kSplitScores ? 1 : 0>();  // S^T landed (with the split dP^T may still run)
        fence_registers(st);

        // ---- P, then dS, at the mode's rounding points (backward_common.cuh's element mapping):
        // element (nq, e) is key group_k0 + key_row + g + 8 (e / 2), query q0 + 8 nq + 2t + (e % 2).
        // P overwrites S^T in place.
        const float* s_lse = shared.rowvals[slot][0];
        const float* s_delta = shared.rowvals[slot][1];  // kDeltaInMain: replaced once dP^T has landed
        const bool need_mask = group_k0 + GK > p.k_len || (causal && group_k0 + GK - 1 > q0 + p.k_len - p.q_len);
        if (need_mask) mask_transposed_scores(p, st, group_k0 + key_row + g, q0, t, causal);
        std::uint32_t pa[NQ / 2][4], dsa[NQ / 2][4];
        // kDeltaInMain: BF16(P) packed after dS, so that it is not live across the delta's barriers
        form_probs<kPaper, NQ, !kDeltaInMain>(p, st, pa, s_lse, t);
        wgmma_wait<0>();
        fence_registers(dpt);
        if constexpr (kDeltaInMain) s_delta = exact_delta_of_block(i, st, dpt);
        const std::uint32_t s_ds_buf = ds_buffer(i);
#pragma unroll
        for (int nq = 0; nq < NQ; ++nq) {
          float dsv[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) dsv[e] = dscore_of<kPaper>(p, st[nq][e], dpt[nq][e], s_delta[nq * 8 + 2 * t + (e & 1)]);
          dsa[nq / 2][(nq % 2) * 2 + 0] = pack_bf16x2(dsv[0], dsv[1]);
          dsa[nq / 2][(nq % 2) * 2 + 1] = pack_bf16x2(dsv[2], dsv[3]);
          if (nq % 2 == 1) store_ds_pair<DsTile>(s_ds_buf + cw * kDsTile, key_row, nq - 1, dsa[nq / 2], lane);  // dS^T for dQ
        }
        if constexpr (kDeltaInMain) pack_probs(st, pa);

        // ---- dV += BF16(P)^T dO, dK += BF16(dS)^T Q
        issue_dv_dk<D, BQ>(acc_dv, acc_dk, pa, dsa, s_do + dim_block, s_q + dim_block);
        fence_proxy_async_smem();  // the dS^T stores are read by wgmma after the barrier below (fenced as above)
        named_barrier_sync(Bars::kDsStored, kConsumerThreads);  // dS^T tiles complete

        // ---- dQ part [64 queries, 64] = BF16(dS) K over the CTA's 128 keys (k-step kk: keys 16 kk..,
        // in consumer kk / 4's tiles): dims 64 cw.. (128), or all dims if this consumer owns the block (64)
        const bool has_dq = !kAlternate || (i & 1) == cw;
        const int dq_tile = kAlternate ? 0 : cw;  // 64-dim tile of the block
        float acc_dq[8][4];
        if (has_dq) {
          const Sw128Desc ds_mn(s_ds_buf, DsTile::kBlockBytes, 1024), k_mn(s_k + dq_tile * Tile::kBlockBytes, Tile::kBlockBytes, 1024);
          wgmma_fence();
#pragma unroll
          for (int kk = 0; kk < BK / 16; ++kk) {
            const std::uint32_t a = (kk / 4) * kDsTile + (kk % 4) * 2048;
            const std::uint32_t b = (kk / 4) * kTile + (kk % 4) * 2048;
            wgmma_ss<64, 1>(acc_dq, ds_mn.at(a), k_mn.at(b), kk > 0);
          }
          wgmma_commit();
        }
        wgmma_wait_all();  // pa and dsa are read asynchronously: keep them until here
        fence_registers(pa);
        fence_registers(dsa);
        fence_registers(acc_dq);
        if (lane == 0) mbar_arrive(bars.free(slot));  // this warp no longer reads Q, dO and the rows of the slot

        // ---- dQ part -> shared memory (fragment order), then to the workspace: by the reducing warp's
        // bulk reduction, or in key-block order (deterministic); with one key block to dq as BF16
        if constexpr (kDqDirect) {
          if (has_dq) store_dq_direct(i, acc_dq);
        } else if (!p.deterministic) {
          if (has_dq) {
            if (dq_stored > 0) named_barrier_sync(Bars::dq_empty(cw), Bars::kDqHandshake);  // the last tile was read
            store_dq_part(s_dq_group, acc_dq, tid);
            fence_proxy_async_smem();  // the copy engine reads the tile
            named_barrier_arrive(Bars::dq_full(cw), Bars::kDqHandshake);
            ++dq_stored;
          }
        } else {
          if (has_dq) {
            store_dq_part(s_dq_group, acc_dq, tid);
          }
          // key-block order: this CTA adds its whole [64, D] block (128: both consumers' tiles, which
          // are the block's two dim tiles in order; 64: the owning consumer's tile)
          float* dq_block = dq_head + std::int64_t(qb) * BQ * D;
          int* turn = p.dq_semaphore + ((std::int64_t(b) * p.heads + h) * n_qblocks + qb);
          const int ctid = threadIdx.x - 128;  // 0 .. kConsumerThreads
          wait_turn(turn, kb, ctid == 0, consumers_sync);  // its barrier: the dQ tiles are stored
          const float4* tiles = reinterpret_cast<const float4*>(shared.dq[kAlternate ? (i & 1) : 0]);
          float4* dst = reinterpret_cast<float4*>(dq_block);
          constexpr int kVecs = BQ * D / 4;
          // dq_first_store: key block 0 adds first into every block any key block reaches (a query
          // that sees a key sees key 0), so it adds to zero instead of reading the uncleared block
          const bool first = p.dq_first_store && kb == 0;
          for (int v = ctid; v < kVecs; v += kConsumerThreads) {
            const float4 add = tiles[v];
            float4 cur = first ? make_float4(0.0f, 0.0f, 0.0f, 0.0f) : __ldcg(dst + v);
            cur.x += add.x, cur.y += add.y, cur.z += add.z, cur.w += add.w;
            __stcg(dst + v, cur);
          }
          pass_turn(turn, kb + 1, ctid == 0, consumers_sync);  // its barrier also ends the reads of the dQ tiles
        }
      }
    }
    if (lane == 0) mbar_arrive(bars.kv_free());  // the last product reading K, V has completed
    fence_registers(acc_dk);
    fence_registers(acc_dv);

    store_dk_dv<kPaper>(p, b, h, group_k0 + key_row + g, t, acc_dk, acc_dv, dim0);
    position += kNextRound * (qb_end - qb_begin);
  }
}

}  // namespace stableflash::attention::cuda
