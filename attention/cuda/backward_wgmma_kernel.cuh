// Flash-attention backward for sm_90a with warpgroup MMA (wgmma) and bulk tensor copies, in
// `fused` or `paper` numerics: backward_kernel.cuh's algorithm with the five products moved to
// the tensor cores' asynchronous path. A CTA is one warpgroup owning 64 keys of one (b, h), 16
// per warp (the m64 of a wgmma), and walks the query blocks of 64 that see them:
//   S^T = K Q^T, dP^T = V dO^T        wgmma, A and B from shared memory (K-major)
//   P, dS (rounding points)           per warp on its 16 keys: the fragments of the mma.sync
//                                     kernel, so that code carries over unchanged
//   dV += P^T dO, dK += dS^T Q        wgmma, A = P^T / dS^T from registers, B = dO / Q (MN-major)
//   dQ = dS K                         wgmma, A = dS read as the transpose of the dS^T tile it
//                                     stores, B = K (both MN-major); FP32 atomics or ordered adds
// K and V arrive once, Q and dO per query block (double buffered), all by TMA on mbarriers.
#pragma once

#include <cstdint>

#include "backward_kernel.cuh"
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
  static constexpr int kThreads = 128;
  static constexpr int kBlockK = 64;  // keys per CTA
  static constexpr int kBlockQ = 64;  // queries per step (entry.cu sizes the dQ turn counters by it)
  static constexpr int kQueryTiles = kBlockQ / 8;
  static constexpr int kDimTiles = kHeadDim / 8;
  static constexpr int kTile = kBlockK * kHeadDim * 2;  // one [64, D] SW128 tile
  static constexpr int kSmemDS = kBlockK * kBlockQ * 2;
  // K, V, Q x2, dO x2, dS^T, lse|delta x2, barriers (K/V, Q/dO x2)
  static constexpr int kSmemBytes = 6 * kTile + kSmemDS + 2 * 2 * kBlockQ * 4 + 3 * 8;
  static constexpr int kMinBlocks = kHeadDim == 64 ? 3 : 2;
  static_assert(kHeadDim == 64 || kHeadDim == 128, "head dims with kernels: 64, 128");
  static_assert(kBlockQ == 64, "dS^T rows are one 128-byte SW128 block");
};

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads, Traits::kMinBlocks)
    attention_backward_wgmma_kernel(const __grid_constant__ BackwardParams p) {
  constexpr int D = Traits::kHeadDim, BK = Traits::kBlockK, BQ = Traits::kBlockQ;
  constexpr int NQ = Traits::kQueryTiles, DT = Traits::kDimTiles;
  constexpr bool kPaper = Traits::kPaper;
  constexpr float kInf = __builtin_huge_valf();
  constexpr int kBoxBytes = 64 * 64 * 2, kBoxes = D / 64, kTile = Traits::kTile;
  using Tile = WgmmaTile<64, D>;

  extern __shared__ __align__(1024) unsigned char smem[];
  const std::uint32_t s_k = smem_u32(smem), s_v = s_k + kTile, s_q0 = s_v + kTile, s_do0 = s_q0 + 2 * kTile;
  const std::uint32_t s_ds = s_do0 + 2 * kTile;
  float* s_rowvals = reinterpret_cast<float*>(smem + 6 * kTile + Traits::kSmemDS);  // [2][lse | delta][BQ]
  const std::uint32_t bars = s_k + 6 * kTile + Traits::kSmemDS + 2 * 2 * BQ * 4;    // K/V, Q/dO slot 0, slot 1

  const int b = blockIdx.z, h = blockIdx.y, kb = blockIdx.x, k0 = kb * BK;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const bool causal = p.causal != 0;
  const std::int64_t row_base = (std::int64_t(b) * p.heads + h) * p.q_len;
  const int first_query = causal ? max(0, k0 - (p.k_len - p.q_len)) : 0;
  const int qb_begin = first_query / BQ, qb_end = (p.q_len + BQ - 1) / BQ;

  auto issue_query_block = [&](int qb, int slot) {
    const std::uint32_t bar = bars + 8 * (1 + slot);
    mbar_arrive_expect_tx(bar, 2 * kBoxes * kBoxBytes);
#pragma unroll
    for (int x = 0; x < kBoxes; ++x) {
      tma_load_4d(s_q0 + slot * kTile + x * kBoxBytes, &p.tma_q, 64 * x, qb * BQ, h, b, bar);
      tma_load_4d(s_do0 + slot * kTile + x * kBoxBytes, &p.tma_do, 64 * x, qb * BQ, h, b, bar);
    }
  };
  if (threadIdx.x == 0) {
#pragma unroll
    for (int i = 0; i < 3; ++i) mbar_init(bars + 8 * i, 1);
    mbar_fence_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbar_arrive_expect_tx(bars, 2 * kBoxes * kBoxBytes);
#pragma unroll
    for (int x = 0; x < kBoxes; ++x) {
      tma_load_4d(s_k + x * kBoxBytes, &p.tma_k, 64 * x, k0, h, b, bars);
      tma_load_4d(s_v + x * kBoxBytes, &p.tma_v, 64 * x, k0, h, b, bars);
    }
    if (qb_begin < qb_end) issue_query_block(qb_begin, 0);
  }

  float acc_dk[DT][4], acc_dv[DT][4];  // this warp's 16 keys x D
#pragma unroll
  for (int nd = 0; nd < DT; ++nd)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_dk[nd][e] = acc_dv[nd][e] = 0.0f;
  mbar_wait(bars, 0);

  const int key_row = warp * 16;
  for (int qb = qb_begin; qb < qb_end; ++qb) {
    const int i = qb - qb_begin, slot = i & 1, q0 = qb * BQ;
    if (threadIdx.x == 0 && qb + 1 < qb_end) issue_query_block(qb + 1, slot ^ 1);  // released at the end of step i - 1
    // lse and delta of this block; rows past Tq get lse = +inf so P = 0 there
    float* vals = s_rowvals + slot * 2 * BQ;
    for (int r = threadIdx.x; r < BQ; r += Traits::kThreads) {
      const bool valid = q0 + r < p.q_len;
      vals[r] = valid ? p.lse[row_base + q0 + r] : kInf;
      vals[BQ + r] = valid ? p.delta[row_base + q0 + r] : 0.0f;
    }
    mbar_wait(bars + 8 * (1 + slot), (i >> 1) & 1);
    __syncthreads();
    const std::uint32_t s_q = s_q0 + slot * kTile, s_do = s_do0 + slot * kTile;
    const float* s_lse = vals;
    const float* s_delta = vals + BQ;

    // ---- S^T = K Q^T and dP^T = V dO^T (K-major operands: step kk is 32 bytes into a block)
    float st[NQ][4], dpt[NQ][4];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const std::uint32_t off = (kk / 4) * Tile::kBlockBytes + (kk % 4) * 32;
      wgmma_m64n64_ss(st, sw128_desc(s_k + off, 16, 1024), sw128_desc(s_q + off, 16, 1024), kk > 0);
    }
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const std::uint32_t off = (kk / 4) * Tile::kBlockBytes + (kk % 4) * 32;
      wgmma_m64n64_ss(dpt, sw128_desc(s_v + off, 16, 1024), sw128_desc(s_do + off, 16, 1024), kk > 0);
    }
    wgmma_commit();
    wgmma_wait_all();
    fence_registers(st);
    fence_registers(dpt);

    // ---- P and dS at the mode's rounding points (backward_kernel.cuh's element mapping):
    // element (nq, e) is key k0 + key_row + g + 8 (e / 2), query q0 + 8 nq + 2t + (e % 2).
    const bool need_mask = k0 + BK > p.k_len || (causal && k0 + BK - 1 > q0 + p.k_len - p.q_len);
    std::uint32_t pa[NQ / 2][4], dsa[NQ / 2][4];
