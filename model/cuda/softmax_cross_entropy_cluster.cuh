// The classifier's softmax cross-entropy (loss and, in place, the logit gradient) with each row
// split over a thread-block cluster. A template on the cluster's size so that the lab
// (model/cuda/lab/ce_lab.cu) times other shapes from the same code; classifier_kernels.cu launches
// kClusterCtas. Contract: softmax_cross_entropy in stableflash/model/cuda/layer_kernels.hpp.
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "reduce.cuh"

namespace stableflash::model::cuda::detail {

// A (max, sum of exp(l - max)) pair; {-inf, 0} holds nothing.
struct MaxSum {
  float max;
  float sum;
};

// Every shape puts kClusterRowThreads threads on a row, each holding kClusterRounds chunks of kVec
// logits in registers: rows of up to kClusterMaxVp = 57,344 logits (GPT-2's 50,304 padded ids take 7
// rounds, the last 144 chunks of 1,024); longer rows take the two-pass kernel. A row's 32 warps'
// partials are combined one per lane of a warp.
constexpr int kClusterRowThreads = 1024;
constexpr int kClusterRounds = 7;
constexpr int kClusterMaxVp = kClusterRowThreads * kClusterRounds * kVec;
static_assert(kClusterRowThreads / 32 == 32, "the warp partials are combined one per lane of a warp");
// The production shape: one CTA of 1,024 threads per row. Measured on the H200 (ce_lab, [2560, 50304],
// L2 flushed, the same bits from every shape): backward 146 us at 1 x 1024, 155 / 157 / 160 us with
// clusters of 2 x 512, 4 x 256, 8 x 128; the kernel it replaced 208.5 us. The cheaper arithmetic
// below paid, the cluster did not (it pays only in the loss-only pass: 81 against 90 us at 2 x 512).
constexpr int kClusterCtas = 1;

// exp(l - m) for l <= m as 2^((l - m) log2 e) by the hardware's ex2.approx.ftz: one instruction
// where expf takes about eight (with expf, the exps alone were half of the cluster kernel's work).
// Its error is exp2f's documented 2 ulp (exp2f is the same instruction with subnormal results kept);
// results below 2^-126 (l - m < -87.3) are flushed to 0. The rounded difference, the rounded product
// and the FP32 constant (0.224u from log2 e) add 2.224u |l - m| to the exponent's error (u = 2^-24);
// the GPU test's bound counts all of it.
__device__ __forceinline__ float exp_shifted(float l, float m) {
  float e;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"((l - m) * 1.44269504f));
  return e;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// The (max, sum of exp(l - max)) of a warp's lanes: the maximum first, then each lane's sum rescaled
// once to it and added in a butterfly (every lane ends with the same bits). Cheaper and with fewer
// roundings than merging pairs level by level (two exps a level). A lane with no finite logit
// ({-inf, 0}) adds 0; with the warp's maximum -inf too, exp(-inf - -inf) would be NaN.
__device__ __forceinline__ MaxSum warp_max_sum(MaxSum v) {
  const float m = warp_max(v.max);
  return {m, warp_sum(v.max == -INFINITY ? 0.0f : v.sum * exp_shifted(v.max, m))};
}

// Eight BF16 logits to FP32 (exact): a BF16 is the high half of its FP32, element 2i the low half
// of word i.
__device__ __forceinline__ void to_floats(const uint4& raw, float (&l)[kVec]) {
  const unsigned w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < kVec / 2; ++i) {
    l[2 * i] = __uint_as_float(w[i] << 16);
    l[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

// The loss and gradient with each row read from memory once and split over a thread-block cluster:
// kCtas CTAs of kThreads = 1,024 / kCtas threads, each thread keeping its chunks of kVec logits in
// registers as BF16 (4 registers a chunk). A thread takes the maximum of its logits (on BF16 pairs,
// exact) and the sum of exp(l - its max); the 1,024 threads' (max, sum) pairs are combined per warp
// (warp_max_sum), every warp writes its pair into every CTA of the cluster (distributed shared
// memory), and after one cluster barrier every warp combines the same 32 pairs in the same lanes
// the same way: every thread holds the same bits of the row's (max, sum), and no CTA touches
// another's shared memory after the barrier, so none waits for the others before it exits. Then
// each thread writes the gradient over its chunks.
// Why clusters were tried: the kernel it replaced ran one 1024-thread CTA per row, one per SM (its
// registers), so each SM's loads, block reductions and exp/store phase took turns (2.45 TB/s, 192 us
// per 2,341-row chunk; docs/benchmarks.md); 128-thread CTAs of different rows would sit on an SM at
// different stages. Measured, the cheaper arithmetic alone (kCtas = 1, production) was faster than
// every cluster shape in the backward (kClusterCtas above); the lab keeps timing them.
// The per-thread max before the sum makes one reduction of (max, sum) pairs instead of a max and
// then a sum (one cluster round trip instead of two).
template <int kCtas>
__global__ void __cluster_dims__(kCtas, 1, 1) __launch_bounds__(kClusterRowThreads / kCtas)
    softmax_cross_entropy_cluster_kernel(bf16_t* logits, float* losses, const int* targets, int Vp, float grad_scale) {
  constexpr int kThreads = kClusterRowThreads / kCtas;
  static_assert(kThreads % 32 == 0 && kCtas * kThreads == kClusterRowThreads, "whole warps, 1,024 threads a row");
  namespace cg = cooperative_groups;
  const cg::cluster_group cluster = cg::this_cluster();
  const int rank = int(cluster.block_rank());
  const std::int64_t r = blockIdx.x / kCtas;
  bf16_t* row = logits + r * Vp;  // [Vp]
  const int target = targets[r];  // ids checked by the caller
  const int chunks = Vp / kVec;
  // Round j of thread t in CTA `rank` holds chunk c = j kClusterRowThreads + rank kThreads + t, the
  // logits [c kVec, (c + 1) kVec): a CTA reads kThreads x 16 bytes in one piece per round, and a
  // thread's chunks are those of thread rank kThreads + t of the row whatever kCtas (so every shape
  // gives the same bits). Chunks past the row hold -inf, which no maximum takes.
  __cluster_barrier_arrive_relaxed();  // "this CTA has started"; waited for before the partials are exchanged
  const int first = rank * kThreads + int(threadIdx.x);
  constexpr unsigned kNegInfPair = 0xff80ff80u;  // two BF16 -inf
  uint4 raw[kClusterRounds];
#pragma unroll
  for (int j = 0; j < kClusterRounds; ++j) {
    const int c = j * kClusterRowThreads + first;
    raw[j] = c < chunks ? reinterpret_cast<const uint4*>(row)[c] : make_uint4(kNegInfPair, kNegInfPair, kNegInfPair, kNegInfPair);
  }
  // Read before the cluster barrier below, which every CTA passes before it writes a gradient.
  const float target_logit = rank == 0 && threadIdx.x == 0 ? __bfloat162float(row[target]) : 0.0f;

  __nv_bfloat162 max2 = __float2bfloat162_rn(-INFINITY);
#pragma unroll
  for (int j = 0; j < kClusterRounds; ++j) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw[j]);
#pragma unroll
    for (int i = 0; i < kVec / 2; ++i) max2 = __hmax2(max2, h[i]);
  }
  MaxSum acc{fmaxf(__low2float(max2), __high2float(max2)), 0.0f};
  if (acc.max != -INFINITY) {  // only -inf here: {-inf, 0}, which warp_max_sum counts as nothing
#pragma unroll
    for (int j = 0; j < kClusterRounds; ++j) {
      if (j * kClusterRowThreads + first >= chunks) continue;
      float l[kVec];
      to_floats(raw[j], l);
#pragma unroll
      for (int k = 0; k < kVec; ++k) acc.sum += exp_shifted(l[k], acc.max);
    }
  }

  // Every warp's (max, sum) goes into every CTA's copy of the row's 32 partials (lane k of the warp
  // writes into CTA k), so that after the barrier each CTA reads only its own shared memory and may
  // exit without waiting for the others.
  constexpr int kWarps = kThreads / 32;
  __shared__ MaxSum row_partials[kClusterRowThreads / 32];  // [CTA rank, warp]
  const int lane = int(threadIdx.x) & 31;
  acc = warp_max_sum(acc);
  __cluster_barrier_wait();  // every CTA of the cluster has started: its shared memory may be written
  if (lane < kCtas) *cluster.map_shared_rank(&row_partials[rank * kWarps + (int(threadIdx.x) >> 5)], lane) = acc;
  __cluster_barrier_arrive();  // release at cluster scope: the writes above before any CTA's wait returns
  __cluster_barrier_wait();    // acquire: all 32 partials are here
  // Every warp of the cluster combines the same 32 values in the same lanes (the warps in row order).
  const MaxSum row_stats = warp_max_sum(row_partials[lane]);
  // No log of an underflowed exp. A row without a finite logit gives NaN (inf - inf), as the CPU twin.
  if (rank == 0 && threadIdx.x == 0) losses[r] = logf(row_stats.sum) - (target_logit - row_stats.max);

  if (grad_scale == 0.0f) return;
  // grad_scale exp(l - max) / sum with one product per logit (the scale and 1 / sum multiplied once);
  // the target's logit as grad_scale (p - 1).
  const float inv_sum = 1.0f / row_stats.sum;
  const float scaled_inv_sum = grad_scale * inv_sum;
#pragma unroll
  for (int j = 0; j < kClusterRounds; ++j) {
    const int c = j * kClusterRowThreads + first;
    if (c >= chunks) continue;
    float l[kVec], g[kVec];
    to_floats(raw[j], l);
#pragma unroll
    for (int k = 0; k < kVec; ++k) g[k] = exp_shifted(l[k], row_stats.max) * scaled_inv_sum;
    const int target_k = target - c * kVec;
    if (unsigned(target_k) < unsigned(kVec)) {  // one chunk of the row holds the one-hot's 1
#pragma unroll
      for (int k = 0; k < kVec; ++k)
        if (k == target_k) g[k] = grad_scale * (exp_shifted(l[k], row_stats.max) * inv_sum - 1.0f);
    }
    store<kVec>(row + std::int64_t(c) * kVec, g);
  }
}

}  // namespace stableflash::model::cuda::detail
