// Kernel lab (comparison only): the flash-attention backward with warp-level mma.sync
// (FlashAttention-2's structure, the stepping stone of backward_wgmma_kernel.cuh) in
// `fused` or `paper` numerics. The shift policy does not enter: P = exp(S - lse) uses the forward's
// lse whatever m was (docs/numerics-contract.md), so there is one kernel per (head dim, numerics).
//
// A CTA owns kBlockK keys of one (b, h), 16 per warp, and walks the query blocks that see them.
// Per query block (Q, dO, lse, delta double buffered in shared memory):
//   S^T = K Q^T and dP^T = V dO^T           (warp: its 16 keys x 64 queries, FP32)
//   P = exp(S - lse), dS = P (dP - delta)   (rounding points from rounding_points.hpp)
//   dV += BF16(P)^T dO, dK += BF16(dS)^T Q  (accumulated in registers over all query blocks)
//   dQ += BF16(dS) K                        (dS^T through shared memory; FP32 atomics into a
//                                            workspace, or, deterministic, ordered read-add-writes)
// Working on S^T makes P^T and dS^T come out of the mma in the A-operand layout of the dV and dK
// products, so only dQ needs dS in shared memory.
#pragma once

#include <cstdint>

#include "backward_common.cuh"
#include "kernel_params.cuh"
#include "lab/mma_traits.cuh"
#include "stableflash/attention/rounding_points.hpp"
#include "warp_mma.cuh"

