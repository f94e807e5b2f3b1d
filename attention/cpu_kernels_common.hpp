// Private helpers of the CPU attention: FP32-accumulator emulation and head views.
#pragma once

#include <cstdint>
#include <vector>

#include "stableflash/attention/attention.hpp"
#include "stableflash/numerics/fp32_ops.hpp"

namespace stableflash::attention::detail {

// An FP32 accumulator as good as one can be: the CPU sums exactly (FP64 holds products of BF16
// values exactly and their sums to far below FP32's precision) and rounds once to FP32. Tensor
// cores may differ in the last FP32 bits; the BF16 rounding that follows hides that except at
// midpoints (docs/numerics-contract.md allows the accumulation order to differ).
struct Fp32Accumulator {
  double sum = 0.0;
  void add(double x) { sum += x; }
  float value() const { return static_cast<float>(sum); }
};

inline float dot_fp32(const float* a, const float* b, int n) {
  double s = 0.0;
  for (int d = 0; d < n; ++d) s += double(a[d]) * double(b[d]);
  return static_cast<float>(s);
}

// A BF16 tensor widened to FP32 and rearranged head-major [B, H, T, D], so each (b, h) head is
// one contiguous [T, D] block whatever the input's strides.
struct HeadMajor {
  std::vector<float> values;
  int heads = 0, len = 0, dim = 0;

  HeadMajor(const bf16* src, const HeadStrides& st, int batch, int heads_, int len_, int dim_);
  const float* head(int b, int h) const { return values.data() + (std::int64_t(b) * heads + h) * len * dim; }
  const float* row(int b, int h, int t) const { return head(b, h) + std::int64_t(t) * dim; }
};

// Writes a head-major [T, D] block of values into (b, h) of a tensor with strides `st`.
template <class T, class Src, class Convert>
void scatter_head(T* dst, const HeadStrides& st, const AttentionShape& s, int len, int b, int h, const Src* src, Convert conv) {
  for (int t = 0; t < len; ++t)
    for (int d = 0; d < s.head_dim; ++d) dst[st.at(b, h, t) + d] = conv(src[std::int64_t(t) * s.head_dim + d]);
}

// The dK/dV of a KV head under grouped-query attention: the BF16 gradients of its query heads
// (each exactly what multi-head attention on repeated K/V computes), summed in FP32 in ascending
// query-head order (the first head's value taken as is, so a group of one is the MHA result,
// signed zeros included), rounded once to BF16 when the group is done.
struct GroupGradientSum {
  std::vector<float> sum;  // [Tk, D]
  explicit GroupGradientSum(std::size_t n) : sum(n) {}
  void add(std::size_t at, bool first_in_group, bf16 head_grad) {
    const float x = head_grad.to_float();
    sum[at] = first_in_group ? x : add_rn(sum[at], x);
  }
};

}  // namespace stableflash::attention::detail
