// The dK / dV group sum of grouped-query attention (group_sum.cu), launched by entry.cu after the
// backward's main kernel. Its own header so that the kernel instance files do not depend on it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernel_params.cuh"

namespace stableflash::attention::cuda {

struct GroupSumParams {
  const std::uint16_t* per_head;  // [B, H, Tk, D] packed: the main kernel's per-query-head BF16 gradients
  std::uint16_t* out;             // [B, H_kv, Tk, D] with out_strides (rows 8-byte aligned)
  TensorStrides out_strides;
  int batch, kv_heads, group, len, head_dim;  // H = kv_heads * group
};

// out(b, kv, t, :) = BF16(FP32 sum over g ascending of per_head(b, kv * group + g, t, :)).
void launch_group_sum(const GroupSumParams& p, cudaStream_t stream);

}  // namespace stableflash::attention::cuda