namespace stableflash::attention::cuda {

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1) attention_backward_kernel(const __grid_constant__ BackwardParams p) {
  constexpr int D = Traits::kHeadDim, BK = Traits::kBlockK, BQ = Traits::kBlockQ;
  constexpr int NQ = Traits::kQueryTiles, DT = Traits::kDimTiles, DQT = Traits::kDqDimTiles;
  constexpr bool kPaper = Traits::kPaper;
  constexpr float kInf = __builtin_huge_valf();
  using Tile = SwizzledTile<D>;
  using DsTile = SwizzledTile<BQ>;  // dS^T: [BK keys, BQ queries]

  extern __shared__ __align__(128) unsigned char smem[];
  auto& shared = *reinterpret_cast<typename Traits::SharedStorage*>(smem);
  const std::uint32_t s_k = smem_u32(shared.k), s_v = smem_u32(shared.v);
  const std::uint32_t s_q0 = smem_u32(shared.q), s_do0 = smem_u32(shared.d_o), s_ds = smem_u32(shared.ds);

  const int b = blockIdx.z, h = blockIdx.y, kb = blockIdx.x, k0 = kb * BK;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const bool causal = p.causal != 0;
  const std::int64_t row_base = (std::int64_t(b) * p.heads + h) * p.q_len;  // [B, H, Tq] row index
  const int kv_h = h / p.kv_group;  // grouped-query heads share K/V
  const std::uint16_t* q_head = p.q + p.q_strides.head(b, h);
  const std::uint16_t* do_head = p.d_o + p.d_o_strides.head(b, h);
  const std::uint16_t* k_head = p.k + p.k_strides.head(b, kv_h);
  const std::uint16_t* v_head = p.v + p.v_strides.head(b, kv_h);

  // Query blocks that see any of keys [k0, k0 + BK): query i sees key j iff j <= i + Tk - Tq.
  const int first_query = causal ? max(0, k0 - (p.k_len - p.q_len)) : 0;
  const int qb_begin = first_query / BQ, qb_end = (p.q_len + BQ - 1) / BQ;

  auto issue_query_block = [&](int qb, int buf) {
    const int q0 = qb * BQ;
    load_tile_async<BQ, D, Traits::kThreads>(s_q0 + buf * Traits::kSmemQ, q_head, p.q_strides.t, q0, p.q_len);
    load_tile_async<BQ, D, Traits::kThreads>(s_do0 + buf * Traits::kSmemQ, do_head, p.d_o_strides.t, q0, p.q_len);
    // lse and delta; rows past Tq get lse = +inf so P = 0 there.
    float* vals = shared.rowvals + buf * 2 * BQ;
    for (int r = threadIdx.x; r < BQ; r += Traits::kThreads) {
      const bool valid = q0 + r < p.q_len;
      vals[r] = valid ? p.lse[row_base + q0 + r] : kInf;
      vals[BQ + r] = valid ? p.delta[row_base + q0 + r] : 0.0f;
    }
  };

  load_tile_async<BK, D, Traits::kThreads>(s_k, k_head, p.k_strides.t, k0, p.k_len);
  load_tile_async<BK, D, Traits::kThreads>(s_v, v_head, p.v_strides.t, k0, p.k_len);
  if (qb_begin < qb_end) issue_query_block(qb_begin, 0);
  cp_async_commit();

  float acc_dk[DT][4], acc_dv[DT][4];  // this warp's 16 keys x D
#pragma unroll
  for (int nd = 0; nd < DT; ++nd)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_dk[nd][e] = acc_dv[nd][e] = 0.0f;

  const int key_row = warp * 16;  // this warp's keys within the CTA: key_row + g (+ 8)
  for (int qb = qb_begin; qb < qb_end; ++qb) {
    const int buf = (qb - qb_begin) & 1, q0 = qb * BQ;
    if (qb + 1 < qb_end) issue_query_block(qb + 1, buf ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const std::uint32_t s_q = s_q0 + buf * Traits::kSmemQ, s_do = s_do0 + buf * Traits::kSmemQ;
    const float* s_lse = shared.rowvals + buf * 2 * BQ;
    const float* s_delta = s_lse + BQ;

    // ---- S^T = K Q^T and dP^T = V dO^T: rows = this warp's 16 keys, columns = BQ queries.
    float st[NQ][4], dpt[NQ][4];
#pragma unroll
    for (int nq = 0; nq < NQ; ++nq)
#pragma unroll
      for (int e = 0; e < 4; ++e) st[nq][e] = dpt[nq][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      std::uint32_t ak[4], av[4];
      ldmatrix_x4(ak, s_k + Tile::offset(key_row + lane % 16, kk * 2 + lane / 16));
      ldmatrix_x4(av, s_v + Tile::offset(key_row + lane % 16, kk * 2 + lane / 16));
#pragma unroll
      for (int nq2 = 0; nq2 < NQ / 2; ++nq2) {
        std::uint32_t bq[4], bo[4];
        const int row = nq2 * 16 + lane % 8 + 8 * (lane / 16), chunk = kk * 2 + (lane / 8) % 2;
        ldmatrix_x4(bq, s_q + Tile::offset(row, chunk));
        ldmatrix_x4(bo, s_do + Tile::offset(row, chunk));
        mma_16816(st[2 * nq2], ak, bq[0], bq[1]);
        mma_16816(st[2 * nq2 + 1], ak, bq[2], bq[3]);
        mma_16816(dpt[2 * nq2], av, bo[0], bo[1]);
        mma_16816(dpt[2 * nq2 + 1], av, bo[2], bo[3]);
      }
    }

    // ---- P and dS at the mode's rounding points; BF16 copies as A fragments (k = queries).
    // Element (nq, e): key k0 + key_row + g + 8 (e / 2), query q0 + 8 nq + 2t + (e % 2).
    const bool need_mask = k0 + BK > p.k_len || (causal && k0 + BK - 1 > q0 + p.k_len - p.q_len);
    if (need_mask) mask_transposed_scores(p, st, k0 + key_row + g, q0, t, causal);
    std::uint32_t pa[NQ / 2][4], dsa[NQ / 2][4];
#pragma unroll
    for (int nq = 0; nq < NQ; ++nq) {
      float pv[4], dsv[4];
      probs_and_dscores<kPaper>(p, st[nq], dpt[nq], nq * 8 + 2 * t, s_lse, s_delta, pv, dsv);
      pa[nq / 2][(nq % 2) * 2 + 0] = pack_bf16x2(pv[0], pv[1]);
      pa[nq / 2][(nq % 2) * 2 + 1] = pack_bf16x2(pv[2], pv[3]);
      dsa[nq / 2][(nq % 2) * 2 + 0] = pack_bf16x2(dsv[0], dsv[1]);
      dsa[nq / 2][(nq % 2) * 2 + 1] = pack_bf16x2(dsv[2], dsv[3]);
      // dS^T to shared memory for dQ: rows = keys, 2 queries per 4-byte store
      const int col = nq * 8 + 2 * t;
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = key_row + g + 8 * hf;
        const std::uint32_t addr = s_ds + DsTile::offset(r, col / 8) + (col % 8) * 2;
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(dsa[nq / 2][(nq % 2) * 2 + hf]));
      }
    }

    // ---- dV += BF16(P)^T dO and dK += BF16(dS)^T Q: B = dO, Q by transposing ldmatrix.
#pragma unroll
    for (int kq = 0; kq < BQ / 16; ++kq) {
#pragma unroll
      for (int nd2 = 0; nd2 < DT / 2; ++nd2) {
        const int row = kq * 16 + lane % 8 + 8 * ((lane / 8) % 2), chunk = nd2 * 2 + lane / 16;
        std::uint32_t bo[4], bq[4];
        ldmatrix_x4_trans(bo, s_do + Tile::offset(row, chunk));
        ldmatrix_x4_trans(bq, s_q + Tile::offset(row, chunk));
        mma_16816(acc_dv[2 * nd2], pa[kq], bo[0], bo[1]);
        mma_16816(acc_dv[2 * nd2 + 1], pa[kq], bo[2], bo[3]);
        mma_16816(acc_dk[2 * nd2], dsa[kq], bq[0], bq[1]);
        mma_16816(acc_dk[2 * nd2 + 1], dsa[kq], bq[2], bq[3]);
      }
    }
    __syncthreads();  // dS^T complete

    // ---- dQ[q0 + 16 rt .., dims of half ch] = BF16(dS) K over this CTA's keys.
    {
      const int rt = warp % Traits::kDqRowTiles, ch = warp / Traits::kDqRowTiles;
      float acc_dq[DQT][4];
#pragma unroll
      for (int nd = 0; nd < DQT; ++nd)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_dq[nd][e] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk) {
        std::uint32_t a[4];  // A = dS (queries x keys) read transposed from dS^T
        ldmatrix_x4_trans(a, s_ds + DsTile::offset(kk * 16 + lane % 8 + 8 * (lane / 16), rt * 2 + (lane / 8) % 2));
#pragma unroll
        for (int nd2 = 0; nd2 < DQT / 2; ++nd2) {
          std::uint32_t bk[4];
          ldmatrix_x4_trans(bk, s_k + Tile::offset(kk * 16 + lane % 8 + 8 * ((lane / 8) % 2),
                                                   ch * (DQT / 2) * 2 + nd2 * 2 + lane / 16));
          mma_16816(acc_dq[2 * nd2], a, bk[0], bk[1]);
          mma_16816(acc_dq[2 * nd2 + 1], a, bk[2], bk[3]);
        }
      }
      float* dq_head = p.dq_accum + row_base * D;  // [Tq, D] FP32
      // deterministic: one counter per (b, h, query block)
      int* turn = p.dq_semaphore + ((std::int64_t(b) * p.heads + h) * ((p.q_len + BQ - 1) / BQ) + qb);
      if (p.deterministic) wait_turn(turn, kb);
#pragma unroll
      for (int nd = 0; nd < DQT; ++nd)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int qi = q0 + rt * 16 + g + 8 * hf;
          if (qi >= p.q_len) continue;
          float2* dst = reinterpret_cast<float2*>(dq_head + std::int64_t(qi) * D + ch * (D / 2) + nd * 8 + 2 * t);
          const float2 add = make_float2(acc_dq[nd][2 * hf], acc_dq[nd][2 * hf + 1]);
          if (p.deterministic) {
            float2 cur = __ldcg(dst);
            cur.x += add.x, cur.y += add.y;
            __stcg(dst, cur);
          } else {
            atomicAdd(dst, add);
          }
        }
      if (p.deterministic) pass_turn(turn, kb + 1);
    }
    __syncthreads();  // dS^T and this block's Q/dO buffers are rewritten next iteration
  }
  cp_async_wait<0>();

  store_dk_dv<kPaper>(p, b, h, k0 + key_row + g, t, acc_dk, acc_dv);
}


// dQ = BF16(acc * scale) (fused: the scale multiplies the FP32 product; paper's dS carries it).
template <int D>
__global__ void __launch_bounds__(256) dq_convert_kernel(const __grid_constant__ BackwardParams p, float product_scale) {
  const std::int64_t idx = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;  // 4 elements each
  const std::int64_t n = std::int64_t(p.batch) * p.heads * p.q_len * D / 4;
  if (idx >= n) return;
  const std::int64_t e = idx * 4, row = e / D;
  const int d = int(e % D), i = int(row % p.q_len), hh = int(row / p.q_len % p.heads);
  const int bb = int(row / (std::int64_t(p.q_len) * p.heads));
  const float4 a = __ldcs(reinterpret_cast<const float4*>(p.dq_accum) + idx);
  uint2 out;
  out.x = pack_bf16x2(mul_rn(a.x, product_scale), mul_rn(a.y, product_scale));
  out.y = pack_bf16x2(mul_rn(a.z, product_scale), mul_rn(a.w, product_scale));
  *reinterpret_cast<uint2*>(p.dq + p.dq_strides.head(bb, hh) + i * p.dq_strides.t + d) = out;
}

}  // namespace stableflash::attention::cuda
