// The kernel lab's copies of the backward's two memory-bound kernels as they were before the
// 2026-12 rewrite (backward_delta.cuh has the production ones): one thread per 16 bytes of input,
// its row found by 64-bit divisions. Kept to time old against new in one run and to check that the
// new ones write the same bits (`kernel_lab --backward-parts`, lab/backward_parts.cu). Launch as
// they were launched: delta with one thread per 8 elements of all rows (256 per CTA), the
// conversion with one thread per float4 of the workspace (256 per CTA).
#pragma once

#include <cstdint>

#include "kernel_params.cuh"
#include "stableflash/attention/modes.hpp"
#include "stableflash/attention/rounding_points.hpp"
#include "warp_mma.cuh"

namespace stableflash::attention::cuda::lab {

// rounded / compensated: D/8 lanes per row, 16-byte loads, a shuffle tree within the row's lanes.
template <int D, bool kPaper>
__global__ void __launch_bounds__(256) delta_from_output_v1_kernel(const __grid_constant__ BackwardParams p) {
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

// dQ = BF16(acc * scale) (fused: the scale multiplies the FP32 product; paper's dS carries it), from
// the wgmma kernel's fragment-ordered workspace (DqFragmentOrder): each thread
// converts one float4 = two dims of two rows (16 warp + g, + 8); padding rows past Tq are skipped.
template <int D>
__global__ void __launch_bounds__(256) dq_convert_fragments_v1_kernel(const __grid_constant__ BackwardParams p,
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

}  // namespace stableflash::attention::cuda::lab
