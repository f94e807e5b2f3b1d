// The backward's per-row delta (docs/numerics-contract.md `delta_source`) and the dQ conversion:
//   rounded:      delta = FP32-rowsum(dO * O)        (paper: rounded to BF16)
//   compensated:  delta = FP32-rowsum(dO * (O + r))  (r: the forward's BF16 residual of O)
//   exact:        delta = FP32-rowsum(dP * P)        (one more pass over the keys, no O:
//                                                     backward_delta_exact.cuh)
#pragma once

#include <cstdint>

#include "backward_common.cuh"
#include "kernel_params.cuh"
#include "stableflash/attention/modes.hpp"
#include "stableflash/attention/rounding_points.hpp"
#include "tma.cuh"
#include "warp_mma.cuh"

namespace stableflash::attention::cuda {

// rounded / compensated, one lane's part of a row: 8 elements (one 16-byte load of each tensor),
// summed in element order. The delta kernels of the kernel lab (lab/backward_small_v1.cuh) keep the
// same expression: the order of these operations (and nvcc's contraction of them) is the GPU's
// delta bits, which the GPU tests pin (grouped-query runs equal multi-head runs bit for bit).
__device__ __forceinline__ float delta_lane_part(uint4 o, uint4 d, uint4 r, bool compensated) {
  const std::uint32_t ov[4] = {o.x, o.y, o.z, o.w}, dv[4] = {d.x, d.y, d.z, d.w}, rv[4] = {r.x, r.y, r.z, r.w};
  float sum = 0.0f;
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    // O + r in FP32 is O_fp32 to within 2^-8 of O's rounding error (docs/numerics-contract.md)
    const float o_lo = compensated ? add_rn(bf16_lo(ov[w]), bf16_lo(rv[w])) : bf16_lo(ov[w]);
    const float o_hi = compensated ? add_rn(bf16_hi(ov[w]), bf16_hi(rv[w])) : bf16_hi(ov[w]);
    sum += bf16_lo(dv[w]) * o_lo + bf16_hi(dv[w]) * o_hi;
  }
  return sum;
}

// Launch shape of delta_from_output_kernel: 256 threads, each with kDeltaRowsPerThread rows' loads
// in flight (3 x 16 bytes a row) before it sums any; grid (ceil(H Tq / rows per CTA), min(B, 65535)).
inline constexpr int kDeltaThreads = 256, kDeltaRowsPerThread = 2;
template <int D>
inline constexpr int kDeltaRowsPerCta = kDeltaThreads / (D / 8) * kDeltaRowsPerThread;

