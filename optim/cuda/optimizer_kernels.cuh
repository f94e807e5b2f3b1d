// Kernel launchers shared by the files of the CUDA optimizer (cuda_optimizer.cu drives them).
// Private to optim/cuda: the public contract is stableflash/optim/cuda_optimizer.hpp.
//
// Arithmetic rule of every kernel here: each FP32 operation is written with an explicit
// round-to-nearest intrinsic (__fmul_rn, __fadd_rn, ...), in the order of Optimizer<float> in
// optim/optimizer.cpp. nvcc would otherwise contract a*b + c into one FMA, and the GPU state would
// drift from the CPU twin by a rounding per operation; with the intrinsics it matches it wherever
// the host compiler does not contract either.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "stableflash/model/cuda/blas.hpp"

namespace stableflash::optim::cuda_detail {

inline constexpr int kThreads = 256;

// Grid of the grid-stride element-wise kernels: enough blocks to fill an H200 several times over,
// capped so huge tensors loop instead of launching millions of blocks.
inline unsigned elementwise_blocks(std::int64_t n) {
  return unsigned(std::clamp<std::int64_t>((n + kThreads - 1) / kThreads, 1, 8192));
}

// ---- AdamW (adamw.cu) ----

// One AdamW launch covers every AdamW tensor through this table: a block per chunk of at most
// kAdamwChunk elements, so a 38M-element embedding and a 768-element LayerNorm weight share a
// launch without one block doing all the work.
inline constexpr std::int32_t kAdamwChunk = 1 << 16;
// Sharded (ZeRO-1), AdamW runs one launch per gradient bucket over the rank's piece of it (a few
// million values), and in update parts one per layer: smaller chunks keep such a launch at
// hundreds of blocks, enough to fill the GPU.
inline constexpr std::int32_t kAdamwShardChunk = 1 << 13;
struct AdamwChunk {
  std::int64_t offset = 0;      // of the chunk's first element in the flat parameters
  std::int64_t state_offset = 0;  // of its first element in the moments (== offset unless sharded: ZeRO-1 keeps only its shard)
  std::int32_t size = 0;        // 1..kAdamwChunk (kAdamwShardChunk when sharded)
  std::int32_t apply_decay = 0;  // weight decay touches 2-D tensors only
};

// The clipping of one step, in device memory: written by the norm's last kernel (or from a
// host-side norm, ZeRO-1) and read by every update kernel, so no host round trip sits between the
// backward and the update. Each gradient is read as FP32(g * factor), the value an in-place clip
// would have stored (factor 1 when not clipping: g * 1 == g, no flush-to-zero here).
struct StepScale {
  double norm = 0;   // the global gradient norm before clipping (sqrt of the FP64 sum of squares)
  float factor = 1;  // FP32(max_norm / (norm + 1e-6)) when max_norm > 0 and norm > max_norm, else 1
  int skip = 0;      // 1 when the norm is not finite: the update writes nothing (the trainer stops)
};

// Per-step scalars, rounded to FP32 on the host exactly where Optimizer<float>::adamw_tensor rounds.
// The clipping factor comes from `scale` (device memory, see StepScale).
struct AdamwScalars {
  float beta1 = 0, one_minus_beta1 = 0, beta2 = 0, one_minus_beta2 = 0, eps = 0;
  float bc2_sqrt = 0, step_size = 0, decay = 1;
  const StepScale* scale = nullptr;
  int zero_grads = 0;  // 1: each gradient is set to 0 once read (the next step's zero_grad, fused)
};

struct AdamwBuffers {
  float* params = nullptr;
  __nv_bfloat16* params_bf16 = nullptr;
  float* grads = nullptr;  // read, and written only with AdamwScalars::zero_grads
  float* m = nullptr;
  float* v = nullptr;
};

void launch_adamw(const AdamwChunk* chunks, int n_chunks, const AdamwScalars& s, const AdamwBuffers& b, cudaStream_t stream);

// ---- Deterministic sums of squares (grad_norm.cu) ----

// The first pass writes at most kMaxPartials per-block sums; the count depends on n only, so the
// summation order (hence every bit of the result) is fixed for a given n.
inline constexpr int kMaxPartials = 1024;

// *sum = sum of x[i]^2 over i < n in FP64. Squares of FP32 and BF16 values are exact in FP64, so
// the only roundings are the additions, in a fixed order. `partials` holds kMaxPartials doubles.
template <class T>
void launch_sum_squares(const T* x, std::int64_t n, double* partials, double* sum, cudaStream_t stream);

// scale = the clipping of sums[0] + ... + sums[n - 1] (added in ascending order in FP64, then the
// square root and the factor, every operation IEEE round-to-nearest: bitwise the host formula of
// CudaOptimizer::clip_with_sum_of_squares on the same sums). One thread.
void launch_clip_factor(const double* sums, int n, double max_norm, StepScale* scale, cudaStream_t stream);
// scale = {norm, factor, skip} computed on the host (ZeRO-1: the norm from every rank's part).
void launch_set_scale(StepScale* scale, const StepScale& value, cudaStream_t stream);

// ---- Muon (muon.cu) ----

struct MuonTensor {
  std::int64_t offset = 0;
  std::int64_t state_offset = 0;  // of its momentum (== offset unless the optimizer is sharded)
  int rows = 0, cols = 0;
};

struct MuonScalars {
  float mu = 0, one_minus_mu = 0;
  bool nesterov = true;
  float decay = 1, scaled_lr = 0;  // p = p * decay - scaled_lr * X
  int ns_steps = 5;
  const StepScale* scale = nullptr;  // the clipping factor, as AdamwScalars::scale
  int zero_grads = 0;                // as AdamwScalars::zero_grads
};

// Device scratch for one tensor at a time: x, y hold [r, k] and gram, poly [r, r] (r <= k, the
// wide orientation) of the largest Muon tensor; partials/sum as for launch_sum_squares.
struct MuonScratch {
  __nv_bfloat16 *x = nullptr, *y = nullptr, *gram = nullptr, *poly = nullptr;
  double *partials = nullptr, *sum = nullptr;
};

// One Muon update of tensor t: momentum, Nesterov look-ahead, Newton-Schulz in BF16 and the
// decayed, scaled update of params and its BF16 copy. All on blas.stream(). With s.scale->skip
// nothing is written but the scratch.
void muon_tensor(const MuonTensor& t, const MuonScalars& s, float* params, __nv_bfloat16* params_bf16, float* grads,
                 float* momentum, const MuonScratch& scratch, model::cuda::Blas& blas);

}  // namespace stableflash::optim::cuda_detail
