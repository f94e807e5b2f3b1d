// BF16 arithmetic as "compute exactly, then round once" (docs/numerics-contract.md), and FP64 helpers used by
// the oracle and the error measures. Host-only: kernels never compute in FP64.
#pragma once

#include <cmath>
#include <cstdint>

#include "stableflash/numerics/bf16.hpp"

namespace stableflash {

// Rounds an FP64 value to BF16 in one step (no detour through FP32, which would round twice).
bf16 bf16_from_double(double x);

// The spacing of BF16 values at |x|: the unit in the last place used by the audit's measures.
double bf16_ulp(double x);

// BF16 ops: exact result (FP64 holds the exact sum/product of two BF16 values), rounded once.
inline bf16 operator+(bf16 a, bf16 b) { return bf16_from_double(double(a.to_float()) + double(b.to_float())); }
inline bf16 operator-(bf16 a, bf16 b) { return bf16_from_double(double(a.to_float()) - double(b.to_float())); }
inline bf16 operator*(bf16 a, bf16 b) { return bf16_from_double(double(a.to_float()) * double(b.to_float())); }
// A quotient is not exact in FP64; round-to-odd in FP64 followed by RNE to 8 bits is still
// correctly rounded, which bf16_div implements.
bf16 operator/(bf16 a, bf16 b);

}  // namespace stableflash
