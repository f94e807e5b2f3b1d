// Device helpers shared by the layer kernels (layer_kernels.cu, classifier_kernels.cu): vector
// loads and stores that turn BF16 and FP32 into FP32 registers, and warp/block sums. Every sum
// here combines values in one fixed pattern, so a kernel built on them is bitwise deterministic.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace stableflash::model::cuda::detail {

using bf16_t = __nv_bfloat16;

// Elements per 16-byte access for BF16; FP32 uses two 16-byte accesses for the same count, so one
// width serves rows that mix the two types (e.g. an FP32 residual and a BF16 branch).
constexpr int kVec = 8;

inline bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

// W = kVec: 16-byte accesses, the caller guarantees alignment; W = 1: the scalar fallback.
template <int W>
__device__ __forceinline__ void load(float (&v)[W], const float* p) {
  if constexpr (W == kVec) {
    const float4 a = reinterpret_cast<const float4*>(p)[0];
    const float4 b = reinterpret_cast<const float4*>(p)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
#pragma unroll
    for (int i = 0; i < W; ++i) v[i] = p[i];
  }
}

template <int W>
__device__ __forceinline__ void load(float (&v)[W], const bf16_t* p) {
  if constexpr (W == kVec) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < W / 2; ++i) {
      const float2 f = __bfloat1622float2(h[i]);
      v[2 * i] = f.x, v[2 * i + 1] = f.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < W; ++i) v[i] = __bfloat162float(p[i]);
  }
}

template <int W>
__device__ __forceinline__ void store(float* p, const float (&v)[W]) {
  if constexpr (W == kVec) {
    reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
  } else {
#pragma unroll
    for (int i = 0; i < W; ++i) p[i] = v[i];
  }
}

// Round to nearest even per element (the header's BF16(.)).
template <int W>
__device__ __forceinline__ void store(bf16_t* p, const float (&v)[W]) {
  if constexpr (W == kVec) {
    uint4 raw;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < W / 2; ++i) h[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
    *reinterpret_cast<uint4*>(p) = raw;
  } else {
#pragma unroll
    for (int i = 0; i < W; ++i) p[i] = __float2bfloat16_rn(v[i]);
  }
}

// Butterfly sum: a fixed combination pattern, and every lane ends with the same bits (float
// addition is commutative, so partners compute identical sums).
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum over a 1-D block (blockDim.x a multiple of 32, at most 1024); the result is returned to
// every thread. Contains barriers: all threads of the block must call it.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float warp_sums[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  const int warps = blockDim.x >> 5;
  float total = lane < warps ? warp_sums[lane] : 0.0f;
  total = warp_sum(total);  // every warp computes the same total from the same shared values
  __syncthreads();          // warp_sums may be reused by a later call
  return total;
}

}  // namespace stableflash::model::cuda::detail
