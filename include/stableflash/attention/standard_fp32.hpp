// Standard (materialized-softmax) causal attention in full working precision: the "standard
// attention" of the paper, which does not explode. Templated on the scalar so the model runs it in
// FP32 and the finite-difference checks run the very same code in FP64 (instantiated for float
// and double in attention/cpu_standard_fp32.cpp).
//
// Layout: q, k, v are read as (b, t, h, d) at b * len * row_stride + t * row_stride + h * D + d,
// so they can point straight into a fused qkv activation [B, T, 3C] (row_stride = 3C) or into
// separate [B, T, H, D] tensors (row_stride = H * D). o and d_o are [B, T, H, D] contiguous.
#pragma once

#include <cstdint>

namespace stableflash::attention {

template <class T>
struct StandardAttentionArgs {
  int batch = 1, heads = 1, len = 1, head_dim = 1;
  std::int64_t row_stride = 0;  // elements between consecutive tokens of q, k, v (and dq, dk, dv)
  bool causal = true;
  const T *q = nullptr, *k = nullptr, *v = nullptr;
  T* o = nullptr;      // [B, T, H, D] forward output
  T* probs = nullptr;  // [B, H, T, T] softmax probabilities, written by the forward, read by the backward
};

// o = softmax(q k^T / sqrt(D) + causal mask) v, with the probabilities kept in `probs`.
template <class T>
void standard_attention_forward(const StandardAttentionArgs<T>& args);

// Given d_o [B, T, H, D], writes (overwrites) dq, dk, dv, laid out like q, k, v (row_stride).
template <class T>
void standard_attention_backward(const StandardAttentionArgs<T>& args, const T* d_o, T* dq, T* dk, T* dv);

}  // namespace stableflash::attention
