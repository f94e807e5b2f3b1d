// ce_lab (bench only): the classifier's softmax cross-entropy (model/cuda/classifier_kernels.cu,
// through the production entry point softmax_cross_entropy: the kernel of
// model/cuda/softmax_cross_entropy_cluster.cuh at kClusterCtas, today 1 x 1024 threads a row), the same kernel at
// every cluster size (8 x 128, 4 x 256, 2 x 512, 1 x 1024: the replaced structure with the new
// arithmetic), and the kernel it replaced, kept here only for this comparison: one 1024-thread CTA
// per row, the row read once into registers, a block maximum, then a block sum of expf(l - max),
// then the gradient written over the row (2.45 TB/s on the H200 in the trainer's profile;
// docs/benchmarks.md).
// All run on the same [rows, Vp] BF16 logits (default 2,560 x 50,304, GPT-2's padded vocabulary),
// restored before every launch and with L2 flushed, each launch timed alone by CUDA events, the
// variants interleaved; prints the median and range of the repetitions in us and in TB/s (bytes
// read, plus written when the gradient is), for the backward (loss and gradient) and the loss alone,
// then whether the cluster sizes give production's bits (they must) and how far the replaced
// kernel's results are from production's.
//   build-cuda/ce_lab [rows [Vp [reps]]]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <vector>

#include "../reduce.cuh"
#include "../softmax_cross_entropy_cluster.cuh"
#include "stableflash/model/cuda/device_array.hpp"
#include "stableflash/model/cuda/layer_kernels.hpp"