#pragma unroll
    for (int nq = 0; nq < NQ; ++nq) {
      float pv[4], dsv[4];
      probs_and_dscores<kPaper>(p, st[nq], dpt[nq], nq * 8 + 2 * t, k0 + key_row + g, q0, need_mask, causal, s_lse, s_delta,
                                pv, dsv);
      pa[nq / 2][(nq % 2) * 2 + 0] = pack_bf16x2(pv[0], pv[1]);
      pa[nq / 2][(nq % 2) * 2 + 1] = pack_bf16x2(pv[2], pv[3]);
      dsa[nq / 2][(nq % 2) * 2 + 0] = pack_bf16x2(dsv[0], dsv[1]);
      dsa[nq / 2][(nq % 2) * 2 + 1] = pack_bf16x2(dsv[2], dsv[3]);
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {  // dS^T [key][query] for dQ, in the SW128 layout
        const std::uint32_t addr = s_ds + WgmmaTile<64, 64>::offset(key_row + g + 8 * hf, nq) + 4 * t;
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(dsa[nq / 2][(nq % 2) * 2 + hf]));
      }
    }
    fence_proxy_async_smem();  // the dS^T stores are read by wgmma next

    // ---- dV += BF16(P)^T dO, dK += BF16(dS)^T Q (B MN-major: 16 queries step 2048 bytes)
    wgmma_fence();
