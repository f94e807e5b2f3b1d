// The classifier end of the CUDA GPT-2: softmax cross-entropy over BF16 logits (loss and, in
// place, the logit gradient) and the deterministic scaled sum that turns per-row losses into the
// mean loss. Contract: stableflash/model/cuda/layer_kernels.hpp; CPU twins:
// softmax_cross_entropy_forward/backward in stableflash/model/layers.hpp. The kernel that GPT-2's
// rows take is in softmax_cross_entropy_cluster.cuh (shared with model/cuda/lab/ce_lab.cu); the
// two-pass kernel here takes rows of more than 57,344 logits, unaligned logits and Vp not a
// multiple of 8 (its scalar variant).
#include <cmath>

#include "reduce.cuh"
#include "softmax_cross_entropy_cluster.cuh"
#include "stableflash/model/cuda/device_array.hpp"
#include "stableflash/model/cuda/layer_kernels.hpp"

namespace stableflash::model::cuda {
namespace {

using detail::aligned16;
using detail::block_sum;
using detail::kVec;
using detail::load;
using detail::MaxSum;
using detail::store;

// The two-pass kernel, for rows the cluster kernel (softmax_cross_entropy_cluster.cuh) does not
// take: a block per row; 50304 logits are ~12 chunks of kVec per thread, enough to hide latency.
constexpr int kSoftmaxThreads = 512;
constexpr int kSumThreads = 1024;
// Merging two (max, sum of exp(l - max)) pairs rescales the smaller-max sum; an empty side
// (max = -inf, sum = 0) contributes exp(-inf) * 0 = 0, and two empty sides stay empty (no inf - inf).

__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.max, b.max);
  if (m == -INFINITY) return a;
  return {m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}

__device__ __forceinline__ MaxSum warp_merge(MaxSum v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const MaxSum other{__shfl_xor_sync(0xffffffffu, v.max, offset), __shfl_xor_sync(0xffffffffu, v.sum, offset)};
    v = merge(v, other);
  }
  return v;
}

// Lane 0 of warp 0 holds the block's result; it is broadcast through shared memory so every
// thread uses the same bits.
__device__ __forceinline__ MaxSum block_merge(MaxSum v) {
  __shared__ MaxSum warp_vals[32];
  __shared__ MaxSum total;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_merge(v);
  if (lane == 0) warp_vals[warp] = v;
  __syncthreads();
  if (warp == 0) {
    MaxSum w = lane < int(blockDim.x >> 5) ? warp_vals[lane] : MaxSum{-INFINITY, 0.0f};
    w = warp_merge(w);
    if (lane == 0) total = w;
  }
  __syncthreads();
  return total;
}

// One pass over the row for (max, sum) with a rescale per chunk (not per element), then, when
// grad_scale != 0, a second pass (from L2: a 100 KB row) that overwrites the logits by the gradient.
template <int W>
__global__ void __launch_bounds__(kSoftmaxThreads)
    softmax_cross_entropy_kernel(bf16_t* logits, float* losses, const int* targets, int Vp, float grad_scale) {
  const std::int64_t r = blockIdx.x;
  bf16_t* row = logits + r * Vp;  // [Vp]
  const int target = targets[r];  // ids checked by the caller
  // Read before block_merge's barriers: no thread rewrites the row before every thread passed them.
  const float target_logit = threadIdx.x == 0 ? __bfloat162float(row[target]) : 0.0f;

  MaxSum acc{-INFINITY, 0.0f};
  for (int v = threadIdx.x * W; v < Vp; v += kSoftmaxThreads * W) {
    float l[W];
    load<W>(l, row + v);
    float chunk_max = l[0];
#pragma unroll
    for (int k = 1; k < W; ++k) chunk_max = fmaxf(chunk_max, l[k]);
    if (chunk_max == -INFINITY) continue;  // an all -inf chunk adds nothing
    MaxSum chunk{chunk_max, 0.0f};
#pragma unroll
    for (int k = 0; k < W; ++k) chunk.sum += expf(l[k] - chunk_max);  // expf, not __expf: ~2 ulp
    acc = merge(acc, chunk);
  }
  const MaxSum row_stats = block_merge(acc);
  if (threadIdx.x == 0) losses[r] = logf(row_stats.sum) - (target_logit - row_stats.max);  // no log of an underflowed exp

  if (grad_scale == 0.0f) return;
  const float inv_sum = 1.0f / row_stats.sum;
  for (int v = threadIdx.x * W; v < Vp; v += kSoftmaxThreads * W) {
    float l[W];
    load<W>(l, row + v);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const float p = expf(l[k] - row_stats.max) * inv_sum;
      l[k] = grad_scale * (p - (v + k == target ? 1.0f : 0.0f));
    }
    store<W>(row + v, l);
  }
}

// One block: thread i sums values i, i + blockDim, ... in order, then a fixed tree over threads.
__global__ void sum_scaled_kernel(float* out, const float* values, std::int64_t n, float scale, bool accumulate) {
  float s = 0.0f;
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) s += values[i];
  s = block_sum(s);
  if (threadIdx.x == 0) *out = (accumulate ? *out : 0.0f) + scale * s;
}

}  // namespace

void softmax_cross_entropy(bf16_t* logits, float* losses, const int* targets, int rows, int Vp, float grad_scale,
                           cudaStream_t stream) {
  if (rows == 0) return;
  if (Vp % kVec == 0 && aligned16(logits) && Vp <= detail::kClusterMaxVp)
    detail::softmax_cross_entropy_cluster_kernel<detail::kClusterCtas>
        <<<unsigned(rows) * detail::kClusterCtas, detail::kClusterRowThreads / detail::kClusterCtas, 0, stream>>>(logits, losses, targets,
                                                                                                                    Vp, grad_scale);
  else if (Vp % kVec == 0 && aligned16(logits))
    softmax_cross_entropy_kernel<kVec><<<unsigned(rows), kSoftmaxThreads, 0, stream>>>(logits, losses, targets, Vp, grad_scale);
  else
    softmax_cross_entropy_kernel<1><<<unsigned(rows), kSoftmaxThreads, 0, stream>>>(logits, losses, targets, Vp, grad_scale);
  check_cuda(cudaGetLastError(), "softmax_cross_entropy_kernel");
}

void sum_scaled(float* out, const float* values, std::int64_t n, float scale, bool accumulate, cudaStream_t stream) {
  sum_scaled_kernel<<<1, kSumThreads, 0, stream>>>(out, values, n, scale, accumulate);
  check_cuda(cudaGetLastError(), "sum_scaled_kernel");
}

}  // namespace stableflash::model::cuda
