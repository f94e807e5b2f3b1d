// The element-wise and row-wise kernels of the CUDA GPT-2 (model/cuda/layer_kernels.cu): the GPU
// twins of the CPU layers in stableflash/model/layers.hpp, in the precision PyTorch's BF16 autocast
// gives them (the paper's setting): the residual stream, LayerNorm statistics, embeddings and
// every gradient that reaches a parameter in FP32; matmul inputs and outputs in BF16.
//
// N = B * T rows of C features, row-major. Functions are asynchronous on `stream`. Every
// reduction runs in a fixed order (no atomics on floating-point values), so repeated calls on
// the same inputs give the same bits: the trainer's bitwise resume depends on it. Functions that
// ACCUMULATE say so (+=); the others overwrite.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace stableflash::model::cuda {

using bf16_t = __nv_bfloat16;

// x[n, c] = wte[tokens[n], c] + wpe[n % T, c]; x [N, C], wte [Vp, C], wpe [>= T, C], FP32.
void encoder_forward(float* x, const int* tokens, const float* wte, const float* wpe, int B, int T, int C, cudaStream_t stream);

// Embedding gradients from dx [N, C] (FP32), deterministic:
//   dwpe[t, c] += sum over b ascending of dx[b * T + t, c];
//   dwte[token_ids[u], c] += sum over i in [token_offsets[u], token_offsets[u + 1]) ascending of
//   dx[token_rows[i], c], where the host grouped the rows of each distinct token (token_rows
//   ascending within a group; `*distinct` groups, at most B * T, read from device memory so that a
//   CUDA graph replaying the launch sees each batch's count).
void encoder_backward(float* dwte, float* dwpe, const float* dx, const int* token_ids, const int* token_offsets,
                      const int* token_rows, const int* distinct /*device, [1]*/, int B, int T, int C, cudaStream_t stream);

// The token embedding split of data-parallel training (gpt2_cuda.hpp, set_token_embedding_split):
// encoder_backward's wte sums written, not added, one row per group:
//   rows[u, c] = the sum encoder_backward adds to dwte[token_ids[u], c]      rows [distinct, C]
// and later added where the rows' owner keeps wte's gradient, `count` rows with distinct ids:
//   dwte[ids[u], c] += rows[u, c]
// so embedding_rows_backward then add_embedding_rows leaves the bits encoder_backward leaves.
void embedding_rows_backward(float* rows, const float* dx, const int* token_offsets, const int* token_rows, int distinct, int C,
                             cudaStream_t stream);
void add_embedding_rows(float* dwte, const float* rows, const int* ids, int count, int C, cudaStream_t stream);

// LayerNorm forward over C features, optionally fused with the residual add before it:
//   r = residual_in + float(branch)  when branch != nullptr (then written to residual_out [N, C])
//   r = residual_in                  otherwise (residual_out unused, may be null)
//   mean = sum(r) / C, var = sum((r - mean)^2) / C (two passes, FP32), rstd = 1 / sqrt(var + eps)
//   ln_out = BF16((r - mean) * rstd * weight + bias)     (bias may be null)
// mean, rstd [N] FP32 are kept for the backward.
void layernorm_forward(bf16_t* ln_out, float* mean, float* rstd, float* residual_out, const float* residual_in,
                       const bf16_t* branch, const float* weight, const float* bias, int N, int C, float eps, cudaStream_t stream);

// Floats of scratch that layernorm_backward and bias_backward need for their deterministic
// per-block partial sums.
std::int64_t reduction_scratch_floats(int N, int C);

// LayerNorm backward, x the FP32 input of the forward (r above), d_ln [N, C] the gradient of its
// output (BF16: the output of the BF16 product that read the LayerNorm's output, as under autocast):
//   dx += (weight * d_ln - mean(weight * d_ln) - norm * mean(weight * d_ln * norm)) * rstd
//   dweight[c] += sum_n d_ln[n, c] * norm[n, c];  dbias[c] += sum_n d_ln[n, c]  (dbias may be null)
// with norm = (x - mean) * rstd. When dx_bf16 != nullptr it also receives BF16(dx) after the
// accumulation (the gradient entering the BF16 output of the matmul before this residual branch).
void layernorm_backward(float* dx, bf16_t* dx_bf16, float* dweight, float* dbias, const bf16_t* d_ln, const float* x,
                        const float* weight, const float* mean, const float* rstd, int N, int C, float* scratch,
                        cudaStream_t stream);

// out = BF16(in) (round to nearest even).
void cast_to_bf16(bf16_t* out, const float* in, std::int64_t n, cudaStream_t stream);

// dbias[c] += sum_n float(d_out[n, c]) for d_out [N, C] BF16, deterministic.
void bias_backward(float* dbias, const bf16_t* d_out, int N, int C, float* scratch, cudaStream_t stream);

// Softmax cross-entropy over rows of Vp BF16 logits (in FP32: max, sum of exp, log):
//   losses[r] = log(sum_v exp(l[r, v] - max)) - (l[r, target[r]] - max)
// and, when grad_scale != 0, the logits are replaced in place by their gradient
//   BF16(grad_scale * (softmax(l[r])[v] - [v == target[r]]))
// (grad_scale = loss_scale / rows_in_micro_batch for d(loss_scale * mean loss)/d logits).
// Bitwise deterministic, and a row's results do not depend on the rows launched with it. Terms
// exp(l - max) below 2^-126 (logits more than 87 below the row's maximum) may be flushed to 0. A row
// without a finite logit gives NaN, as the CPU twin does.
void softmax_cross_entropy(bf16_t* logits, float* losses, const int* targets, int rows, int Vp, float grad_scale,
                           cudaStream_t stream);

// *out = (accumulate ? *out : 0) + scale * sum_i values[i], summed in one fixed order.
void sum_scaled(float* out, const float* values, std::int64_t n, float scale, bool accumulate, cudaStream_t stream);

}  // namespace stableflash::model::cuda
