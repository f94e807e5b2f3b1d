// Kernel lab: the wgmma backward with a third warpgroup for dQ (`kernel_lab --backward-kernel
// wgmma-dqwg`; docs/benchmarks.md, "Where the backward's time goes now": measured on the H200 at
// D = 64, within the runs' spread of the production kernel of then).
//
// Written against the production kernel of the time (backward_wgmma_kernel.cuh), whose two
// warpgroups met at a CTA barrier every query block: the dQ product of each reads the other's dS^T
// tile, so both formed P and dS at the same time and the tensor cores idled meanwhile (production
// has since taken a producer warpgroup, and at D = 128 issues dQ a block late). Here warpgroups 0
// and 1 compute S^T, dP^T, P, dS, dV and dK of their 64 keys as there, store dS^T and go on;
// warpgroup 2 computes each block's whole dQ = dS K from the two stored tiles and adds it to the
// FP32 workspace (the production kernel's fragment order and bulk reduction, so the production dQ
// conversion follows). Its thread 0 also issues the Q, dO copies. Per block the groups meet only
// through mbarriers:
//   full[slot]     Q, dO of the slot landed (transaction count)        waited by groups 0, 1
//   free[slot]     groups 0, 1 are done with the slot (8 warps)         waited by group 2's thread 0
//   ds_full[slot]  both dS^T tiles of the slot stored (8 warps)          waited by group 2
//   ds_empty[slot] group 2's dQ product has read them (4 warps)          waited by groups 0, 1
// Registers (setmaxnreg): kComputeRegisters for groups 0, 1, kDqRegisters for group 2. ptxas
// (CUDA 13.0) spills here at D = 128 whatever the split of the 504 registers a thread slot (208 /
// 88: 384 bytes; 200 / 104: 444; 224 / 56: 824): the key groups hold dK and dV (128 registers)
// beside S^T, dP^T, P and dS, so a third warpgroup does not fit at D = 128 as written. D = 64
// compiles without spills. Fused and
// paper numerics as production (the same P and dS expressions, in the same order); deterministic
// mode is not built (the lab refuses it).
#pragma once

#include <cstdint>
#include "backward_common.cuh"
#include "backward_wgmma_kernel.cuh"  // BackwardCtaOrder
#include "kernel_params.cuh"
#include "tma.cuh"
#include "warpgroup_registers.cuh"
#include "wgmma.cuh"

