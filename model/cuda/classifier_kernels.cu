// The classifier end of the CUDA GPT-2: softmax cross-entropy over BF16 logits (loss and, in
// place, the logit gradient) and the deterministic scaled sum that turns per-row losses into the
// mean loss. Contract: stableflash/model/cuda/layer_kernels.hpp; CPU twins:
// softmax_cross_entropy_forward/backward in stableflash/model/layers.hpp.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>

#include "reduce.cuh"
#include "stableflash/model/cuda/device_array.hpp"
#include "stableflash/model/cuda/layer_kernels.hpp"

namespace stableflash::model::cuda {
namespace {

using detail::aligned16;
using detail::block_sum;
using detail::kVec;
using detail::load;
using detail::store;

// A block per row: 50304 logits are ~12 chunks of kVec per thread, enough to hide latency.
constexpr int kSoftmaxThreads = 512;
constexpr int kSumThreads = 1024;
// The register-resident kernel: a row of up to kResidentThreads * kResidentChunks * kVec logits
// (65,536: GPT-2's 50,304 padded ids take 7 chunks per thread) read once into registers as BF16.
constexpr int kResidentThreads = 1024;
constexpr int kResidentChunks = 8;

// A running (max, sum of exp(l - max)) pair. Merging rescales the smaller-max sum; an empty side
// (max = -inf, sum = 0) contributes exp(-inf) * 0 = 0, and two empty sides stay empty (no inf - inf).
struct MaxSum {
  float max;
  float sum;
};

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

__device__ __forceinline__ float block_max(float v) {
  __shared__ float warp_maxes[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  if (lane == 0) warp_maxes[warp] = v;
  __syncthreads();
  float m = lane < int(blockDim.x >> 5) ? warp_maxes[lane] : -INFINITY;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
  return m;
}

// Shared-memory staging of whole rows by the copy engine (cp.async.bulk, Hopper), completed on
// one mbarrier per buffer. Addresses are 32-bit shared-window addresses.
__device__ __forceinline__ void mbar_init(std::uint32_t bar, std::uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(std::uint32_t bar, std::uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(std::uint32_t bar, std::uint32_t parity) {
  std::uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
// Orders this CTA's earlier generic-proxy accesses of shared memory (the reads of a buffer, the
// barrier initialization) before later async-proxy (copy engine) accesses.
__device__ __forceinline__ void fence_proxy_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_load(std::uint32_t dst, const void* src, std::uint32_t bytes, std::uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

// Rows staged in shared memory at a time by the resident kernel (each up to 128 KiB; two of
// GPT-2's 100,608-byte rows fit the H200's 227 KiB).
constexpr int kResidentMaxStages = 2;

// The same loss and gradient with the row read from memory once: each thread keeps its chunks of
// kVec logits in registers as BF16 (4 registers a chunk), takes the row maximum, then the sum of
// exp(l - max), then writes the gradient over them. The two-pass kernel above reads the row twice;
// on the H200 that second read (from L2, which 132 SMs' worth of 100 KB rows overflow) made it
// ~200 us per 2,341-row chunk of GPT-2's classifier (docs/benchmarks.md).
//
// Persistent: a block (one per SM) takes rows blockIdx.x, blockIdx.x + gridDim.x, ... and the copy
// engine loads the next `stages` rows into shared memory while the block computes on the current
// one from registers, so the SM's loads overlap its math (with one 1024-thread block per row and
// per SM, the memory traffic stopped during the expf passes and reductions: 192 us a chunk, 2.45
// TB/s). Per row, thread t holds chunks j * 1024 + t as before and the reductions are the same
// trees, so results are bitwise those of the one-row-per-block kernel it replaces.
__global__ void __launch_bounds__(kResidentThreads, 1)
    softmax_cross_entropy_resident_kernel(bf16_t* logits, float* losses, const int* targets, int rows, int Vp,
                                          float grad_scale, int stages) {
  extern __shared__ __align__(128) uint4 staged[];  // [stages][Vp / kVec]
  __shared__ __align__(8) std::uint64_t full[kResidentMaxStages];
  const int chunks = Vp / kVec;  // chunk c = j * kResidentThreads + threadIdx.x holds logits [c kVec, (c + 1) kVec)
  const std::uint32_t row_bytes = std::uint32_t(Vp) * sizeof(bf16_t);
  const int first = int(blockIdx.x), stride = int(gridDim.x);
  const int my_rows = (rows - first + stride - 1) / stride;  // >= 1: gridDim.x <= rows
  const std::uint32_t staged_addr = std::uint32_t(__cvta_generic_to_shared(staged));
  const std::uint32_t full_addr = std::uint32_t(__cvta_generic_to_shared(full));
  auto issue = [&](int i, int s) {  // local row i -> buffer s = i % stages (one thread)
    const std::int64_t r = first + std::int64_t(i) * stride;
    mbar_arrive_expect_tx(full_addr + 8u * s, row_bytes);
    bulk_load(staged_addr + std::uint32_t(s) * row_bytes, logits + r * Vp, row_bytes, full_addr + 8u * s);
  };
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) mbar_init(full_addr + 8u * s, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    fence_proxy_async_shared();
    for (int i = 0; i < stages && i < my_rows; ++i) issue(i, i);
  }
  __syncthreads();

  // Targets one row ahead: thread 0 reads the target logit right after the row arrives, and a
  // dependent global load there would stall the whole block at the next barrier.
  int target = targets[first];
  int s = 0;                 // buffer of row i: i % stages
  std::uint32_t phase = 0;   // its mbarrier's phase parity: (i / stages) & 1
  for (int i = 0; i < my_rows; ++i) {
    const std::int64_t r = first + std::int64_t(i) * stride;
    bf16_t* row = logits + r * Vp;  // [Vp]
    const int next_target = i + 1 < my_rows ? targets[r + stride] : 0;
    mbar_wait(full_addr + 8u * s, phase);
    const uint4* buf = staged + std::int64_t(s) * chunks;
    uint4 raw[kResidentChunks];
#pragma unroll
    for (int j = 0; j < kResidentChunks; ++j) {
      const int c = j * kResidentThreads + int(threadIdx.x);
      raw[j] = c < chunks ? buf[c] : make_uint4(0, 0, 0, 0);
    }
    const float target_logit = threadIdx.x == 0 ? __bfloat162float(reinterpret_cast<const bf16_t*>(buf)[target]) : 0.0f;
    __syncthreads();  // every thread has read buffer s: the copy engine may refill it
    if (threadIdx.x == 0 && i + stages < my_rows) {
      fence_proxy_async_shared();
      issue(i + stages, s);
    }

    auto values = [&](int j, float (&l)[kVec]) {
      const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw[j]);
#pragma unroll
      for (int k = 0; k < kVec / 2; ++k) {
        const float2 f = __bfloat1622float2(h[k]);
        l[2 * k] = f.x, l[2 * k + 1] = f.y;
      }
    };
    float m = -INFINITY;
#pragma unroll
    for (int j = 0; j < kResidentChunks; ++j) {
      if (j * kResidentThreads + int(threadIdx.x) >= chunks) continue;
      float l[kVec];
      values(j, l);
#pragma unroll
      for (int k = 0; k < kVec; ++k) m = fmaxf(m, l[k]);
    }
    m = block_max(m);
    float sum = 0.0f;
    if (m != -INFINITY) {  // an all -inf row: sum 0, loss inf (as the two-pass kernel gives)
#pragma unroll
      for (int j = 0; j < kResidentChunks; ++j) {
        if (j * kResidentThreads + int(threadIdx.x) >= chunks) continue;
        float l[kVec];
        values(j, l);
#pragma unroll
        for (int k = 0; k < kVec; ++k) sum += expf(l[k] - m);  // expf, not __expf: ~2 ulp
      }
    }
    sum = block_sum(sum);  // its closing barrier also orders block_max's warp_maxes before the next row's
    if (threadIdx.x == 0) losses[r] = logf(sum) - (target_logit - m);
    if (grad_scale != 0.0f) {
      const float inv_sum = 1.0f / sum;
#pragma unroll
      for (int j = 0; j < kResidentChunks; ++j) {
        const int c = j * kResidentThreads + int(threadIdx.x);
        if (c >= chunks) continue;
        float l[kVec];
        values(j, l);
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          const float p = expf(l[k] - m) * inv_sum;
          l[k] = grad_scale * (p - (c * kVec + k == target ? 1.0f : 0.0f));
        }
        store<kVec>(row + std::int64_t(c) * kVec, l);
      }
    }
    target = next_target;
    if (++s == stages) s = 0, phase ^= 1u;
  }
}

// Per device: SM count and the resident kernel's dynamic shared memory limit (set once).
struct ResidentLaunch {
  int sms = 0;
  int max_dynamic_smem = 0;
};

ResidentLaunch resident_launch() {
  static std::mutex mutex;
  static std::map<int, ResidentLaunch> by_device;
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  const std::lock_guard<std::mutex> lock(mutex);
  const auto it = by_device.find(device);
  if (it != by_device.end()) return it->second;
  ResidentLaunch l;
  int optin = 0;
  check_cuda(cudaDeviceGetAttribute(&l.sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute (SMs)");
  check_cuda(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
             "cudaDeviceGetAttribute (shared memory)");
  cudaFuncAttributes attr{};
  check_cuda(cudaFuncGetAttributes(&attr, softmax_cross_entropy_resident_kernel), "cudaFuncGetAttributes");
  l.max_dynamic_smem = std::min(optin - int(attr.sharedSizeBytes), kResidentMaxStages * kResidentThreads * kResidentChunks * kVec * int(sizeof(bf16_t)));
  check_cuda(cudaFuncSetAttribute(softmax_cross_entropy_resident_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  l.max_dynamic_smem),
             "cudaFuncSetAttribute (softmax_cross_entropy_resident_kernel)");
  by_device.emplace(device, l);
  return l;
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
  const bool vector = Vp % kVec == 0 && aligned16(logits);
  if (vector && Vp <= kResidentThreads * kResidentChunks * kVec) {
    const ResidentLaunch l = resident_launch();
    const int row_bytes = Vp * int(sizeof(bf16_t));
    const int stages = std::min(kResidentMaxStages, l.max_dynamic_smem / row_bytes);
    if (stages >= 1) {
      const int blocks = std::min(rows, l.sms);  // one 1024-thread block per SM, each looping over rows
      softmax_cross_entropy_resident_kernel<<<unsigned(blocks), kResidentThreads, std::size_t(stages) * row_bytes, stream>>>(
          logits, losses, targets, rows, Vp, grad_scale, stages);
      check_cuda(cudaGetLastError(), "softmax_cross_entropy_resident_kernel");
      return;
    }
  }
  if (Vp % kVec == 0 && aligned16(logits))
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
