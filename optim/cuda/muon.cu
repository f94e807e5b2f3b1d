// Muon on the device for one hidden matrix: momentum and Nesterov look-ahead in FP32, then
// torch.optim.Muon's Newton-Schulz orthogonalization on BF16 matrices with BF16 GEMMs (FP32
// accumulation), then the decayed, RMS-matched update of the FP32 weights.
//
// Rounding points (torch's, so the error is that of torch.optim.Muon): the look-ahead G is rounded
// to BF16; X = BF16(G * 1/||G||_F); per iteration A = BF16(X X^T), B = BF16(b A + c A A) and
// X = BF16(a X + B X), the last two as one GEMM each with alpha/beta (torch.addmm).
#include <utility>

#include "optimizer_kernels.cuh"
#include "stableflash/model/cuda/device_array.hpp"

namespace stableflash::optim::cuda_detail {
namespace {

// The CPU's newton_schulz coefficients (quintic, Muon's), as the FP32 alpha/beta the GEMM takes.
constexpr float kA = 3.4445f, kB = -4.7750f, kC = 2.0315f;

// g = FP32(grad * factor) (lazy clipping, the value an in-place clip would have stored);
// buf.lerp_(g, 1 - mu); G = g.lerp(buf, mu) with Nesterov (else buf), stored as BF16 in the wide
// orientation [r, k]: transposed when the tensor is tall, as newton_schulz transposes it. The
// transposed store is uncoalesced; the matrices are small next to the GEMMs that follow. With
// s.zero_grads each gradient is set to 0 once read; with s.scale->skip only x is written.
__global__ void momentum_kernel(float* g, float* buf, __nv_bfloat16* x, int rows, int cols, bool transpose, MuonScalars s) {
  const std::int64_t n = std::int64_t(rows) * cols;
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  const bool skip = s.scale->skip != 0;
  const float grad_scale = s.scale->factor;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const std::int64_t row = i / cols, col = i % cols;
    if (skip) {  // keep Newton-Schulz's input finite-or-not as it is; write neither buf nor g
      x[transpose ? col * rows + row : i] = __float2bfloat16_rn(0.0f);
      continue;
    }
    const float gi = __fmul_rn(g[i], grad_scale);
    if (s.zero_grads) g[i] = 0.0f;
    const float b = __fadd_rn(buf[i], __fmul_rn(s.one_minus_mu, __fsub_rn(gi, buf[i])));
    buf[i] = b;
    const float look = s.nesterov ? __fadd_rn(gi, __fmul_rn(s.mu, __fsub_rn(b, gi))) : b;
    x[transpose ? col * rows + row : i] = __float2bfloat16_rn(look);
  }
}

// X = BF16(G * inv) with inv = FP32(1 / max(||G||_F, 1e-7)), read from the device sum of squares
// (no host round trip per tensor). Multiplying by the rounded inverse is what newton_schulz does.
__global__ void normalize_kernel(__nv_bfloat16* x, std::int64_t n, const double* sum_squares) {
  const float inv = float(1.0 / fmax(sqrt(*sum_squares), 1e-7));
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    x[i] = __float2bfloat16_rn(__fmul_rn(__bfloat162float(x[i]), inv));
}

// p = p * decay - scaled_lr * X, reading X [r, k] back in the tensor's orientation; then the BF16
// copy. Nothing when the step is skipped (scale->skip).
__global__ void update_kernel(float* p, __nv_bfloat16* p16, const __nv_bfloat16* x, int rows, int cols, bool transpose, float decay,
                              float scaled_lr, const StepScale* scale) {
  if (scale->skip) return;
  const std::int64_t n = std::int64_t(rows) * cols;
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const std::int64_t row = i / cols, col = i % cols;
    const float o = __bfloat162float(x[transpose ? col * rows + row : i]);
    const float updated = __fsub_rn(__fmul_rn(p[i], decay), __fmul_rn(scaled_lr, o));
    p[i] = updated;
    p16[i] = __float2bfloat16_rn(updated);
  }
}

void copy_device(__nv_bfloat16* dst, const __nv_bfloat16* src, std::int64_t n, cudaStream_t stream) {
  model::cuda::check_cuda(cudaMemcpyAsync(dst, src, std::size_t(n) * sizeof(__nv_bfloat16), cudaMemcpyDeviceToDevice, stream),
                          "cudaMemcpyAsync (Muon scratch)");
}

}  // namespace

void muon_tensor(const MuonTensor& t, const MuonScalars& s, float* params, __nv_bfloat16* params_bf16, float* grads,
                 float* momentum, const MuonScratch& scratch, model::cuda::Blas& blas) {
  using model::cuda::bf16_matrix;
  using model::cuda::GemmOptions;
  using model::cuda::Trans;
  const cudaStream_t stream = blas.stream();
  const bool tall = t.rows > t.cols;
  const int r = tall ? t.cols : t.rows, k = tall ? t.rows : t.cols;  // wide orientation [r, k], r <= k
  const std::int64_t n = std::int64_t(t.rows) * t.cols;
  const unsigned blocks = elementwise_blocks(n);

  momentum_kernel<<<blocks, kThreads, 0, stream>>>(grads + t.offset, momentum + t.state_offset, scratch.x, t.rows, t.cols, tall, s);
  launch_sum_squares(scratch.x, n, scratch.partials, scratch.sum, stream);
  normalize_kernel<<<blocks, kThreads, 0, stream>>>(scratch.x, n, scratch.sum);
  model::cuda::check_cuda(cudaGetLastError(), "Muon momentum/normalize kernel launch");

  // addmm needs C preloaded with the term it scales by beta, and C may not alias an operand:
  // B's C starts as a copy of A, the new X is written into the other buffer, preloaded with X.
  __nv_bfloat16 *x = scratch.x, *y = scratch.y;
  for (int step = 0; step < s.ns_steps; ++step) {
    blas.gemm(Trans::no, Trans::yes, bf16_matrix(x, r, k), bf16_matrix(x, r, k), bf16_matrix(scratch.gram, r, r));  // A = X X^T
    copy_device(scratch.poly, scratch.gram, std::int64_t(r) * r, stream);
    blas.gemm(Trans::no, Trans::no, bf16_matrix(scratch.gram, r, r), bf16_matrix(scratch.gram, r, r), bf16_matrix(scratch.poly, r, r),
              GemmOptions{.alpha = kC, .beta = kB});  // B = b A + c A A
    copy_device(y, x, n, stream);
    blas.gemm(Trans::no, Trans::no, bf16_matrix(scratch.poly, r, r), bf16_matrix(x, r, k), bf16_matrix(y, r, k),
              GemmOptions{.alpha = 1.0f, .beta = kA});  // X' = a X + B X
    std::swap(x, y);
  }

  update_kernel<<<blocks, kThreads, 0, stream>>>(params + t.offset, params_bf16 + t.offset, x, t.rows, t.cols, tall, s.decay, s.scaled_lr,
                                                 s.scale);
  model::cuda::check_cuda(cudaGetLastError(), "Muon update kernel launch");
}

}  // namespace stableflash::optim::cuda_detail