namespace stableflash::attention::cuda::lab {

// lse and delta of query block qb (64 rows) for a group's thread `tid` (r < 64: lse of row r, else
// delta of row r - 64); rows past Tq get lse = +inf so P = 0 there. Fetched a block ahead and
// stashed in shared memory later, so the load's latency hides behind the products (the production
// kernel's producer warp loads them instead: produce_row_values).
__device__ __forceinline__ float fetch_rowval(const BackwardParams& p, std::int64_t row_base, int qb, int tid) {
  const int q = qb * 64 + tid % 64;
  if (tid < 64) return q < p.q_len ? p.lse[row_base + q] : __builtin_huge_valf();
  return q < p.q_len ? p.delta[row_base + q] : 0.0f;
}


template <int kHeadDim_, bool kPaper_>
struct DqWarpgroupBackwardTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kPaper = kPaper_;
  static constexpr int kThreads = 384;  // groups 0, 1: keys; group 2: dQ and the copies
  static constexpr int kGroupKeys = 64;
  static constexpr int kBlockK = 128;
  static constexpr int kBlockQ = 64;
  static constexpr int kQueryTiles = kBlockQ / 8;
  static constexpr int kDimTiles = kHeadDim / 8;
  static constexpr int kDqTiles = kHeadDim / 64;  // [64 queries, 64 dims] FP32 tiles of a block's dQ
  static constexpr bool kSplitScores = kHeadDim == 64;  // as production (WgmmaBackwardTraits)
  static constexpr int kTile = kGroupKeys * kHeadDim * 2;
  static constexpr int kDsTile = kGroupKeys * kBlockQ * 2;
  static constexpr int kDqTile = kBlockQ * 64 * 4;
  // 208 + 208 + 88 = 3 x 168, what the launch gives 384 threads (cta_start_registers)
  static constexpr int kComputeRegisters = 208;
  static constexpr int kDqRegisters = 88;
  struct SharedStorage {
    std::uint16_t k[2][kGroupKeys * kHeadDim];
    std::uint16_t v[2][kGroupKeys * kHeadDim];
    std::uint16_t q[2][kBlockQ * kHeadDim];
    std::uint16_t d_o[2][kBlockQ * kHeadDim];
    std::uint16_t ds[2][2][kGroupKeys * kBlockQ];  // [slot][group] dS^T [64 keys, 64 queries]
    float dq[kDqTiles][kBlockQ * 64];              // fragment order (DqFragmentOrder)
    float rowvals[2 * 2 * 2 * kBlockQ];            // [group][slot][lse | delta][query]
    std::uint64_t barriers[9];                     // kv, full x2, free x2, ds_full x2, ds_empty x2
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage);
  static_assert(offsetof(SharedStorage, q) % 1024 == 0 && offsetof(SharedStorage, ds) % 1024 == 0 && kTile % 1024 == 0,
                "SW128 atoms are 1024-byte aligned");
  static_assert(2 * kComputeRegisters + kDqRegisters <= 3 * cta_start_registers(kThreads), "setmaxnreg moves registers, adds none");
  static_assert(kSmemBytes <= 227 * 1024, "fits one CTA per SM");
};

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    attention_backward_dqwg_kernel(const __grid_constant__ BackwardParams p) {
  constexpr int D = Traits::kHeadDim, BQ = Traits::kBlockQ, BK = Traits::kBlockK, GK = Traits::kGroupKeys;
  constexpr int NQ = Traits::kQueryTiles, DT = Traits::kDimTiles, kDqTiles = Traits::kDqTiles;
  constexpr bool kPaper = Traits::kPaper, kSplitScores = Traits::kSplitScores;
  constexpr int kTile = Traits::kTile, kDsTile = Traits::kDsTile;
  using Tile = WgmmaTile<64, D>;
  using DsTile = WgmmaTile<64, 64>;

  extern __shared__ __align__(1024) unsigned char smem[];
  auto& shared = *reinterpret_cast<typename Traits::SharedStorage*>(smem);
  const std::uint32_t s_k = smem_u32(shared.k), s_v = smem_u32(shared.v), s_q0 = smem_u32(shared.q), s_do0 = smem_u32(shared.d_o);
  const std::uint32_t s_ds = smem_u32(shared.ds), s_dq = smem_u32(shared.dq);
  const std::uint32_t bar_kv = smem_u32(shared.barriers);
  auto bar_full = [&](int slot) { return bar_kv + 8 * (1 + slot); };
  auto bar_free = [&](int slot) { return bar_kv + 8 * (3 + slot); };
  auto bar_ds_full = [&](int slot) { return bar_kv + 8 * (5 + slot); };
  auto bar_ds_empty = [&](int slot) { return bar_kv + 8 * (7 + slot); };

  const bool causal = p.causal != 0;
  int kb, pair;
  BackwardCtaOrder(blocks_of(p.k_len, BK), p.batch * p.heads, causal).decode(blockIdx.x, kb, pair);
  const int b = pair / p.heads, h = pair % p.heads, k0 = kb * BK;
  const int kv_h = h / p.kv_group;
  const int wg = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0), tid = threadIdx.x % 128;
  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const std::int64_t row_base = (std::int64_t(b) * p.heads + h) * p.q_len;
  const int first_query = causal ? max(0, k0 - (p.k_len - p.q_len)) : 0;
  const int qb_begin = first_query / BQ, qb_end = DqFragmentOrder::blocks(p.q_len);
  constexpr int kDqGroupBarrier = 3;  // group 2's threads (named barrier); groups 0, 1 use 1 + wg

  auto issue_query_block = [&](int qb, int slot) {
    load_query_block<D>(p, s_q0 + slot * kTile, s_do0 + slot * kTile, qb, h, b, bar_full(slot));
  };

  if (threadIdx.x == 0) {
    mbar_init(bar_kv, 1);
    for (int s = 0; s < 2; ++s) {
      mbar_init(bar_full(s), 1), mbar_init(bar_free(s), 8);
      mbar_init(bar_ds_full(s), 8), mbar_init(bar_ds_empty(s), 4);
    }
    mbar_fence_init();
  }
  __syncthreads();
  if (threadIdx.x == 256) {  // group 2's thread 0: K, V and the first block (inputs the delta pass does not write)
    load_key_tiles<D>(p, s_k, s_v, k0, kv_h, b, bar_kv);
    if (qb_begin < qb_end) issue_query_block(qb_begin, 0);
  }
  grid_dependency_wait();
  allow_dependent_launch();
  const int n_qblocks = DqFragmentOrder::blocks(p.q_len);
  float* dq_head = p.dq_accum + (std::int64_t(b) * p.heads + h) * n_qblocks * BQ * D;  // fragment order

  if (wg == 2) {
    // ---- group 2: per block the next block's copies (thread 0), then the block's dQ
    release_registers<Traits::kDqRegisters>();
    mbar_wait(bar_kv, 0);
    for (int qb = qb_begin; qb < qb_end; ++qb) {
      const int i = qb - qb_begin, slot = i & 1;
      if (tid == 0 && qb + 1 < qb_end) {
        if (i >= 1) mbar_wait(bar_free(slot ^ 1), ((i - 1) >> 1) & 1);
        issue_query_block(qb + 1, slot ^ 1);
      }
      __syncwarp();
      mbar_wait(bar_ds_full(slot), (i >> 1) & 1);
      // the previous block's reductions have read the staging tiles
      if (tid == 0) bulk_wait_group_read<0>();
      named_barrier_sync(kDqGroupBarrier, 128);
      // dQ [64 queries, D] = BF16(dS) K over the CTA's 128 keys (k-step kk: keys 16 kk.., in group
      // kk / 4's tiles), one [64, 64] tile of dims at a time (32 accumulator registers), each staged
      // in fragment order as soon as it is complete
      const std::uint32_t s_ds_buf = s_ds + slot * 2 * kDsTile;
      const Sw128Desc ds_mn(s_ds_buf, DsTile::kBlockBytes, 1024);
#pragma unroll
      for (int dt = 0; dt < kDqTiles; ++dt) {
        const Sw128Desc k_mn(s_k + dt * Tile::kBlockBytes, Tile::kBlockBytes, 1024);
        float acc_dq[8][4];
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
          const std::uint32_t a = (kk / 4) * kDsTile + (kk % 4) * 2048;
          const std::uint32_t bo = (kk / 4) * kTile + (kk % 4) * 2048;
          wgmma_ss<64, 1>(acc_dq, ds_mn.at(a), k_mn.at(bo), kk > 0);
        }
        wgmma_commit();
        wgmma_wait_all();
        fence_registers(acc_dq);
#pragma unroll
        for (int j = 0; j < 8; ++j)
          asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(s_dq + dt * Traits::kDqTile + (j * 128 + tid) * 16),
                       "f"(acc_dq[j][0]), "f"(acc_dq[j][1]), "f"(acc_dq[j][2]), "f"(acc_dq[j][3])
                       : "memory");
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(bar_ds_empty(slot));  // this warp's products no longer read the slot's dS^T
      fence_proxy_async_smem();
      named_barrier_sync(kDqGroupBarrier, 128);
      if (tid == 0) {
        float* dq_block = dq_head + std::int64_t(qb) * BQ * D;
#pragma unroll
        for (int dt = 0; dt < kDqTiles; ++dt)
          bulk_reduce_add_f32(dq_block + dt * DqFragmentOrder::kTileFloats, s_dq + dt * Traits::kDqTile, Traits::kDqTile);
        bulk_commit_group();
      }
    }
    if (tid == 0) bulk_wait_group<0>();  // the last reductions are done before the CTA's memory goes
    return;
  }

  // ---- groups 0 and 1: 64 keys each
  claim_registers<Traits::kComputeRegisters>();
  const int group_k0 = k0 + wg * GK;
  const int group_barrier = 1 + wg;  // this group's 128 threads
  auto fetch_rowval = [&](int qb) { return lab::fetch_rowval(p, row_base, qb, tid); };
  auto stash_rowval = [&](int slot, float v) { shared.rowvals[(wg * 2 + slot) * 2 * BQ + tid] = v; };
  if (qb_begin < qb_end) stash_rowval(0, fetch_rowval(qb_begin));
  named_barrier_sync(group_barrier, 128);  // the stashed rows are read by other threads of the group

  float acc_dk[DT][4], acc_dv[DT][4];
