// AdamW over the AdamW tensors of a part of the parameters (all of them, a bucket or a layer) in
// one launch, and the FP32 -> BF16 weight copy.
#include "optimizer_kernels.cuh"
#include "stableflash/model/cuda/device_array.hpp"
#include "stableflash/optim/cuda_optimizer.hpp"

namespace stableflash::optim {
namespace cuda_detail {
namespace {

// Block b updates chunk b. Per element, the operations and their order are those of
// Optimizer<float>::adamw_tensor; the intrinsics keep nvcc from fusing them into FMAs.
// The clipping factor is read from device memory (StepScale), once per block.
__global__ void __launch_bounds__(kThreads) adamw_kernel(const AdamwChunk* chunks, AdamwScalars s, AdamwBuffers b) {
  const AdamwChunk c = chunks[blockIdx.x];
  if (s.scale->skip) return;  // a non-finite gradient norm: the step writes nothing
  const float grad_scale = s.scale->factor;
  const float decay = c.apply_decay ? s.decay : 1.0f;
  for (std::int32_t j = threadIdx.x; j < c.size; j += kThreads) {
    const std::int64_t i = c.offset + j, k = c.state_offset + j;
    const float g = __fmul_rn(b.grads[i], grad_scale);  // lazy clipping: FP32(g * factor), as an in-place clip
    if (s.zero_grads) b.grads[i] = 0.0f;
    const float p = __fmul_rn(b.params[i], decay);
    const float m = __fadd_rn(__fmul_rn(s.beta1, b.m[k]), __fmul_rn(s.one_minus_beta1, g));
    const float v = __fadd_rn(__fmul_rn(s.beta2, b.v[k]), __fmul_rn(__fmul_rn(s.one_minus_beta2, g), g));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), s.bc2_sqrt), s.eps);
    const float updated = __fsub_rn(p, __fmul_rn(s.step_size, __fdiv_rn(m, denom)));
    b.m[k] = m;
    b.v[k] = v;
    b.params[i] = updated;
    b.params_bf16[i] = __float2bfloat16_rn(updated);
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
