// Standard (materialized-softmax) causal attention on the GPU in FP32: the paper's stable baseline
// and the twin of stableflash/attention/standard_fp32.hpp (the CPU model's `numerics = standard`).
// Products are FP32 cuBLASLt GEMMs (FP32 accumulation, no TF32), the softmax and its backward are
// FP32 kernels (model/cuda/standard_attention.cu). Causal, scale 1/sqrt(D).
//
// o and d_o are [B, T, H, D] FP32 (contiguous, head_dim fastest); q, k, v, dq, dk, dv the same with
// a token stride of their own (qkv_token_stride: 3 H D for the column blocks of one [B, T, 3, H, D]
// product); probs and d_probs are [B, H, T, T] FP32 (entries above the diagonal are written as 0).
#pragma once

#include <cstdint>

#include "stableflash/model/cuda/blas.hpp"

namespace stableflash::model::cuda {

struct StandardAttentionShape {
  int batch = 1, heads = 1, len = 1, head_dim = 1;
  std::int64_t qkv_token_stride = 0;  // elements between tokens of q, k, v, dq, dk, dv; 0: heads * head_dim
};

// probs = softmax(q k^T / sqrt(D) + causal mask), o = probs v.
void standard_attention_forward(Blas& blas, const StandardAttentionShape& shape, const float* q, const float* k,
                                const float* v, float* probs, float* o);

// Given d_o, overwrites dq, dk, dv. d_probs is scratch of the size of probs.
void standard_attention_backward(Blas& blas, const StandardAttentionShape& shape, const float* q, const float* k,
                                 const float* v, const float* probs, const float* d_o, float* d_probs, float* dq,
                                 float* dk, float* dv);

}  // namespace stableflash::model::cuda
