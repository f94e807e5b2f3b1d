// Kernel lab (comparison only): the flash-attention forward with warp-level mma.sync
// (FlashAttention-2's structure, the kernel forward_wgmma_kernel.cuh grew from), in
// `fused` or `paper` numerics (Traits::kPaper) with any shift policy (template parameter).
//
// A CTA owns kBlockQ query rows of one (b, h); each warp owns 16 * kRowTiles of them, so every
// per-row quantity (max, shift, sums) lives in the four threads of a quad. Keys are walked in
// sub-tiles of 64, K and V double buffered with cp.async. The numerics' key tile (tile_k, a
// multiple of 64; docs/numerics-contract.md: rounding and tie detection are per tile) groups sub-tiles into
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
#include "lab/mma_traits.cuh"
#include "warp_mma.cuh"

namespace stableflash::attention::cuda {

template <class Traits, class Policy>
__global__ void __launch_bounds__(Traits::kThreads, Traits::kMinBlocks) attention_forward_kernel(const __grid_constant__ ForwardParams p) {
  constexpr int D = Traits::kHeadDim, BQ = Traits::kBlockQ, BK = Traits::kBlockK;
  constexpr int MR = Traits::kRowTiles, NT = Traits::kKeyTiles, DT = Traits::kDimTiles;
  constexpr bool kPaper = Traits::kPaper;
  constexpr bool kMultiPass = !kFastPathInstantiable<kPaper, Policy>;
  using Tile = SwizzledTile<D>;
  using Rows = ForwardRows<Traits, Policy>;

  extern __shared__ __align__(1024) unsigned char smem[];
  auto& shared = *reinterpret_cast<typename Traits::SharedStorage*>(smem);
  const std::uint32_t s_q = smem_u32(shared.q), s_k0 = smem_u32(shared.k), s_v0 = smem_u32(shared.v);

  // Causal rows late in the sequence see the most keys: launch those blocks first so the last
  // wave is made of short ones.
  const int b = blockIdx.z, h = blockIdx.y, m0 = (p.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * BQ;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t = lane % 4;
  const int kv_h = h / p.kv_group;                              // grouped-query heads share K/V
  const std::uint16_t* q_head = p.q + p.q_strides.head(b, h);     // [Tq, D], row stride q_strides.t
  const std::uint16_t* k_head = p.k + p.k_strides.head(b, kv_h);  // [Tk, D]
  const std::uint16_t* v_head = p.v + p.v_strides.head(b, kv_h);  // [Tk, D]

  Rows rows(p, shared.events, shared.top[0], b, h, m0 + warp * 16 * MR + lane / 4, warp * 16 * MR + lane / 4);
  const CtaKeys keys = cta_keys<BQ, BK, kMultiPass>(p, m0);
  const KeyWalk& walk = keys.walk;
  const int min_last = keys.min_last, total = walk.total_steps();

  auto issue_loads = [&](int s, const KeyStep& st) {
    load_tile_async<BK, D, Traits::kThreads>(s_k0 + (s & 1) * Traits::kSmemKV, k_head, p.k_strides.t, st.key0, p.k_len);
    if (st.main)
      load_tile_async<BK, D, Traits::kThreads>(s_v0 + (s & 1) * Traits::kSmemKV, v_head, p.v_strides.t, st.key0, p.k_len);
  };
  load_tile_async<BQ, D, Traits::kThreads>(s_q, q_head, p.q_strides.t, m0, p.q_len);
  if (total > 0) issue_loads(0, KeyCursor(walk).step);
  cp_async_commit();

  KeyCursor cursor(walk), ahead(walk);  // steps s and s + 1
  ahead.advance();
  for (int s = 0; s < total; ++s, cursor.advance(), ahead.advance()) {
    const KeyStep st = cursor.step;
    if (s + 1 < total) issue_loads(s + 1, ahead.step);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const std::uint32_t s_k = s_k0 + (s & 1) * Traits::kSmemKV, s_v = s_v0 + (s & 1) * Traits::kSmemKV;

    // ---- S = Q K^T for this warp's rows; sc[mi][nj] is the C tile of keys key0 + 8 nj.
    float sc[MR][NT][4];
#pragma unroll
    for (int mi = 0; mi < MR; ++mi)
#pragma unroll
      for (int nj = 0; nj < NT; ++nj)
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[mi][nj][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      std::uint32_t a[MR][4];
#pragma unroll
      for (int mi = 0; mi < MR; ++mi)
        ldmatrix_x4(a[mi], s_q + Tile::offset(warp * 16 * MR + mi * 16 + lane % 16, kk * 2 + lane / 16));
#pragma unroll
      for (int nj2 = 0; nj2 < NT / 2; ++nj2) {
        std::uint32_t bk[4];  // B fragments of keys 16 nj2 + [0, 8) and + [8, 16)
        ldmatrix_x4(bk, s_k + Tile::offset(nj2 * 16 + lane % 8 + 8 * (lane / 16), kk * 2 + (lane / 8) % 2));
#pragma unroll
        for (int mi = 0; mi < MR; ++mi) {
          mma_16816(sc[mi][2 * nj2], a[mi], bk[0], bk[1]);
          mma_16816(sc[mi][2 * nj2 + 1], a[mi], bk[2], bk[3]);
        }
      }
    }

    // ---- Scores at the mode's rounding point, and the mask.
    mode_scores_and_mask<kPaper, BK>(sc, p.scale, st.key0, min_last, t, rows.last);

    if (!st.main) {
      rows.top2.fold(sc);
    } else {
      if (st.sub == 0) rows.start_unit(p, sc, st);
      if (rows.events.counting()) rows.events.count_repeated_max(sc);
      std::uint32_t pa[MR][NT / 2][4];  // BF16(P-bar) as A fragments, 16 keys each
      rows.probabilities(p, sc, pa);

      // ---- acc += BF16(P-bar) V: A from registers, B = V^T fragments by transposing ldmatrix.
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk) {
#pragma unroll
        for (int nd2 = 0; nd2 < DT / 2; ++nd2) {
          std::uint32_t bv[4];  // B fragments of dims 16 nd2 + [0, 8) and + [8, 16)
          ldmatrix_x4_trans(bv, s_v + Tile::offset(kk * 16 + lane % 8 + 8 * ((lane / 8) % 2), nd2 * 2 + lane / 16));
#pragma unroll
          for (int mi = 0; mi < MR; ++mi) {
            mma_16816(rows.softmax.acc[mi][2 * nd2], pa[mi][kk], bv[0], bv[1]);
            mma_16816(rows.softmax.acc[mi][2 * nd2 + 1], pa[mi][kk], bv[2], bv[3]);
          }
        }
      }
      if (st.sub == st.n_sub - 1) rows.end_unit(p);
    }
    __syncthreads();  // this step's K/V buffers are refilled by the loads issued next iteration
  }
  cp_async_wait<0>();
  ForwardEpilogue<Rows>::store(rows, p, b, h, t);
}

}  // namespace stableflash::attention::cuda
