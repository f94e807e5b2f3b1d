// The summation order of the `exact` delta (docs/numerics-contract.md `delta_source`: FP32
// rowsum(dP P), in an order of the kernels' choosing) where a row's keys fit one backward CTA (Tk <=
// 128, BackwardPlan::dq_direct). There the main backward kernel forms the delta itself from the P
// and dP it computes anyway (DeltaPass::in_main: no pass over the keys, no delta from the output),
// and the exact pass, which attention_delta still runs alone, adds in the same order, so that both
// give the same bits from the same P and dP (BackwardGpu.DeltaAloneEqualsTheBackwardsDeltaBitForBit;
// the tensor cores' transposed products, K Q^T and V dO^T here, Q K^T and dO V^T there, agree bit for
// bit: a first GPU run that found the two apart had the pass quad-summing each row twice):
//   a 16-key group w (keys 16 w ..): a_g = P_g dP_g + P_(g+8) dP_(g+8) (one multiply, one FMA) for
//     g = 0..7, then ((a_0 + a_1) + (a_2 + a_3)) + ((a_4 + a_5) + (a_6 + a_7)) = G_w;
//   the row's delta: ((0 + G_0) + G_1) + ... + G_7, the groups in key order.
// The tree over g is what each kernel's fragments give with shuffles: the backward's transposed
// fragments hold keys g, g + 8 of a warp's 16 in lane group g (lanes 4g..4g+3), so a butterfly over
// lanes xor 4, 8, 16 adds a_g, a_(g^1), then pairs, then quads; the pass's hold keys 2t, 2t + 1 (and
// + 8) in quad lane t, so an in-thread add of a_2t, a_(2t+1) and the quad's butterfly (xor 1, 2)
// add the same pairs the same way (floating-point addition commutes bit for bit).
// (dP: the mode's, paper::dprob(dP) in `paper` numerics, as dS uses it.)
#pragma once

#include "stableflash/attention/rounding_points.hpp"
#include "tma.cuh"

namespace stableflash::attention::cuda {

// Keys per group of the order above, and groups per row (the backward CTA's 128 keys).
inline constexpr int kExactDeltaGroupKeys = 16;
inline constexpr int kExactDeltaGroups = 8;

// a_g of the order above: keys g and g + 8 of a group
__device__ __forceinline__ float exact_delta_key_pair(float p_g, float dp_g, float p_g8, float dp_g8) {
  return __fmaf_rn(p_g8, dp_g8, __fmul_rn(p_g, dp_g));
}

// c ? a : b on values (selp): written as an array element choice, nvcc chose between the elements'
// addresses and moved the array to local memory
__device__ __forceinline__ float select_value(bool c, float a, float b) {
  float r;
  asm("{\n .reg .pred p;\n setp.ne.b32 p, %3, 0;\n selp.f32 %0, %1, %2, p;\n}\n" : "=f"(r) : "f"(a), "f"(b), "r"(int(c)));
  return r;
}

// One level of block_exact_delta's reduce-scatter: of v[0 .. 2N), keep the half `upper` selects,
// plus the partner lane's (lane ^ lane_mask) value of it, in v[0 .. N). N is a template argument so
// that every index is a constant (a run-time bound moved v to local memory).
template <int N, int M>
__device__ __forceinline__ void scatter_half(float (&v)[M], bool upper, int lane_mask) {
  static_assert(2 * N <= M);
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const float give = select_value(upper, v[i], v[i + N]), keep = select_value(upper, v[i + N], v[i]);
    v[i] = __fadd_rn(keep, __shfl_xor_sync(0xffffffffu, give, lane_mask));
  }
}

// dP as dS uses it: paper::dprob (BF16) in `paper` numerics, the FP32 product in `fused`
template <bool kPaper>
__device__ __forceinline__ float exact_delta_dprob(float dp) {
  return kPaper ? paper::dprob(dp) : dp;
}

// The main backward kernel's delta of one 64-query block (DeltaPass::in_main). Consumer cw's warps
// hold P (st, after form_probs) and dP^T (dpt) of their 16 keys for the block's queries: element
// (nq, e) is key 16 warp + g + 8 (e / 2) of the consumer's 64, query 8 nq + 2t + (e % 2). Each warp
// sums its group (w = 4 cw + warp) for every query into partials [kExactDeltaGroups][64], every
// consumer thread waits for all eight groups (named barrier `all_bar`, both consumers' 256
// threads), then threads 0-63 of each consumer add query tid's groups in key order
// into the consumer's own delta [64] and the consumer's threads wait for them (`mine_bar`, 128):
// the delta dS reads, returned. Consumer 0 also stores it to delta_out[0 .. q_valid). The caller
// alternates two partials buffers between blocks: block i + 2's go where block i's were, written
// only after `all_bar` of block i + 1, which every thread reaches after its reads of block i's.
// delta needs no second buffer: every thread of the consumer has read block i's (its dS) before
// `all_bar` of block i + 1, after which block i + 1's is written.
template <bool kPaper, int NQ>
__device__ __forceinline__ const float* block_exact_delta(const float (&st)[NQ][4], const float (&dpt)[NQ][4], float* partials,
                                                          float* delta, int cw, int tid, int all_bar, int mine_bar,
                                                          float* delta_out, int q_valid) {
  static_assert(NQ == 8, "64 queries: 16 per thread, two per lane after the butterfly");
  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  // v[k]: a_g of query 8 (k / 2) + 2t + k % 2
  float v[2 * NQ];
#pragma unroll
  for (int nq = 0; nq < NQ; ++nq)
#pragma unroll
    for (int e2 = 0; e2 < 2; ++e2)
      v[2 * nq + e2] = exact_delta_key_pair(st[nq][e2], exact_delta_dprob<kPaper>(dpt[nq][e2]), st[nq][e2 + 2],
                                            exact_delta_dprob<kPaper>(dpt[nq][e2 + 2]));
  // The butterfly over lane groups xor 4, 8, 16 (g ^ 1, ^ 2, ^ 4) as a reduce-scatter: at each level
  // a lane keeps the half of its queries that its bit of g selects and adds the partner's value of
  // it, so each sum is the same as in a full butterfly (the partners' values in the other order,
  // which gives the same bits) for 14 shuffles instead of 48. After it, lane (g, t) holds the group
  // sums G of queries 8 nq + 2t, + 1 with nq = 4 (g & 1) + 2 (g >> 1 & 1) + (g >> 2).
  scatter_half<NQ>(v, g & 1, 4);         // level 0: lane group g ^ 1
  scatter_half<NQ / 2>(v, g >> 1 & 1, 8);  // level 1: g ^ 2
  scatter_half<NQ / 4>(v, g >> 2 & 1, 16); // level 2: g ^ 4
  const int nq = 4 * (g & 1) + 2 * ((g >> 1) & 1) + (g >> 2);
  *reinterpret_cast<float2*>(partials + (4 * cw + warp) * 64 + nq * 8 + 2 * t) = make_float2(v[0], v[1]);
  named_barrier_sync(all_bar, 256);
  if (tid < 64) {
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kExactDeltaGroups; ++w) sum = __fadd_rn(sum, partials[w * 64 + tid]);
    delta[tid] = sum;
    if (cw == 0 && tid < q_valid) delta_out[tid] = sum;
  }
  named_barrier_sync(mine_bar, 128);
  return delta;
}

}  // namespace stableflash::attention::cuda