#pragma unroll
  for (int nd = 0; nd < DT; ++nd)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_dk[nd][e] = acc_dv[nd][e] = 0.0f;
  mbar_wait(bar_kv, 0);

  const std::uint32_t s_k_group = s_k + wg * kTile, s_v_group = s_v + wg * kTile;
  const int key_row = warp * 16;
  for (int qb = qb_begin; qb < qb_end; ++qb) {
    const int i = qb - qb_begin, slot = i & 1, q0 = qb * BQ;
    const std::uint32_t s_q = s_q0 + slot * kTile, s_do = s_do0 + slot * kTile;
    mbar_wait(bar_full(slot), (i >> 1) & 1);

    float st[NQ][4], dpt[NQ][4];
    issue_scores_and_dprobs<D, kSplitScores>(st, dpt, s_k_group, s_q, s_v_group, s_do);
    const float next_rowval = qb + 1 < qb_end ? fetch_rowval(qb + 1) : 0.0f;
    wgmma_wait<kSplitScores ? 1 : 0>();
    fence_registers(st);

    // P, then dS (production's helpers, expressions and order: backward_wgmma_kernel.cuh)
    const float* s_lse = shared.rowvals + (wg * 2 + slot) * 2 * BQ;
    const float* s_delta = s_lse + BQ;
    const bool need_mask = group_k0 + GK > p.k_len || (causal && group_k0 + GK - 1 > q0 + p.k_len - p.q_len);
    if (need_mask) mask_transposed_scores(p, st, group_k0 + key_row + g, q0, t, causal);
    std::uint32_t pa[NQ / 2][4], dsa[NQ / 2][4];
    form_probs<kPaper>(p, st, pa, s_lse, t);
    wgmma_wait<0>();
    fence_registers(dpt);
    // the slot's dS^T buffer was last read by group 2's dQ product of block i - 2
    if (i >= 2) mbar_wait(bar_ds_empty(slot), ((i - 2) >> 1) & 1);
    const std::uint32_t s_ds_tile = s_ds + (slot * 2 + wg) * kDsTile;
#pragma unroll
    for (int nq = 0; nq < NQ; ++nq) {
      float dsv[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) dsv[e] = dscore_of<kPaper>(p, st[nq][e], dpt[nq][e], s_delta[nq * 8 + 2 * t + (e & 1)]);
      dsa[nq / 2][(nq % 2) * 2 + 0] = pack_bf16x2(dsv[0], dsv[1]);
      dsa[nq / 2][(nq % 2) * 2 + 1] = pack_bf16x2(dsv[2], dsv[3]);
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const std::uint32_t addr = s_ds_tile + DsTile::offset(key_row + g + 8 * hf, nq) + 4 * t;
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(dsa[nq / 2][(nq % 2) * 2 + hf]));
      }
    }
    fence_proxy_async_smem();  // group 2's wgmma reads the tile after ds_full
    __syncwarp();
    if (lane == 0) mbar_arrive(bar_ds_full(slot));

    issue_dv_dk<D, BQ>(acc_dv, acc_dk, pa, dsa, s_do, s_q);
    if (qb + 1 < qb_end) stash_rowval(slot ^ 1, next_rowval);
    wgmma_wait_all();
    fence_registers(pa);
    fence_registers(dsa);
    if (lane == 0) mbar_arrive(bar_free(slot));  // this warp no longer reads Q/dO of the slot
    // the next block's rows stashed by every thread of the group, this block's read by all
    named_barrier_sync(group_barrier, 128);
  }
  fence_registers(acc_dk);
  fence_registers(acc_dv);
  store_dk_dv<kPaper>(p, b, h, group_k0 + key_row + g, t, acc_dk, acc_dv);
}

}  // namespace stableflash::attention::cuda::lab