#pragma unroll
    for (int kq = 0; kq < BQ / 16; ++kq) {
      wgmma_pv<D>(acc_dv, pa[kq], sw128_desc(s_do + kq * 2048, Tile::kBlockBytes, 1024));
      wgmma_pv<D>(acc_dk, dsa[kq], sw128_desc(s_q + kq * 2048, Tile::kBlockBytes, 1024));
    }
    wgmma_commit();
    wgmma_wait_all();  // pa and dsa are read asynchronously: keep them until here
    fence_registers(pa);
    fence_registers(dsa);
    __syncthreads();  // dS^T complete

    // ---- dQ[q0 .. q0 + 64, :] = BF16(dS) K over this CTA's 64 keys: this warp's 16 queries
    float acc_dq[DT][4];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk)
      wgmma_ss_tt<D>(acc_dq, sw128_desc(s_ds + kk * 2048, WgmmaTile<64, 64>::kBlockBytes, 1024),
                     sw128_desc(s_k + kk * 2048, Tile::kBlockBytes, 1024), kk > 0);
    wgmma_commit();
    wgmma_wait_all();
    fence_registers(acc_dq);
    float* dq_head = p.dq_accum + row_base * D;  // [Tq, D] FP32
    int* turn = p.dq_semaphore + ((std::int64_t(b) * p.heads + h) * ((p.q_len + BQ - 1) / BQ) + qb);
    if (p.deterministic) wait_turn(turn, kb);
#pragma unroll
    for (int nd = 0; nd < DT; ++nd)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int qi = q0 + warp * 16 + g + 8 * hf;
        if (qi >= p.q_len) continue;
        float2* dst = reinterpret_cast<float2*>(dq_head + std::int64_t(qi) * D + nd * 8 + 2 * t);
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
    __syncthreads();  // dS^T and this block's Q/dO slot are rewritten next
  }
  fence_registers(acc_dk);
  fence_registers(acc_dv);

  // ---- dK = BF16(acc * scale) (fused), dV = BF16(acc); keys past Tk are not stored
  const float dk_scale = kPaper ? 1.0f : p.scale;
  std::uint16_t* dk_head = p.dk + p.k_strides.head(b, h);
  std::uint16_t* dv_head = p.dv + p.k_strides.head(b, h);
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int key = k0 + key_row + g + 8 * hf;
    if (key >= p.k_len) continue;
#pragma unroll
    for (int nd = 0; nd < DT; ++nd) {
      const int d = nd * 8 + 2 * t;
      *reinterpret_cast<std::uint32_t*>(dk_head + key * p.k_strides.t + d) =
          pack_bf16x2(mul_rn(acc_dk[nd][2 * hf], dk_scale), mul_rn(acc_dk[nd][2 * hf + 1], dk_scale));
      *reinterpret_cast<std::uint32_t*>(dv_head + key * p.k_strides.t + d) =
          pack_bf16x2(acc_dv[nd][2 * hf], acc_dv[nd][2 * hf + 1]);
    }
  }
}

}  // namespace stableflash::attention::cuda
