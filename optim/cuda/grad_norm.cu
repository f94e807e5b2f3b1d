// Deterministic sums of squares (the global gradient norm, Muon's Frobenius norm), and the
// clipping factor from them on the device. Clipping itself is lazy (the optimizer kernels scale
// each gradient as they read it, taking the factor from device memory).
//
// Two passes, both with a fixed reduction tree: a grid of at most kMaxPartials blocks, each thread
// summing a grid-stride slice in FP64 and the block folding its threads pairwise, then one block
// folding the partials the same way. The grid size depends on n only, so the same n sums in the
// same order every call: bitwise reproducible, without atomics.
#include "optimizer_kernels.cuh"
#include "stableflash/model/cuda/device_array.hpp"

namespace stableflash::optim::cuda_detail {
namespace {

// Elements per thread the first pass aims at before it adds blocks: fewer partials to fold, and
// long enough loops to hide the loads.
constexpr std::int64_t kPerThread = 16;

__device__ double square(float x) { return double(x) * double(x); }
__device__ double square(__nv_bfloat16 x) { return square(__bfloat162float(x)); }

// Sum of x over the block's threads, folded in the same tree every time. Call once per kernel.
__device__ double block_sum(double x) {
  __shared__ double s[kThreads];
  s[threadIdx.x] = x;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) s[threadIdx.x] += s[threadIdx.x + w];
    __syncthreads();
  }
  return s[0];
}

template <class T>
__global__ void __launch_bounds__(kThreads) partial_sums_kernel(const T* x, std::int64_t n, double* partials) {
  double acc = 0;
  const std::int64_t stride = std::int64_t(gridDim.x) * kThreads;
  for (std::int64_t i = std::int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride) acc += square(x[i]);
  const double total = block_sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

__global__ void __launch_bounds__(kThreads) final_sum_kernel(const double* partials, int n, double* sum) {
  double acc = 0;
  for (int i = threadIdx.x; i < n; i += kThreads) acc += partials[i];
  const double total = block_sum(acc);
  if (threadIdx.x == 0) *sum = total;
}

// The host formula of CudaOptimizer::clip_with_sum_of_squares, operation for operation, with the
// IEEE round-to-nearest intrinsics (no contraction): the same bits as the host's doubles.
__global__ void clip_factor_kernel(const double* sums, int n, double max_norm, StepScale* scale) {
  double sum = 0;
  for (int k = 0; k < n; ++k) sum = __dadd_rn(sum, sums[k]);
  const double norm = __dsqrt_rn(sum);
  StepScale s;
  s.norm = norm;
  s.factor = max_norm > 0 && norm > max_norm ? __double2float_rn(__ddiv_rn(max_norm, __dadd_rn(norm, 1e-6))) : 1.0f;
  s.skip = isfinite(norm) ? 0 : 1;
  *scale = s;
}

__global__ void set_scale_kernel(StepScale* scale, StepScale value) { *scale = value; }

}  // namespace

void launch_clip_factor(const double* sums, int n, double max_norm, StepScale* scale, cudaStream_t stream) {
  clip_factor_kernel<<<1, 1, 0, stream>>>(sums, n, max_norm, scale);
  model::cuda::check_cuda(cudaGetLastError(), "clip factor kernel launch");
}

void launch_set_scale(StepScale* scale, const StepScale& value, cudaStream_t stream) {
  set_scale_kernel<<<1, 1, 0, stream>>>(scale, value);
  model::cuda::check_cuda(cudaGetLastError(), "clip factor kernel launch");
}

template <class T>
void launch_sum_squares(const T* x, std::int64_t n, double* partials, double* sum, cudaStream_t stream) {
  const int blocks = int(std::clamp<std::int64_t>((n + kThreads * kPerThread - 1) / (kThreads * kPerThread), 1, kMaxPartials));
  partial_sums_kernel<T><<<blocks, kThreads, 0, stream>>>(x, n, partials);
  final_sum_kernel<<<1, kThreads, 0, stream>>>(partials, blocks, sum);
  model::cuda::check_cuda(cudaGetLastError(), "sum-of-squares kernel launch");
}

template void launch_sum_squares<float>(const float*, std::int64_t, double*, double*, cudaStream_t);
template void launch_sum_squares<__nv_bfloat16>(const __nv_bfloat16*, std::int64_t, double*, double*, cudaStream_t);

}  // namespace stableflash::optim::cuda_detail
