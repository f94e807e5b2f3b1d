// AdamW over the AdamW tensors of a part of the parameters (all of them, a bucket or a layer) in
// one launch, and the FP32 -> BF16 weight copy.
#include "optimizer_kernels.cuh"
#include "stableflash/model/cuda/device_array.hpp"
#include "stableflash/optim/cuda_optimizer.hpp"

namespace stableflash::optim {
namespace cuda_detail {
namespace {

// One element: the operations and their order of Optimizer<float>::adamw_tensor; the intrinsics
// keep nvcc from fusing them into FMAs. g is the gradient as stored, p, m, v the values before.
struct AdamwElement {
  float p, m, v;
};
__device__ __forceinline__ AdamwElement adamw_element(float g_stored, float p_old, float m_old, float v_old, const AdamwScalars& s,
                                                      float grad_scale, float decay) {
  const float g = __fmul_rn(g_stored, grad_scale);  // lazy clipping: FP32(g * factor), as an in-place clip
  const float p = __fmul_rn(p_old, decay);
  const float m = __fadd_rn(__fmul_rn(s.beta1, m_old), __fmul_rn(s.one_minus_beta1, g));
  const float v = __fadd_rn(__fmul_rn(s.beta2, v_old), __fmul_rn(__fmul_rn(s.one_minus_beta2, g), g));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), s.bc2_sqrt), s.eps);
  return {__fsub_rn(p, __fmul_rn(s.step_size, __fdiv_rn(m, denom))), m, v};
}

// Block b updates chunk b. The clipping factor is read from device memory (StepScale), once per
// block. The kernel is bound by memory traffic (30 bytes a value, 34 with the zeroing): every load
// of an element comes before any of its stores, and the gradient's zeroing comes last, so no store
// to an address still being loaded holds the other loads behind it. A version with four values per
// thread and the zeroing store right after the gradient's load took 3.26 ms instead of 1.1 ms on
// the H200 (Nsight Compute, GPT-2 124M).
__global__ void __launch_bounds__(kThreads) adamw_kernel(const AdamwChunk* chunks, AdamwScalars s, AdamwBuffers b) {
  const AdamwChunk c = chunks[blockIdx.x];
  if (s.scale->skip) return;  // a non-finite gradient norm: the step writes nothing
  const float grad_scale = s.scale->factor;
  const float decay = c.apply_decay ? s.decay : 1.0f;
  float* __restrict__ grads = b.grads;
  float* __restrict__ params = b.params;
  float* __restrict__ first = b.m;
  float* __restrict__ second = b.v;
  __nv_bfloat16* __restrict__ params_bf16 = b.params_bf16;
  for (std::int32_t j = threadIdx.x; j < c.size; j += kThreads) {
    const std::int64_t i = c.offset + j, k = c.state_offset + j;
    const AdamwElement e = adamw_element(grads[i], params[i], first[k], second[k], s, grad_scale, decay);
    first[k] = e.m;
    second[k] = e.v;
    params[i] = e.p;
    params_bf16[i] = __float2bfloat16_rn(e.p);
    if (s.zero_grads) grads[i] = 0.0f;
  }
}

__global__ void to_bf16_kernel(__nv_bfloat16* dst, const float* src, std::int64_t n) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) dst[i] = __float2bfloat16_rn(src[i]);
}

}  // namespace

void launch_adamw(const AdamwChunk* chunks, int n_chunks, const AdamwScalars& s, const AdamwBuffers& b, cudaStream_t stream) {
  if (n_chunks == 0) return;
  adamw_kernel<<<n_chunks, kThreads, 0, stream>>>(chunks, s, b);
  model::cuda::check_cuda(cudaGetLastError(), "AdamW kernel launch");
}

}  // namespace cuda_detail

void to_bf16(__nv_bfloat16* dst, const float* src, std::int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  cuda_detail::to_bf16_kernel<<<cuda_detail::elementwise_blocks(n), cuda_detail::kThreads, 0, stream>>>(dst, src, n);
  model::cuda::check_cuda(cudaGetLastError(), "to_bf16 kernel launch");
}

}  // namespace stableflash::optim
