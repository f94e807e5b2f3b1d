// Flash-attention backward for sm_90a with warpgroup MMA (wgmma) and bulk tensor copies, in
// `fused` or `paper` numerics: the mma.sync kernel's algorithm (kernel lab, lab/backward_mma_kernel.cuh) with the five products on the
// tensor cores' asynchronous path. A CTA is two warpgroups owning 128 keys of one (b, h), 64 each
// (16 per warp, the m64 of a wgmma), and walks the query blocks of 64 that see them; the two
// warpgroups share each block's Q, dO, so every copy serves 128 keys. Per warpgroup and block:
//   S^T = K Q^T, dP^T = V dO^T        wgmma, A and B from shared memory (K-major)
//   P, dS (rounding points)           prob_of_score, dscore_of (backward_common.cuh) on the fragments;
//                                     at head dim 64 P while dP^T still runs
//   dV += P^T dO, dK += dS^T Q        wgmma, A = P^T / dS^T from registers, B = dO / Q (MN-major)
//   dQ                                wgmma, A = dS read as the transpose of the stored dS^T
//                                     tiles, B = K (both MN-major); see below
// dQ of a block is computed over all 128 keys (through both warpgroups' dS^T tiles) and split so
// that a warpgroup holds a [64 queries, 64] FP32 accumulator (32 registers): head dim 128 splits
// the dims (warpgroup w: dims 64w..), head dim 64 alternates blocks (warpgroup i % 2 computes
// block i's; the other goes on to the next block, which staggers the two). The accumulator goes to
// shared memory in fragment order and the copy engine adds the 16 KB tile into the FP32 workspace
// (one bulk reduction, asynchronous: no per-element atomics on the warps' path). Deterministic
// mode instead adds the CTA's block in key-block order (turn counters) with plain loads and stores.
// Thread 0 issues the copies: K and V once, Q and dO per query block into two slots, a slot
// reused once all eight warps arrived on its `free` barrier; each warpgroup loads its own lse and
// delta rows of the next block while the tensor cores compute S^T and dP^T.
#pragma once

#include <cstdint>

#include "backward_common.cuh"
#include "kernel_params.cuh"
#include "stableflash/attention/rounding_points.hpp"
#include "tma.cuh"
#include "warp_mma.cuh"
#include "wgmma.cuh"

