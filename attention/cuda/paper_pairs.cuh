// The `paper` numerics' per-element rounding points (rounding_points.hpp) evaluated two scores
// at a time on packed BF16 pairs, the form in which the forward keeps, caches and shifts its
// scores. Each function gives the scalar definition's values bit for bit (device_numerics_test.cu
// checks them against rounding_points.hpp on the host).
#pragma once

#include <cstdint>

#include "stableflash/attention/rounding_points.hpp"
#include "warp_mma.cuh"

namespace stableflash::attention::cuda {

// paper::score of two dot products: BF16(BF16(dot) * scale). The product is an FP32 product of
// the BF16 value, as in the scalar form, so any scale rounds exactly as there.
__device__ __forceinline__ std::uint32_t paper_score_pair(float dot0, float dot1, float scale) {
  const std::uint32_t d = pack_bf16x2(dot0, dot1);
  return pack_bf16x2(mul_rn(bf16_lo(d), scale), mul_rn(bf16_hi(d), scale));
}

// BF16(S - m) of two BF16 scores and a BF16 shift m (paper shifts are BF16 values): one rounding
// of the exact difference, as round_bf16(sub_rn(s, m)) gives (the FP32 difference of two BF16
// values is exact unless their exponents differ by more than 16, and then both forms round to
// the larger operand). -inf scores stay -inf.
__device__ __forceinline__ std::uint32_t paper_shifted_pair(std::uint32_t s2, float m) {
  return bf16x2_sub(s2, pack_bf16x2(m, m));
}

}  // namespace stableflash::attention::cuda
