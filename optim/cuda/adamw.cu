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
// block. Where the chunk's flat and state offsets and its size are multiples of 4 (every chunk of
// GPT-2's layout) and the buffers are aligned for it (s.vector_ok), each thread moves four values
// per load and store (16-byte FP32, 8-byte BF16 accesses: the kernel is bound by memory traffic,
// 30 bytes a value, 34 with the zeroing); the arithmetic per element is the same either way.
__global__ void __launch_bounds__(kThreads) adamw_kernel(const AdamwChunk* chunks, AdamwScalars s, AdamwBuffers b) {
  const AdamwChunk c = chunks[blockIdx.x];
  if (s.scale->skip) return;  // a non-finite gradient norm: the step writes nothing
  const float grad_scale = s.scale->factor;
  const float decay = c.apply_decay ? s.decay : 1.0f;
  if (s.vector_ok && ((c.offset | c.state_offset | std::int64_t(c.size)) & 3) == 0) {
    for (std::int32_t j = 4 * std::int32_t(threadIdx.x); j < c.size; j += 4 * kThreads) {
      const std::int64_t i = c.offset + j, k = c.state_offset + j;
      const float4 g = *reinterpret_cast<const float4*>(b.grads + i);
      if (s.zero_grads) *reinterpret_cast<float4*>(b.grads + i) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      const float4 p = *reinterpret_cast<const float4*>(b.params + i);
      const float4 m = *reinterpret_cast<const float4*>(b.m + k);
      const float4 v = *reinterpret_cast<const float4*>(b.v + k);
      const AdamwElement e0 = adamw_element(g.x, p.x, m.x, v.x, s, grad_scale, decay);
      const AdamwElement e1 = adamw_element(g.y, p.y, m.y, v.y, s, grad_scale, decay);
      const AdamwElement e2 = adamw_element(g.z, p.z, m.z, v.z, s, grad_scale, decay);
      const AdamwElement e3 = adamw_element(g.w, p.w, m.w, v.w, s, grad_scale, decay);
      *reinterpret_cast<float4*>(b.m + k) = make_float4(e0.m, e1.m, e2.m, e3.m);
      *reinterpret_cast<float4*>(b.v + k) = make_float4(e0.v, e1.v, e2.v, e3.v);
      *reinterpret_cast<float4*>(b.params + i) = make_float4(e0.p, e1.p, e2.p, e3.p);
      __nv_bfloat162 h[2] = {__halves2bfloat162(__float2bfloat16_rn(e0.p), __float2bfloat16_rn(e1.p)),
                             __halves2bfloat162(__float2bfloat16_rn(e2.p), __float2bfloat16_rn(e3.p))};
      *reinterpret_cast<uint2*>(b.params_bf16 + i) = *reinterpret_cast<const uint2*>(h);
    }
    return;
  }
  for (std::int32_t j = threadIdx.x; j < c.size; j += kThreads) {
    const std::int64_t i = c.offset + j, k = c.state_offset + j;
    const float g = b.grads[i];
    if (s.zero_grads) b.grads[i] = 0.0f;
    const AdamwElement e = adamw_element(g, b.params[i], b.m[k], b.v[k], s, grad_scale, decay);
    b.m[k] = e.m;
    b.v[k] = e.v;
    b.params[i] = e.p;
    b.params_bf16[i] = __float2bfloat16_rn(e.p);
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
