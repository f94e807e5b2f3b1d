// Flash-attention forward for sm_90a with warpgroup MMA (wgmma.mma_async, wgmma.cuh), in `fused`
// or `paper` numerics (Traits::kPaper) with any shift policy (template parameter). The key walk,
// the per-row softmax state and every rounding point are forward_kernel.cuh's (ForwardRows); only
// the two products differ: S = Q K^T with both operands read by the tensor cores from shared
// memory, and O += P V with P from registers, one m64 instruction per 16 keys for the whole
// warpgroup instead of 2 x D/8 mma.sync per warp.
//
// A CTA is one warpgroup owning 64 query rows of one (b, h), 16 per warp, so every per-row
// quantity (max, shift, sums) lives in the four threads of a quad. Keys are walked in
// sub-tiles of 64, K and V double buffered with cp.async. The numerics' key tile (tile_k, a
// multiple of 64; numerics.md: rounding and tie detection are per tile) groups sub-tiles into
// "shift units": every sub-tile of a unit uses one shift m. When a unit spans several sub-tiles
// and its m needs the whole unit's maximum (always in `paper`; the published policy's tie count in
// `fused`), a pre-pass over the unit's keys computes S once more to find it: the kernel never
// holds more than one 64-key S tile. Every rounding point comes from rounding_points.hpp and the
// shift from shift_policies.hpp, the very code the CPU oracle runs.
#pragma once

#include <cstdint>
#include <type_traits>

#include "forward_rows.cuh"
#include "kernel_params.cuh"
#include "tma.cuh"
#include "warp_mma.cuh"
#include "wgmma.cuh"

