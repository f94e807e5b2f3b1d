// The error bound of a `fused` result (docs/architecture.md, docs/numerics-contract.md), after
// FlashAttention's tests: judged against the FP64 reference by the error of an honest BF16 baseline,
//   err(kernel, ref) <= factor * err(naive BF16, ref) + one BF16 ulp at max|ref|,
// factor 2 for the output and 3 for the gradients. The one definition, used by the oracle check
// (`stableflash bench attention`, the kernel lab), the CPU tests and the GPU tests.
#pragma once

#include "stableflash/numerics/exact_ops.hpp"

namespace stableflash::attention {

inline constexpr double kOutputBoundFactor = 2.0;    // O
inline constexpr double kGradientBoundFactor = 3.0;  // dQ, dK, dV

// naive_error: max |naive BF16 - ref|; max_abs_ref: max |ref| over finite elements.
inline double error_bound(double naive_error, double max_abs_ref, double factor) {
  return factor * naive_error + bf16_ulp(max_abs_ref);
}

}  // namespace stableflash::attention