// rounded / compensated: D/8 lanes per row (a row's lanes within one warp), one 16-byte load of
// each tensor per lane, the lanes' parts added by a shuffle tree (offsets D/16 .. 1): the sum order
// of the delta kernels before this one (lab/backward_small_v1.cuh), so the same bits.
// Rows are walked in the memory order of o (heads inner for [B, T, H, D] tensors, positions inner
// for [B, H, T, D]); the row of a CTA's pass is found with 32-bit divisions (H Tq < 2^31:
// check_tensors checks), not 64-bit ones (the earlier kernel had three for every 48 bytes it read).
// Each CTA also clears its share of p.zero_words (clear_zero_word_share).
template <int D, bool kPaper>
__global__ void __launch_bounds__(kDeltaThreads) delta_from_output_kernel(const __grid_constant__ BackwardParams p) {
  constexpr int kLanes = D / 8, kRowsPerPass = kDeltaThreads / kLanes, kPasses = kDeltaRowsPerThread;
  allow_dependent_launch();  // the main kernel's CTAs may start their prologue (they wait for this grid's end)
  clear_zero_word_share(p);
  const unsigned rows_per_batch = unsigned(p.heads) * unsigned(p.q_len);
  const int lane_in_row = threadIdx.x % kLanes;
  const bool compensated = p.delta_source == static_cast<int>(DeltaSource::compensated);
  const bool heads_inner = p.o_strides.h < p.o_strides.t;  // only the order of the walk; any strides work
  for (int bb = blockIdx.y; bb < p.batch; bb += gridDim.y) {
    uint4 o[kPasses], d[kPasses], r[kPasses];
    int hh[kPasses], ii[kPasses];
#pragma unroll
    for (int k = 0; k < kPasses; ++k) {  // every load before any use: 3 kPasses 16-byte loads in flight
      const unsigned q = (blockIdx.x * kPasses + k) * unsigned(kRowsPerPass) + threadIdx.x / kLanes;
      hh[k] = -1;
      o[k] = d[k] = r[k] = make_uint4(0, 0, 0, 0);
      if (q >= rows_per_batch) continue;
      const unsigned outer = heads_inner ? q / unsigned(p.heads) : q / unsigned(p.q_len);
      const unsigned inner = q - outer * (heads_inner ? unsigned(p.heads) : unsigned(p.q_len));
      hh[k] = int(heads_inner ? inner : outer), ii[k] = int(heads_inner ? outer : inner);
      const std::int64_t at_o = p.o_strides.head(bb, hh[k]) + ii[k] * p.o_strides.t + lane_in_row * 8;  // o and o_residual
      const std::int64_t at_do = p.d_o_strides.head(bb, hh[k]) + ii[k] * p.d_o_strides.t + lane_in_row * 8;
      o[k] = __ldcs(reinterpret_cast<const uint4*>(p.o + at_o));  // read once: stream past L2
      d[k] = *reinterpret_cast<const uint4*>(p.d_o + at_do);      // dO: read again by the main kernel
      if (compensated) r[k] = __ldcs(reinterpret_cast<const uint4*>(p.o_residual + at_o));
    }
#pragma unroll
    for (int k = 0; k < kPasses; ++k) {
      float sum = delta_lane_part(o[k], d[k], r[k], compensated);  // 0 for rows past the end
#pragma unroll
      for (int off = kLanes / 2; off >= 1; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
      if (hh[k] >= 0 && lane_in_row == 0)
        p.delta[(std::int64_t(bb) * p.heads + hh[k]) * p.q_len + ii[k]] = (kPaper && !compensated) ? paper::delta(sum) : sum;
    }
  }
}

// dQ = BF16(acc * scale) (fused: the scale multiplies the FP32 product; paper's dS carries it), from
// the wgmma kernel's fragment-ordered workspace (DqFragmentOrder). A CTA converts one [64 queries,
// 64 dims] tile, warp w its queries 16 w .. 16 w + 15: eight coalesced 512-byte loads (one per dim
// group j, this lane's float4 = two dims 8 j + 2 t, + 1 of queries 16 w + g and + 8, all in flight
// before any use), then store_dq_part_rows (backward_common.cuh: the BF16 pairs exchanged within
// each quad, 16-byte stores, 8-byte pairs where dq's rows are only 8-byte aligned: `store16`).
// Each element is mul_rn then RN to BF16, as before (lab/backward_small_v1.cuh), after adding +0: a
// tile that its first key block stored (dq_first_store) may hold -0 where the sum into a cleared
// workspace read +0. A tile no key block reached (dq_first_store: its claim, or in deterministic
// mode its block's turn counter, still 0; causal rows that see no key) is not read: its dQ is 0.
// Padding rows past Tq are not stored. Not launched where the main kernel stores dq itself
// (BackwardParams::dq_direct). blockIdx.x = the tile's index in the workspace
// ((b H + h) blocks + query block) D / 64 + dim tile, < 2^31 (check_tensors checks).
inline constexpr int kDqConvertThreads = 128;
template <int D>
__global__ void __launch_bounds__(kDqConvertThreads) dq_convert_fragments_kernel(const __grid_constant__ BackwardParams p,
                                                                                float product_scale, int store16) {
  constexpr int kDimTiles = D / 64, kGroups = 8;  // dim groups j of 8 dims in a tile
  static_assert(DqFragmentOrder::kTileFloats == kGroups * kDqConvertThreads * 4, "a tile is [8 j][128 threads][4]");
  const unsigned tile_index = blockIdx.x, n_blocks = unsigned(DqFragmentOrder::blocks(p.q_len));
  const unsigned block = tile_index / kDimTiles, bh = block / n_blocks;
  const int dim_tile = int(tile_index % kDimTiles), qb = int(block - bh * n_blocks);
  const int hh = int(bh % unsigned(p.heads)), bb = int(bh / unsigned(p.heads));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float4* tile = reinterpret_cast<const float4*>(p.dq_accum) + std::int64_t(tile_index) * (DqFragmentOrder::kTileFloats / 4);
  grid_dependency_wait();  // the main kernel's programmatic dependent: its workspace is complete past this
  const bool reached = !p.dq_first_store || (p.dq_claims ? p.dq_claims[tile_index] : p.dq_semaphore[block]) != 0;
  float4 a[kGroups];
#pragma unroll
  for (int j = 0; j < kGroups; ++j) {
    const float4 v = reached ? __ldcs(tile + j * kDqConvertThreads + threadIdx.x) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);  // read once
    a[j] = make_float4(__fadd_rn(v.x, 0.0f), __fadd_rn(v.y, 0.0f), __fadd_rn(v.z, 0.0f), __fadd_rn(v.w, 0.0f));
  }
  std::uint16_t* part = p.dq + p.dq_strides.head(bb, hh) + std::int64_t(qb) * DqFragmentOrder::kBlockQ * p.dq_strides.t + dim_tile * 64;
  store_dq_part_rows(part, p.dq_strides.t, p.q_len - qb * DqFragmentOrder::kBlockQ, product_scale, store16 != 0, warp, lane,
                     [&](int j) { return a[j]; });
}

}  // namespace stableflash::attention::cuda