namespace stableflash::attention::cuda {

template <class Traits, class Policy>
__global__ void __launch_bounds__(Traits::kThreads, Traits::kMinBlocks) attention_forward_wgmma_kernel(const __grid_constant__ ForwardParams p) {
  constexpr int D = Traits::kHeadDim, BQ = Traits::kBlockQ, BK = Traits::kBlockK;
  constexpr int MR = Traits::kRowTiles, NT = Traits::kKeyTiles, DT = Traits::kDimTiles;
  constexpr bool kPaper = Traits::kPaper;
  constexpr bool kMultiPass = kPaper || Policy::needs_near_max_count;
  using Rows = ForwardRows<Traits, Policy>;
  static_assert(MR == 1 && BQ == 64 && Traits::kThreads == 128, "one warpgroup, 16 rows per warp");
  static_assert(Traits::kSmemQ % 1024 == 0 && Traits::kSmemKV % 1024 == 0, "SW128 atoms are 1024-byte aligned");

  extern __shared__ __align__(1024) unsigned char smem[];
  const std::uint32_t s_q = smem_u32(smem);
  const std::uint32_t s_k0 = s_q + Traits::kSmemQ, s_v0 = s_k0 + 2 * Traits::kSmemKV;

  // Causal rows late in the sequence see the most keys: launch those blocks first so the last
  // wave is made of short ones.
  const int b = blockIdx.z, h = blockIdx.y, m0 = (p.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * BQ;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t = lane % 4;
  (void)NT, (void)DT;
  const bool causal = p.causal != 0;

  auto* events = reinterpret_cast<typename Rows::Events*>(smem + Traits::kSmemQ + 4 * Traits::kSmemKV);
  auto* top = reinterpret_cast<float*>(smem + Traits::kSmemQ + 4 * Traits::kSmemKV + Traits::kSmemEvents);
  Rows rows(p, events, top, b, h, m0 + warp * 16 * MR + lane / 4, warp * 16 * MR + lane / 4);
  const int cta_last_row = min(m0 + BQ, p.q_len) - 1;
  const int n_keys = max(0, last_key(cta_last_row, p.q_len, p.k_len, causal) + 1);  // keys some row sees
  const int min_last = last_key(m0, p.q_len, p.k_len, causal);  // sub-tiles reaching past it are masked
  // Diagnostics runs (event counters) also walk whole numerics tiles with one m each, so their
  // tie counts mean what the CPU's mean; the fast path decides m per 64-key sub-tile.
  const bool multi_pass = kMultiPass || p.counters != nullptr;
  const int unit = multi_pass ? p.tile_k : BK;
  const KeyWalk walk{n_keys, unit, unit / BK, multi_pass};
  const int total = walk.total_steps();

  // Bulk tensor copies issued by thread 0, one 64 x 64 box per 64 columns of a tile; every thread
  // waits on the buffer's barrier. Barrier 0: Q; 1 + (s & 1): step s's K (and V).
  const std::uint32_t bars = s_q + Traits::kSmemQ + 4 * Traits::kSmemKV + Traits::kSmemEvents + Traits::kSmemTop;
  constexpr int kBoxBytes = 64 * 64 * 2, kBoxes = D / 64;
  auto issue_loads = [&](int s) {
    const KeyStep st = walk.at(s);
    const std::uint32_t bar = bars + 8 * (1 + (s & 1));
    mbar_arrive_expect_tx(bar, (st.main ? 2 : 1) * kBoxes * kBoxBytes);
#pragma unroll
    for (int x = 0; x < kBoxes; ++x) {
      tma_load_4d(s_k0 + (s & 1) * Traits::kSmemKV + x * kBoxBytes, &p.tma_k, 64 * x, st.key0, h, b, bar);
      if (st.main) tma_load_4d(s_v0 + (s & 1) * Traits::kSmemKV + x * kBoxBytes, &p.tma_v, 64 * x, st.key0, h, b, bar);
    }
  };
  if (threadIdx.x == 0) {
#pragma unroll
    for (int i = 0; i < 3; ++i) mbar_init(bars + 8 * i, 1);
    mbar_fence_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbar_arrive_expect_tx(bars, kBoxes * kBoxBytes);
#pragma unroll
    for (int x = 0; x < kBoxes; ++x) tma_load_4d(s_q + x * kBoxBytes, &p.tma_q, 64 * x, m0, h, b, bars);
    if (total > 0) issue_loads(0);
  }
  mbar_wait(bars, 0);

  for (int s = 0; s < total; ++s) {
    const KeyStep st = walk.at(s);
    if (threadIdx.x == 0 && s + 1 < total) issue_loads(s + 1);  // its buffer was released at the end of step s - 1
    mbar_wait(bars + 8 * (1 + (s & 1)), (s >> 1) & 1);
    const std::uint32_t s_k = s_k0 + (s & 1) * Traits::kSmemKV, s_v = s_v0 + (s & 1) * Traits::kSmemKV;

    // ---- S = Q K^T for the warpgroup's 64 rows; sc[0][nj] is this thread's C tile of keys
    // key0 + 8 nj (rows: warp * 16 + g, + 8). Q and K are K-major: step kk is 32 bytes into a block.
    float sc[MR][NT][4];
#pragma unroll
    for (int nj = 0; nj < NT; ++nj)
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[0][nj][e] = 0.0f;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const std::uint32_t off = (kk / 4) * WgmmaTile<64, D>::kBlockBytes + (kk % 4) * 32;
      wgmma_m64n64_ss(sc[0], sw128_desc(s_q + off, 16, 1024), sw128_desc(s_k + off, 16, 1024), kk > 0);
    }
    wgmma_commit();
    wgmma_wait_all();
    fence_registers(sc[0]);

    // ---- Scores at the mode's rounding point, and the mask.
    mode_scores_and_mask<kPaper, BK>(sc, p.scale, st.key0, min_last, t, rows.last);

    if (!st.main) {
      rows.prepass_tile(sc);
    } else {
      if (st.sub == 0) rows.start_unit(p, sc, st);
      if (rows.events) rows.count_repeated_max(sc);
      std::uint32_t pa[MR][NT / 2][4];  // BF16(P-bar) as A fragments, 16 keys each
      rows.probabilities(p, sc, pa);

      // ---- acc += BF16(P-bar) V: A from registers, V MN-major (keys step 2048 bytes per k16; the
      // 64-wide d blocks are a block apart).
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk)
        wgmma_pv<D>(rows.acc[0], pa[0][kk], sw128_desc(s_v + kk * 2048, WgmmaTile<BK, D>::kBlockBytes, 1024));
      wgmma_commit();
      wgmma_wait_all();
      fence_registers(rows.acc[0]);
      if (st.sub == st.n_sub - 1) rows.end_unit(p);
    }
    __syncthreads();  // this step's K/V buffers are refilled by the copies issued next iteration
  }
  rows.store(p, b, h, t);
}

}  // namespace stableflash::attention::cuda
