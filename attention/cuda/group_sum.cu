// dK, dV of grouped-query attention (numerics-contract.md "Grouped-query"): the backward's main kernel writes
// every query head's BF16 dK, dV (exactly the multi-head result of that head) into a workspace
// [B, H, Tk, D]; this kernel sums them per K/V head in ascending query-head order in FP32 (the first
// head's value taken as is, one round-to-nearest addition per further head) and rounds once to
// BF16, the CPU's GroupGradientSum bit for bit. No atomics: each output element has one thread,
// which reads its group's values in order, so the result is the same on every run.
#include <cuda_runtime.h>

#include <cstdint>

#include "group_sum.hpp"
#include "launch.hpp"
#include "stableflash/numerics/fp32_ops.hpp"
#include "warp_mma.cuh"

namespace stableflash::attention::cuda {
namespace {

// One thread per 4 consecutive elements of a row (8 bytes: dk, dv rows are 8-byte aligned,
// plan.cpp's check_tensor).
__global__ void __launch_bounds__(kGroupSumThreads) group_sum_kernel(const __grid_constant__ GroupSumParams p) {
  const int quads_per_row = p.head_dim / 4;
  const std::int64_t idx = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= std::int64_t(p.batch) * p.kv_heads * p.len * quads_per_row) return;
  const int d = int(idx % quads_per_row) * 4;
  const std::int64_t row = idx / quads_per_row;  // (b, kv head, t)
  const int t = int(row % p.len), kvh = int(row / p.len % p.kv_heads), b = int(row / p.len / p.kv_heads);
  const int heads = p.kv_heads * p.group;
  const std::uint16_t* src = p.per_head + ((std::int64_t(b) * heads + std::int64_t(kvh) * p.group) * p.len + t) * p.head_dim + d;
  const std::int64_t head_step = std::int64_t(p.len) * p.head_dim;  // the next query head of the group
  float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // set from the first head (g == 0)
  for (int g = 0; g < p.group; ++g) {
    const uint2 x = *reinterpret_cast<const uint2*>(src + g * head_step);
    const float v[4] = {bf16_lo(x.x), bf16_hi(x.x), bf16_lo(x.y), bf16_hi(x.y)};
#pragma unroll
    for (int e = 0; e < 4; ++e) sum[e] = g == 0 ? v[e] : add_rn(sum[e], v[e]);
  }
  uint2 out;
  out.x = pack_bf16x2(sum[0], sum[1]), out.y = pack_bf16x2(sum[2], sum[3]);
  *reinterpret_cast<uint2*>(p.out + p.out_strides.head(b, kvh) + t * p.out_strides.t + d) = out;
}

}  // namespace

void launch_group_sum(const GroupSumParams& p, cudaStream_t stream) {
  const std::int64_t threads = std::int64_t(p.batch) * p.kv_heads * p.len * (p.head_dim / 4);
  // < 2^31 CTAs: check_tensors
  group_sum_kernel<<<unsigned((threads + kGroupSumThreads - 1) / kGroupSumThreads), kGroupSumThreads, 0, stream>>>(p);
  check_cuda(cudaGetLastError(), "attention dK/dV group sum launch");
}

}  // namespace stableflash::attention::cuda
