// The backward's per-row delta (docs/numerics-contract.md `delta_source`) and the dQ conversion:
//   rounded:      delta = FP32-rowsum(dO * O)        (paper: rounded to BF16)
//   compensated:  delta = FP32-rowsum(dO * (O + r))  (r: the forward's BF16 residual of O)
//   exact:        delta = FP32-rowsum(dP * P)        (one more pass over the keys, no O)
#pragma once

#include <cstdint>

#include "kernel_params.cuh"
#include "stableflash/attention/modes.hpp"
#include "stableflash/attention/rounding_points.hpp"
#include "warp_mma.cuh"

namespace stableflash::attention::cuda {

// rounded / compensated: D/8 lanes per row, 16-byte loads, a shuffle tree within the row's lanes.
template <int D, bool kPaper>
__global__ void __launch_bounds__(256) delta_from_output_kernel(const __grid_constant__ BackwardParams p) {
  constexpr int kLanes = D / 8, kRowsPerWarp = 32 / kLanes;
  const std::int64_t rows = std::int64_t(p.batch) * p.heads * p.q_len;
  const std::int64_t row = (std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kLanes;
  const int lane_in_row = threadIdx.x % kLanes;
  const bool compensated = p.delta_source == static_cast<int>(DeltaSource::compensated);
  float sum = 0.0f;
  if (row < rows) {
    const int i = int(row % p.q_len), hh = int(row / p.q_len % p.heads), bb = int(row / (std::int64_t(p.q_len) * p.heads));
    const std::int64_t at_o = p.o_strides.head(bb, hh) + i * p.o_strides.t + lane_in_row * 8;  // o and o_residual
    const std::int64_t at_do = p.d_o_strides.head(bb, hh) + i * p.d_o_strides.t + lane_in_row * 8;
    const uint4 o = *reinterpret_cast<const uint4*>(p.o + at_o);
    const uint4 d = *reinterpret_cast<const uint4*>(p.d_o + at_do);
    uint4 r = make_uint4(0, 0, 0, 0);
    if (compensated) r = *reinterpret_cast<const uint4*>(p.o_residual + at_o);
    const std::uint32_t ov[4] = {o.x, o.y, o.z, o.w}, dv[4] = {d.x, d.y, d.z, d.w}, rv[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      // O + r in FP32 is O_fp32 to within 2^-8 of O's rounding error (docs/numerics-contract.md)
      const float o_lo = compensated ? add_rn(bf16_lo(ov[w]), bf16_lo(rv[w])) : bf16_lo(ov[w]);
      const float o_hi = compensated ? add_rn(bf16_hi(ov[w]), bf16_hi(rv[w])) : bf16_hi(ov[w]);
      sum += bf16_lo(dv[w]) * o_lo + bf16_hi(dv[w]) * o_hi;
    }
  }
#pragma unroll
  for (int off = kLanes / 2; off >= 1; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  (void)kRowsPerWarp;
  if (row < rows && lane_in_row == 0) p.delta[row] = (kPaper && !compensated) ? paper::delta(sum) : sum;
}

// Shared memory of delta_exact_kernel: tiles in the XOR swizzle of ldmatrix (SwizzledTile).
template <int D>
struct DeltaExactStorage {
  std::uint16_t q[64 * D];
  std::uint16_t d_o[64 * D];
  std::uint16_t k[2][64 * D];  // double buffered
  std::uint16_t v[2][64 * D];
};

// exact: delta_i = sum_j dP_ij P_ij over the visible keys. 4 warps x 16 query rows per CTA; keys
// in sub-tiles of 64 (K and V double buffered), S = Q K^T and dP = dO V^T as in the forward.
template <int D, bool kPaper>
__global__ void __launch_bounds__(128) delta_exact_kernel(const __grid_constant__ BackwardParams p) {
  constexpr int BQ = 64, BK = 64, NT = BK / 8, kThreads = 128;
  constexpr int kTileBytes = BK * D * 2;
  using Tile = SwizzledTile<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  auto& shared = *reinterpret_cast<DeltaExactStorage<D>*>(smem);
  const std::uint32_t s_q = smem_u32(shared.q), s_do = smem_u32(shared.d_o), s_k0 = smem_u32(shared.k), s_v0 = smem_u32(shared.v);
  const int b = blockIdx.z, h = blockIdx.y, m0 = blockIdx.x * BQ;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const bool causal = p.causal != 0;
  const std::int64_t row_base = (std::int64_t(b) * p.heads + h) * p.q_len;
  const int kv_h = h / p.kv_group;  // grouped-query heads share K/V
  const std::uint16_t* k_head = p.k + p.k_strides.head(b, kv_h);
  const std::uint16_t* v_head = p.v + p.v_strides.head(b, kv_h);

  int last[2];
  float lse[2], part[2] = {0.0f, 0.0f};
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int i = m0 + warp * 16 + g + 8 * hf;
    last[hf] = i < p.q_len ? last_key(i, p.q_len, p.k_len, causal) : -1;
    lse[hf] = i < p.q_len ? p.lse[row_base + i] : __builtin_huge_valf();
  }
  const int n_keys = max(0, last_key(min(m0 + BQ, p.q_len) - 1, p.q_len, p.k_len, causal) + 1);
  const int min_last = last_key(m0, p.q_len, p.k_len, causal);
  const int n_steps = (n_keys + BK - 1) / BK;

  auto issue = [&](int s) {
    load_tile_async<BK, D, kThreads>(s_k0 + (s & 1) * kTileBytes, k_head, p.k_strides.t, s * BK, p.k_len);
    load_tile_async<BK, D, kThreads>(s_v0 + (s & 1) * kTileBytes, v_head, p.v_strides.t, s * BK, p.k_len);
  };
  load_tile_async<BQ, D, kThreads>(s_q, p.q + p.q_strides.head(b, h), p.q_strides.t, m0, p.q_len);
  load_tile_async<BQ, D, kThreads>(s_do, p.d_o + p.d_o_strides.head(b, h), p.d_o_strides.t, m0, p.q_len);
  if (n_steps > 0) issue(0);
  cp_async_commit();
  for (int s = 0; s < n_steps; ++s) {
    if (s + 1 < n_steps) issue(s + 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    float sc[NT][4], dp[NT][4];
#pragma unroll
    for (int nj = 0; nj < NT; ++nj)
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[nj][e] = dp[nj][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      std::uint32_t aq[4], ao[4];
      ldmatrix_x4(aq, s_q + Tile::offset(warp * 16 + lane % 16, kk * 2 + lane / 16));
      ldmatrix_x4(ao, s_do + Tile::offset(warp * 16 + lane % 16, kk * 2 + lane / 16));
#pragma unroll
      for (int nj2 = 0; nj2 < NT / 2; ++nj2) {
        std::uint32_t bk[4], bv[4];
        const int row = nj2 * 16 + lane % 8 + 8 * (lane / 16), chunk = kk * 2 + (lane / 8) % 2;
        ldmatrix_x4(bk, s_k0 + (s & 1) * kTileBytes + Tile::offset(row, chunk));
        ldmatrix_x4(bv, s_v0 + (s & 1) * kTileBytes + Tile::offset(row, chunk));
        mma_16816(sc[2 * nj2], aq, bk[0], bk[1]);
        mma_16816(sc[2 * nj2 + 1], aq, bk[2], bk[3]);
        mma_16816(dp[2 * nj2], ao, bv[0], bv[1]);
        mma_16816(dp[2 * nj2 + 1], ao, bv[2], bv[3]);
      }
    }
    if (s * BK + BK - 1 > min_last) {  // keys a row does not see: S = -inf, so P = 0 (one branch per tile)
#pragma unroll
      for (int nj = 0; nj < NT; ++nj)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (s * BK + nj * 8 + 2 * t + (e & 1) > last[e / 2]) sc[nj][e] = -__builtin_huge_valf();
    }
#pragma unroll
    for (int nj = 0; nj < NT; ++nj)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float prob = kPaper ? paper::prob(paper::score(sc[nj][e], p.scale), lse[e / 2])
                                  : fused::prob_fast(fused::score(sc[nj][e], p.scale), lse[e / 2]);
        part[e / 2] += prob * (kPaper ? paper::dprob(dp[nj][e]) : dp[nj][e]);
      }
    __syncthreads();
  }
  cp_async_wait<0>();
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const float sum = quad_sum(part[hf]);
    const int i = m0 + warp * 16 + g + 8 * hf;
    if (t == 0 && i < p.q_len) p.delta[row_base + i] = sum;
  }
}

// dQ = BF16(acc * scale) (fused: the scale multiplies the FP32 product; paper's dS carries it), from
// the wgmma kernel's fragment-ordered workspace (DqFragmentOrder): each thread
// converts one float4 = two dims of two rows (16 warp + g, + 8); padding rows past Tq are skipped.
template <int D>
__global__ void __launch_bounds__(256) dq_convert_fragments_kernel(const __grid_constant__ BackwardParams p,
                                                                   float product_scale) {
  constexpr int kBlockVecs = DqFragmentOrder::kBlockQ * D / 4, kTileVecs = DqFragmentOrder::kTileFloats / 4;
  const int n_blocks = DqFragmentOrder::blocks(p.q_len);
  const std::int64_t idx = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= std::int64_t(p.batch) * p.heads * n_blocks * kBlockVecs) return;
  const std::int64_t block = idx / kBlockVecs;  // (b, h, query block)
  const int in_block = int(idx % kBlockVecs), tile = in_block / kTileVecs, j = in_block % kTileVecs / 128;
  const int thread = in_block % 128, warp = thread / 32, g = thread % 32 / 4, t = thread % 4;
  const int qb = int(block % n_blocks), hh = int(block / n_blocks % p.heads), bb = int(block / n_blocks / p.heads);
  const int row = qb * DqFragmentOrder::kBlockQ + warp * 16 + g, d = tile * 64 + j * 8 + 2 * t;
  const float4 a = __ldcs(reinterpret_cast<const float4*>(p.dq_accum) + idx);
  std::uint16_t* dq_head = p.dq + p.dq_strides.head(bb, hh);
  if (row < p.q_len)
    *reinterpret_cast<std::uint32_t*>(dq_head + row * p.dq_strides.t + d) =
        pack_bf16x2(mul_rn(a.x, product_scale), mul_rn(a.y, product_scale));
  if (row + 8 < p.q_len)
    *reinterpret_cast<std::uint32_t*>(dq_head + (row + 8) * p.dq_strides.t + d) =
        pack_bf16x2(mul_rn(a.z, product_scale), mul_rn(a.w, product_scale));
}

}  // namespace stableflash::attention::cuda