namespace stableflash::attention::cuda {

template <int kHeadDim_, bool kPaper_>
struct WgmmaBackwardTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kPaper = kPaper_;
  static constexpr int kWarpgroups = 2;
  static constexpr int kThreads = 128 * kWarpgroups;
  static constexpr int kGroupKeys = 64;                      // keys per warpgroup (wgmma m64)
  static constexpr int kBlockK = kGroupKeys * kWarpgroups;  // keys per CTA (deterministic turns count these)
  static constexpr int kBlockQ = 64;  // queries per step (entry.cu sizes the dQ turn counters by it)
  static constexpr int kQueryTiles = kBlockQ / 8;
  static constexpr int kDimTiles = kHeadDim / 8;
  // dQ split: head dim 128 over dims, 64 over blocks (one warpgroup computes a block's whole dQ)
  static constexpr bool kDqAlternate = kHeadDim == 64;
  // S^T and dP^T in separate commit groups (P formed while dP^T runs): where it measured faster
  static constexpr bool kSplitScores = kHeadDim == 64;
  static constexpr int kTile = kGroupKeys * kHeadDim * 2;  // one [64, D] SW128 tile
  static constexpr int kDsTile = kGroupKeys * kBlockQ * 2;  // one warpgroup's dS^T [64 keys, 64 queries]
  // dS^T is read by both warpgroups' dQ products: double buffered, so that a warpgroup never waits
  // for the other's dQ product before writing the next block's tile
  static constexpr int kDsBuffers = 2;
  static constexpr int kDqTile = kBlockQ * 64 * 4;  // one warpgroup's FP32 dQ part
  // Shared memory. K, V (a [64, D] tile per warpgroup), Q and dO (two query-block slots) and dS^T
  // in the SW128 layout; the barriers: K/V, Q/dO full x2 (per slot), free x2.
  struct SharedStorage {
    std::uint16_t k[kWarpgroups][kGroupKeys * kHeadDim];
    std::uint16_t v[kWarpgroups][kGroupKeys * kHeadDim];
    std::uint16_t q[2][kBlockQ * kHeadDim];
    std::uint16_t d_o[2][kBlockQ * kHeadDim];
    std::uint16_t ds[kDsBuffers][kWarpgroups][kGroupKeys * kBlockQ];  // dS^T [64 keys, 64 queries]
    float dq[kWarpgroups][kBlockQ * 64];                             // fragment order (DqFragmentOrder)
    float rowvals[kWarpgroups * 2 * 2 * kBlockQ];                     // [group][slot][lse | delta][query]
    std::uint64_t barriers[5];
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

// A key warpgroup's per-block steps, shared with the kernel lab's dQ-warpgroup variant
// (lab/backward_dqwg_kernel.cuh). Element (nq, e) of st, dpt is key `key` + 8 (e / 2) of the
// group (key = its warp's 16 keys' first + g), query 8 nq + 2t + (e % 2) of the block. (The dS
// loop stays in each kernel: called as a function, it changed how ptxas schedules the D = 128
// kernel, which these helpers leave instruction for instruction as measured.)

// K and V of the CTA's 128 keys from k0 (two groups' [64, D] tiles each), on barrier bar
template <int D>
__device__ __forceinline__ void load_key_tiles(const BackwardParams& p, std::uint32_t s_k, std::uint32_t s_v, int k0, int kv_h, int b,
                                               std::uint32_t bar) {
  constexpr int kBoxBytes = 64 * 64 * 2, kBoxes = D / 64, kTile = 64 * D * 2;
  mbar_arrive_expect_tx(bar, 4 * kBoxes * kBoxBytes);
#pragma unroll
  for (int grp = 0; grp < 2; ++grp)
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

// lse and delta of query block qb (64 rows) for a group's thread `tid` (r < 64: lse of row r, else
// delta of row r - 64); rows past Tq get lse = +inf so P = 0 there. The kernels fetch them a block
// ahead and stash them in shared memory later, so the load's latency hides behind the products.
__device__ __forceinline__ float fetch_rowval(const BackwardParams& p, std::int64_t row_base, int qb, int tid) {
  const int q = qb * 64 + tid % 64;
  if (tid < 64) return q < p.q_len ? p.lse[row_base + q] : __builtin_huge_valf();
  return q < p.q_len ? p.delta[row_base + q] : 0.0f;
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

// P at the mode's rounding points, in place of S^T (masked scores already -inf), and BF16(P) as
// the A fragments of dV += P^T dO
template <bool kPaper, int NQ>
__device__ __forceinline__ void form_probs(const BackwardParams& p, float (&st)[NQ][4], std::uint32_t (&pa)[NQ / 2][4],
                                           const float* s_lse, int t) {
#pragma unroll
  for (int nq = 0; nq < NQ; ++nq) {
#pragma unroll
    for (int e = 0; e < 4; ++e) st[nq][e] = prob_of_score<kPaper>(p, st[nq][e], s_lse[nq * 8 + 2 * t + (e & 1)]);
    pa[nq / 2][(nq % 2) * 2 + 0] = pack_bf16x2(st[nq][0], st[nq][1]);
    pa[nq / 2][(nq % 2) * 2 + 1] = pack_bf16x2(st[nq][2], st[nq][3]);
  }
}

// dV += BF16(P)^T dO, dK += BF16(dS)^T Q, one commit group (B MN-major: 16 queries step 2048 bytes)
template <int D, int BQ, int DT>
__device__ __forceinline__ void issue_dv_dk(float (&acc_dv)[DT][4], float (&acc_dk)[DT][4], const std::uint32_t (&pa)[BQ / 16][4],
                                            const std::uint32_t (&dsa)[BQ / 16][4], std::uint32_t s_do, std::uint32_t s_q) {
  using Tile = WgmmaTile<64, D>;
  const Sw128Desc do_mn(s_do, Tile::kBlockBytes, 1024), q_mn(s_q, Tile::kBlockBytes, 1024);
  wgmma_fence();
#pragma unroll
  for (int kq = 0; kq < BQ / 16; ++kq) {
    wgmma_pv<D>(acc_dv, pa[kq], do_mn.at(kq * 2048));
    wgmma_pv<D>(acc_dk, dsa[kq], q_mn.at(kq * 2048));
  }
  wgmma_commit();
}

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    attention_backward_wgmma_kernel(const __grid_constant__ BackwardParams p) {
  constexpr int D = Traits::kHeadDim, BQ = Traits::kBlockQ, BK = Traits::kBlockK, GK = Traits::kGroupKeys;
  constexpr int NQ = Traits::kQueryTiles, DT = Traits::kDimTiles;
  constexpr bool kPaper = Traits::kPaper, kAlternate = Traits::kDqAlternate, kSplitScores = Traits::kSplitScores;
  constexpr int kTile = Traits::kTile, kDsTile = Traits::kDsTile;
  using Tile = WgmmaTile<64, D>;
  using DsTile = WgmmaTile<64, 64>;

  extern __shared__ __align__(1024) unsigned char smem[];
  auto& shared = *reinterpret_cast<typename Traits::SharedStorage*>(smem);
  const std::uint32_t s_k = smem_u32(shared.k), s_v = smem_u32(shared.v), s_q0 = smem_u32(shared.q), s_do0 = smem_u32(shared.d_o);
  const std::uint32_t s_ds = smem_u32(shared.ds), s_dq = smem_u32(shared.dq);
  const std::uint32_t bar_kv = smem_u32(shared.barriers);
  auto bar_full = [&](int slot) { return bar_kv + 8 * (1 + slot); };  // Q and dO of a slot arrived
  auto bar_free = [&](int slot) { return bar_kv + 8 * (3 + slot); };  // every warp is done with a slot

  const bool causal = p.causal != 0;
  int kb, pair;
  BackwardCtaOrder(blocks_of(p.k_len, BK), p.batch * p.heads, causal).decode(blockIdx.x, kb, pair);
  const int b = pair / p.heads, h = pair % p.heads, k0 = kb * BK;
  const int kv_h = h / p.kv_group;  // grouped-query heads share K/V
  // The warpgroup index broadcast from lane 0: the compiler then knows it is warp-uniform and keeps
  // the shared-memory addresses derived from it (wgmma descriptors) in uniform registers instead of
  // moving them over (R2UR) before every product (CUTLASS's canonical_warp_group_idx does the same).
  const int wg = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0), tid = threadIdx.x % 128;
  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int group_k0 = k0 + wg * GK;  // this warpgroup's first key
  const std::int64_t row_base = (std::int64_t(b) * p.heads + h) * p.q_len;
  const int first_query = causal ? max(0, k0 - (p.k_len - p.q_len)) : 0;
  const int qb_begin = first_query / BQ, qb_end = DqFragmentOrder::blocks(p.q_len);  // BQ: its kBlockQ
  constexpr int kDsBarrier = 1;  // both groups' dS^T tiles stored (named barrier, whole CTA)
  const int dq_bar_id = 2 + wg;  // a group's dQ tile stored

  auto issue_query_block = [&](int qb, int slot) {
    load_query_block<D>(p, s_q0 + slot * kTile, s_do0 + slot * kTile, qb, h, b, bar_full(slot));
  };
  auto fetch_rowval = [&](int qb) { return cuda::fetch_rowval(p, row_base, qb, tid); };  // a block ahead of its stash
  auto stash_rowval = [&](int slot, float v) { shared.rowvals[(wg * 2 + slot) * 2 * BQ + tid] = v; };

  if (threadIdx.x == 0) {
    mbar_init(bar_kv, 1);
    mbar_init(bar_full(0), 1), mbar_init(bar_full(1), 1);
    mbar_init(bar_free(0), 8), mbar_init(bar_free(1), 8);
    mbar_fence_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {  // inputs the delta pass before this kernel does not write
    load_key_tiles<D>(p, s_k, s_v, k0, kv_h, b, bar_kv);
    if (qb_begin < qb_end) issue_query_block(qb_begin, 0);
  }
  // Launched as the delta pass's programmatic dependent (launch_after_previous): delta, the zeroed
  // dQ workspace and turn counters are read or written only after this wait.
  grid_dependency_wait();
  allow_dependent_launch();  // the dQ conversion's CTAs may start once every CTA here has (they wait too)
  if (qb_begin < qb_end) stash_rowval(0, fetch_rowval(qb_begin));
  __syncthreads();  // the stashed rows are read by other threads of the group

  float acc_dk[DT][4], acc_dv[DT][4];  // this warp's 16 keys x D
#pragma unroll
  for (int nd = 0; nd < DT; ++nd)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_dk[nd][e] = acc_dv[nd][e] = 0.0f;
  mbar_wait(bar_kv, 0);

  const std::uint32_t s_k_group = s_k + wg * kTile, s_v_group = s_v + wg * kTile;
  const std::uint32_t s_dq_group = s_dq + wg * Traits::kDqTile;
  const int key_row = warp * 16;
  const int n_qblocks = DqFragmentOrder::blocks(p.q_len);
  float* dq_head = p.dq_accum + (std::int64_t(b) * p.heads + h) * n_qblocks * BQ * D;  // fragment order
  for (int qb = qb_begin; qb < qb_end; ++qb) {
    const int i = qb - qb_begin, slot = i & 1, q0 = qb * BQ;
    const std::uint32_t s_q = s_q0 + slot * kTile, s_do = s_do0 + slot * kTile;
    mbar_wait(bar_full(slot), (i >> 1) & 1);

    // ---- S^T = K Q^T and dP^T = V dO^T. Head dim 64: S^T in its own group, so that P is formed
    // while dP^T runs (+2-4% backward; at 128 it measured -2% to +1%, so there one group and P
    // after both products)
    float st[NQ][4], dpt[NQ][4];
    issue_scores_and_dprobs<D, kSplitScores>(st, dpt, s_k_group, s_q, s_v_group, s_do);
    // while the tensor cores work: the next block's rows, and its copies once every warp is done
    // with the slot they overwrite (block i - 1's)
    const float next_rowval = qb + 1 < qb_end ? fetch_rowval(qb + 1) : 0.0f;
    if (qb + 1 < qb_end) {
      if (threadIdx.x == 0) {
        if (i >= 1) mbar_wait(bar_free(slot ^ 1), ((i - 1) >> 1) & 1);
        issue_query_block(qb + 1, slot ^ 1);
      }
    }
    wgmma_wait<kSplitScores ? 1 : 0>();  // S^T landed (with the split dP^T may still run)
    fence_registers(st);

    // ---- P, then dS, at the mode's rounding points (backward_common.cuh's element mapping):
    // element (nq, e) is key group_k0 + key_row + g + 8 (e / 2), query q0 + 8 nq + 2t + (e % 2).
    // P overwrites S^T in place.
    const float* s_lse = shared.rowvals + (wg * 2 + slot) * 2 * BQ;
    const float* s_delta = s_lse + BQ;
    const bool need_mask = group_k0 + GK > p.k_len || (causal && group_k0 + GK - 1 > q0 + p.k_len - p.q_len);
    if (need_mask) mask_transposed_scores(p, st, group_k0 + key_row + g, q0, t, causal);
    std::uint32_t pa[NQ / 2][4], dsa[NQ / 2][4];
    form_probs<kPaper>(p, st, pa, s_lse, t);
    wgmma_wait<0>();
    fence_registers(dpt);
    const std::uint32_t s_ds_buf = s_ds + slot * 2 * kDsTile;
#pragma unroll
    for (int nq = 0; nq < NQ; ++nq) {
      float dsv[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) dsv[e] = dscore_of<kPaper>(p, st[nq][e], dpt[nq][e], s_delta[nq * 8 + 2 * t + (e & 1)]);
      dsa[nq / 2][(nq % 2) * 2 + 0] = pack_bf16x2(dsv[0], dsv[1]);
      dsa[nq / 2][(nq % 2) * 2 + 1] = pack_bf16x2(dsv[2], dsv[3]);
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {  // dS^T [key][query] for dQ, in the SW128 layout
        const std::uint32_t addr = s_ds_buf + wg * kDsTile + DsTile::offset(key_row + g + 8 * hf, nq) + 4 * t;
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(dsa[nq / 2][(nq % 2) * 2 + hf]));
      }
    }
    fence_proxy_async_smem();  // the dS^T stores are read by wgmma after the barrier below

    // ---- dV += BF16(P)^T dO, dK += BF16(dS)^T Q
    issue_dv_dk<D, BQ>(acc_dv, acc_dk, pa, dsa, s_do, s_q);
    // the previous block's dQ reduction has read this group's dQ tile before anyone rewrites it
    if (tid == 0) bulk_wait_group_read<0>();
    if (qb + 1 < qb_end) stash_rowval(slot ^ 1, next_rowval);  // read after the next block's barriers
    named_barrier_sync(kDsBarrier, Traits::kThreads);  // dS^T tiles complete

    // ---- dQ part [64 queries, 64] = BF16(dS) K over the CTA's 128 keys (k-step kk: keys 16 kk..,
    // in group kk / 4's tiles): dims 64 wg.. (128), or all dims if this group owns the block (64)
    const bool has_dq = !kAlternate || (i & 1) == wg;
    const int dq_tile = kAlternate ? 0 : wg;  // 64-dim tile of the block
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
    if (lane == 0) mbar_arrive(bar_free(slot));  // this warp no longer reads Q/dO of the slot

    // ---- dQ part -> shared memory (fragment order), then one bulk FP32 reduction into the workspace
    if (has_dq) {
#pragma unroll
      for (int j = 0; j < 8; ++j)
        asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(s_dq_group + (j * 128 + tid) * 16), "f"(acc_dq[j][0]),
                     "f"(acc_dq[j][1]), "f"(acc_dq[j][2]), "f"(acc_dq[j][3])
                     : "memory");
    }
    float* dq_block = dq_head + std::int64_t(qb) * BQ * D;
    if (!p.deterministic) {
      if (has_dq) {
        fence_proxy_async_smem();  // the copy engine reads the tile
        named_barrier_sync(dq_bar_id, 128);
        if (tid == 0) {
          bulk_reduce_add_f32(dq_block + dq_tile * DqFragmentOrder::kTileFloats, s_dq_group, Traits::kDqTile);
          bulk_commit_group();
        }
      }
    } else {
      // key-block order: this CTA adds its whole [64, D] block (128: both groups' tiles, which are
      // the block's two dim tiles in order; 64: the owning group's tile)
      int* turn = p.dq_semaphore + ((std::int64_t(b) * p.heads + h) * n_qblocks + qb);
      wait_turn(turn, kb);  // includes a CTA barrier: the dQ tiles are stored
      const float4* tiles = reinterpret_cast<const float4*>(shared.dq[kAlternate ? (i & 1) : 0]);
      float4* dst = reinterpret_cast<float4*>(dq_block);
      constexpr int kVecs = BQ * D / 4;
      for (int v = threadIdx.x; v < kVecs; v += Traits::kThreads) {
        const float4 add = tiles[v];
        float4 cur = __ldcg(dst + v);
        cur.x += add.x, cur.y += add.y, cur.z += add.z, cur.w += add.w;
        __stcg(dst + v, cur);
      }
      pass_turn(turn, kb + 1);  // its CTA barrier also ends the reads of the dQ tiles
    }
  }
  if (tid == 0) bulk_wait_group<0>();  // the last reduction is done before the CTA's memory goes
  fence_registers(acc_dk);
  fence_registers(acc_dv);

  store_dk_dv<kPaper>(p, b, h, group_k0 + key_row + g, t, acc_dk, acc_dv);
}

}  // namespace stableflash::attention::cuda
