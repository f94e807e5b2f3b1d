// gemm_lab's kernels (bench only): input fills, the check's gathers and the two-pass alternative's
// element-wise GELU and GELU-derivative passes (gemm_lab.hpp).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <library_types.h>

#include "gemm_lab.hpp"

namespace gemm_lab {
namespace {

template <class T>
__device__ inline T from_float(float x);
template <>
__device__ inline __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ inline __half from_float(float x) { return __float2half_rn(x); }
template <>
__device__ inline float from_float(float x) { return x; }

template <class T>
__device__ inline float to_float(T x);
template <>
__device__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <>
__device__ inline float to_float(__half x) { return __half2float(x); }
template <>
__device__ inline float to_float(float x) { return x; }

template <class T>
__global__ void fill_kernel(T* out, std::int64_t rows, std::int64_t cols, std::int64_t ld, std::uint32_t seed, int half, float scale) {
  const std::int64_t total = rows * cols;
  for (std::int64_t idx = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total; idx += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t r = idx % rows, c = idx / rows, off = r + c * ld;
    out[off] = from_float<T>(gen_value(seed, half, scale, std::uint64_t(off)));
  }
}

template <class T>
__global__ void gather_kernel(const T* src, const std::int64_t* offsets, int count, float* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < count) out[i] = to_float(src[offsets[i]]);
}

__global__ void row_sums_kernel(const __nv_bfloat16* d, std::int64_t rows, std::int64_t cols, std::int64_t ld, double* sum, double* sum_abs) {
  const std::int64_t r = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  double s = 0, a = 0;
  for (std::int64_t c = 0; c < cols; ++c) {
    const double v = __bfloat162float(d[r + c * ld]);
    s += v;
    a += fabs(v);
  }
  sum[r] = s;
  sum_abs[r] = a;
}

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

__device__ inline float gelu_f(float x) {
  const float t = tanhf(kSqrt2OverPi * (x + kGeluCubic * x * x * x));
  return 0.5f * x * (1.0f + t);
}
__device__ inline float gelu_grad_f(float x) {
  const float t = tanhf(kSqrt2OverPi * (x + kGeluCubic * x * x * x));
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x);
}

// Eight BF16 per thread and iteration (16-byte loads and stores).
__global__ void dgelu_kernel(__nv_bfloat16* out, const __nv_bfloat16* dout, const __nv_bfloat16* pre, std::int64_t count8) {
  for (std::int64_t v = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v < count8; v += std::int64_t(gridDim.x) * blockDim.x) {
    const uint4 g = reinterpret_cast<const uint4*>(dout)[v];
    const uint4 x = reinterpret_cast<const uint4*>(pre)[v];
    const __nv_bfloat162* g2 = reinterpret_cast<const __nv_bfloat162*>(&g);
    const __nv_bfloat162* x2 = reinterpret_cast<const __nv_bfloat162*>(&x);
    uint4 r;
    __nv_bfloat162* r2 = reinterpret_cast<__nv_bfloat162*>(&r);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 gf = __bfloat1622float2(g2[e]), xf = __bfloat1622float2(x2[e]);
      r2[e] = __floats2bfloat162_rn(gf.x * gelu_grad_f(xf.x), gf.y * gelu_grad_f(xf.y));
    }
    reinterpret_cast<uint4*>(out)[v] = r;
  }
}

__global__ void gelu_kernel(__nv_bfloat16* out, const __nv_bfloat16* pre, std::int64_t count8) {
  for (std::int64_t v = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v < count8; v += std::int64_t(gridDim.x) * blockDim.x) {
    const uint4 x = reinterpret_cast<const uint4*>(pre)[v];
    const __nv_bfloat162* x2 = reinterpret_cast<const __nv_bfloat162*>(&x);
    uint4 r;
    __nv_bfloat162* r2 = reinterpret_cast<__nv_bfloat162*>(&r);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 xf = __bfloat1622float2(x2[e]);
      r2[e] = __floats2bfloat162_rn(gelu_f(xf.x), gelu_f(xf.y));
    }
    reinterpret_cast<uint4*>(out)[v] = r;
  }
}

}  // namespace

void fill(int type, void* p, std::int64_t rows, std::int64_t cols, std::int64_t ld, const Gen& g, cudaStream_t stream) {
  if (type == CUDA_R_32F) fill_kernel<<<4096, 256, 0, stream>>>(static_cast<float*>(p), rows, cols, ld, g.seed, g.half, g.scale);
  else if (type == CUDA_R_16F) fill_kernel<<<4096, 256, 0, stream>>>(static_cast<__half*>(p), rows, cols, ld, g.seed, g.half, g.scale);
  else fill_kernel<<<4096, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(p), rows, cols, ld, g.seed, g.half, g.scale);
}

void gather(int type, const void* src, const std::int64_t* offsets, int count, float* out, cudaStream_t stream) {
  const int blocks = (count + 255) / 256;
  if (type == CUDA_R_32F) gather_kernel<<<blocks, 256, 0, stream>>>(static_cast<const float*>(src), offsets, count, out);
  else if (type == CUDA_R_16F) gather_kernel<<<blocks, 256, 0, stream>>>(static_cast<const __half*>(src), offsets, count, out);
  else gather_kernel<<<blocks, 256, 0, stream>>>(static_cast<const __nv_bfloat16*>(src), offsets, count, out);
}

void row_sums(const void* d, std::int64_t rows, std::int64_t cols, std::int64_t ld, double* sum, double* sum_abs, cudaStream_t stream) {
  row_sums_kernel<<<unsigned((rows + 255) / 256), 256, 0, stream>>>(static_cast<const __nv_bfloat16*>(d), rows, cols, ld, sum, sum_abs);
}

void dgelu(void* out, const void* dout, const void* pre, std::int64_t count8, int blocks, cudaStream_t stream) {
  dgelu_kernel<<<blocks, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(out), static_cast<const __nv_bfloat16*>(dout),
                                           static_cast<const __nv_bfloat16*>(pre), count8);
}

void gelu(void* out, const void* pre, std::int64_t count8, int blocks, cudaStream_t stream) {
  gelu_kernel<<<blocks, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(out), static_cast<const __nv_bfloat16*>(pre), count8);
}

}  // namespace gemm_lab