namespace {

namespace mc = stableflash::model::cuda;
using mc::bf16_t;
using mc::detail::block_sum;
using mc::detail::kVec;
using mc::detail::store;

// ---- the replaced kernel, as it was in classifier_kernels.cu (the comparison's baseline) ----

constexpr int kResidentThreads = 1024;
constexpr int kResidentChunks = 8;

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

__global__ void __launch_bounds__(kResidentThreads, 1)
    softmax_cross_entropy_resident_kernel(bf16_t* logits, float* losses, const int* targets, int Vp, float grad_scale) {
  const std::int64_t r = blockIdx.x;
  bf16_t* row = logits + r * Vp;  // [Vp]
  const int target = targets[r];
  const int chunks = Vp / kVec;  // chunk c = j * kResidentThreads + threadIdx.x holds logits [c kVec, (c + 1) kVec)
  uint4 raw[kResidentChunks];
#pragma unroll
  for (int j = 0; j < kResidentChunks; ++j) {
    const int c = j * kResidentThreads + int(threadIdx.x);
    raw[j] = c < chunks ? reinterpret_cast<const uint4*>(row)[c] : make_uint4(0, 0, 0, 0);
  }
  const float target_logit = threadIdx.x == 0 ? __bfloat162float(row[target]) : 0.0f;  // read before any write
  auto values = [&](int j, float (&l)[kVec]) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw[j]);
#pragma unroll
    for (int i = 0; i < kVec / 2; ++i) {
      const float2 f = __bfloat1622float2(h[i]);
      l[2 * i] = f.x, l[2 * i + 1] = f.y;
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
  if (m != -INFINITY) {
#pragma unroll
    for (int j = 0; j < kResidentChunks; ++j) {
      if (j * kResidentThreads + int(threadIdx.x) >= chunks) continue;
      float l[kVec];
      values(j, l);
#pragma unroll
      for (int k = 0; k < kVec; ++k) sum += expf(l[k] - m);
    }
  }
  sum = block_sum(sum);
  if (threadIdx.x == 0) losses[r] = logf(sum) - (target_logit - m);
  if (grad_scale == 0.0f) return;
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

// ---- the bench ----

// Logits spread about like N(0, 2^2) (the sum of four uniforms), from a hash of the index: no host
// round trip for 257 MB.
__global__ void fill_logits(bf16_t* logits, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x) {
    std::uint64_t h = std::uint64_t(i) * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
    h ^= h >> 31, h *= 0xBF58476D1CE4E5B9ull, h ^= h >> 29;
    float s = 0.0f;
    for (int k = 0; k < 4; ++k) s += float((h >> (16 * k)) & 0xffffu) / 65536.0f - 0.5f;
    logits[i] = __float2bfloat16_rn(s * 3.46f);  // the sum of 4 uniforms on [-1/2, 1/2) has sd 0.577
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  const int rows = argc > 1 ? std::atoi(argv[1]) : 2560;
  const int Vp = argc > 2 ? std::atoi(argv[2]) : 50304;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 100;
  if (rows <= 0 || Vp <= 0 || Vp % kVec != 0 || Vp > kResidentThreads * kResidentChunks * kVec || reps <= 0) {
    std::fprintf(stderr, "ce_lab [rows [Vp [reps]]]: Vp a multiple of %d up to %d (the replaced kernel's limit)\n", kVec,
                 kResidentThreads * kResidentChunks * kVec);
    return 2;
  }
  try {
    cudaDeviceProp prop{};
    mc::check_cuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    const std::size_t n = std::size_t(rows) * Vp;
    mc::DeviceArray<bf16_t> pristine(n), logits(n);
    const auto R = static_cast<std::size_t>(rows);
    mc::DeviceArray<float> losses(R);
    mc::DeviceArray<int> targets(R);
    // Bigger than any L2 of today (the H200's is 50 MB): written between launches so that no launch
    // finds the previous one's rows in L2.
    mc::DeviceArray<unsigned char> flush(std::size_t(256) << 20);
    fill_logits<<<4 * prop.multiProcessorCount, 256>>>(pristine.get(), std::int64_t(n));
    mc::check_cuda(cudaGetLastError(), "fill_logits");
    std::vector<int> host_targets(R);
    for (int r = 0; r < rows; ++r) host_targets[std::size_t(r)] = int((std::uint64_t(r) * 2654435761u) % std::uint64_t(Vp));
    targets.upload(host_targets.data(), host_targets.size(), nullptr);
    mc::check_cuda(cudaDeviceSynchronize(), "setup");

    cudaEvent_t start, stop;
    mc::check_cuda(cudaEventCreate(&start), "cudaEventCreate");
    mc::check_cuda(cudaEventCreate(&stop), "cudaEventCreate");
    using mc::detail::kClusterRowThreads;
    using mc::detail::softmax_cross_entropy_cluster_kernel;
    struct Variant {
      const char* name;
      void (*launch)(bf16_t*, float*, const int*, int, int, float);
    };
    const Variant variants[] = {
        {"production (entry point)",
         [](bf16_t* l, float* loss, const int* t, int rows_, int Vp_, float gs) {
           mc::softmax_cross_entropy(l, loss, t, rows_, Vp_, gs, nullptr);
         }},
        {"cluster 8 x 128",
         [](bf16_t* l, float* loss, const int* t, int rows_, int Vp_, float gs) {
           softmax_cross_entropy_cluster_kernel<8><<<unsigned(rows_) * 8, kClusterRowThreads / 8>>>(l, loss, t, Vp_, gs);
         }},
        {"cluster 4 x 256",
         [](bf16_t* l, float* loss, const int* t, int rows_, int Vp_, float gs) {
           softmax_cross_entropy_cluster_kernel<4><<<unsigned(rows_) * 4, kClusterRowThreads / 4>>>(l, loss, t, Vp_, gs);
         }},
        {"cluster 2 x 512",
         [](bf16_t* l, float* loss, const int* t, int rows_, int Vp_, float gs) {
           softmax_cross_entropy_cluster_kernel<2><<<unsigned(rows_) * 2, kClusterRowThreads / 2>>>(l, loss, t, Vp_, gs);
         }},
        {"1 x 1024 (no cluster)",
         [](bf16_t* l, float* loss, const int* t, int rows_, int Vp_, float gs) {
           softmax_cross_entropy_cluster_kernel<1><<<unsigned(rows_), kClusterRowThreads>>>(l, loss, t, Vp_, gs);
         }},
        {"replaced (1 x 1024, expf)",
         [](bf16_t* l, float* loss, const int* t, int rows_, int Vp_, float gs) {
           softmax_cross_entropy_resident_kernel<<<unsigned(rows_), kResidentThreads>>>(l, loss, t, Vp_, gs);
         }},
    };
    constexpr int kVariants = int(sizeof(variants) / sizeof(variants[0]));
    // How many rows can be in flight at once (the occupancy the design is about).
    auto clusters_in_flight = [&](const void* kernel, int ctas) {
      cudaLaunchConfig_t config{};
      config.gridDim = dim3(unsigned(rows) * unsigned(ctas));
      config.blockDim = dim3(unsigned(kClusterRowThreads / ctas));
      int clusters = 0;
      mc::check_cuda(cudaOccupancyMaxActiveClusters(&clusters, kernel, &config), "cudaOccupancyMaxActiveClusters");
      return clusters;
    };
    int resident_blocks = 0;
    mc::check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident_blocks, softmax_cross_entropy_resident_kernel, kResidentThreads, 0),
                   "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    std::printf("rows in flight at most: cluster 8 x 128 %d, 4 x 256 %d, 2 x 512 %d, 1 x 1024 %d; replaced %d\n",
                clusters_in_flight(reinterpret_cast<const void*>(softmax_cross_entropy_cluster_kernel<8>), 8),
                clusters_in_flight(reinterpret_cast<const void*>(softmax_cross_entropy_cluster_kernel<4>), 4),
                clusters_in_flight(reinterpret_cast<const void*>(softmax_cross_entropy_cluster_kernel<2>), 2),
                clusters_in_flight(reinterpret_cast<const void*>(softmax_cross_entropy_cluster_kernel<1>), 1),
                resident_blocks * prop.multiProcessorCount);
    constexpr int kReplaced = kVariants - 1;
    const bool cluster_fits = Vp <= mc::detail::kClusterMaxVp;  // else production takes the two-pass kernel, the others cannot run
    auto runs = [&](int which) { return which == 0 || which == kReplaced || cluster_fits; };
    auto launch = [&](int which, float grad_scale) {
      variants[which].launch(logits.get(), losses.get(), targets.get(), rows, Vp, grad_scale);
      mc::check_cuda(cudaGetLastError(), variants[which].name);
    };
    auto restore = [&] {
      mc::check_cuda(cudaMemcpyAsync(logits.get(), pristine.get(), n * sizeof(bf16_t), cudaMemcpyDeviceToDevice, nullptr), "restore");
      mc::check_cuda(cudaMemsetAsync(flush.get(), 0x5a, flush.bytes(), nullptr), "flush L2");
    };
    const float grad_scale = 1.0f / float(rows);
    std::printf("%s, %d SMs; [%d, %d] BF16 logits (%.1f MB), %d launches each, L2 flushed before each\n", prop.name,
                prop.multiProcessorCount, rows, Vp, double(n) * 2 / 1e6, reps);
    for (const bool backward : {true, false}) {
      std::vector<double> us[kVariants];
      for (int rep = 0; rep < reps + 2; ++rep) {     // the first two rounds warm up
        for (int which = 0; which < kVariants; ++which) {  // interleaved: drift of clocks hits all alike
          if (!runs(which)) continue;
          restore();
          mc::check_cuda(cudaEventRecord(start, nullptr), "cudaEventRecord");
          launch(which, backward ? grad_scale : 0.0f);
          mc::check_cuda(cudaEventRecord(stop, nullptr), "cudaEventRecord");
          mc::check_cuda(cudaEventSynchronize(stop), "cudaEventSynchronize");
          float ms = 0;
          mc::check_cuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
          if (rep >= 2) us[which].push_back(double(ms) * 1e3);
        }
      }
      const double bytes = double(n) * 2 * (backward ? 2 : 1);
      for (int which = 0; which < kVariants; ++which) {
        if (!runs(which)) continue;
        const double med = median(us[which]);
        const auto [lo, hi] = std::minmax_element(us[which].begin(), us[which].end());
        std::printf("%-9s %-30s %8.1f us median (%.1f-%.1f), %5.2f TB/s\n", backward ? "backward" : "loss only", variants[which].name,
                    med, *lo, *hi, bytes / (med * 1e-6) / 1e12);
      }
    }

    // The cluster sizes map threads to logits and combine them identically, so their bits must be
    // production's; the replaced kernel's differ within the GPU test's bounds (tests/model_gpu checks
    // each kernel against FP64; this only shows that the bench ran what it claims).
    std::vector<float> loss[kVariants];
    std::vector<bf16_t> grad[kVariants];
    for (int which = 0; which < kVariants; ++which) {
      if (!runs(which)) continue;
      restore();
      launch(which, grad_scale);
      loss[which].resize(R);
      grad[which].resize(n);
      losses.download(loss[which].data(), R, nullptr);
      logits.download(grad[which].data(), n, nullptr);
      mc::check_cuda(cudaDeviceSynchronize(), "download");
    }
    for (int which = 1; which < kVariants; ++which) {
      if (!runs(which)) continue;
      double loss_diff = 0, grad_diff = 0, grad_max = 0;
      std::size_t grad_differ = 0;
      for (std::size_t r = 0; r < R; ++r) loss_diff = std::max(loss_diff, std::fabs(double(loss[which][r]) - double(loss[0][r])));
      for (std::size_t i = 0; i < n; ++i) {
        const double a = __bfloat162float(grad[which][i]), b = __bfloat162float(grad[0][i]);
        grad_diff = std::max(grad_diff, std::fabs(a - b));
        grad_max = std::max(grad_max, std::fabs(b));
        grad_differ += a != b;
      }
      std::printf("%-30s vs production: max |loss difference| %.3g, max |gradient difference| %.3g (max |gradient| %.3g), "
                  "%zu of %zu gradient values differ%s\n",
                  variants[which].name, loss_diff, grad_diff, grad_max, grad_differ, n,
                  which != kReplaced && (loss_diff != 0 || grad_differ != 0) ? "  <-- MUST BE 0" : "");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ce_lab: %s\n", e.what());
    return 1;
  }
  return 0;
}
