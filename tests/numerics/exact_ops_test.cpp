// "Exact, then round once" BF16 arithmetic, checked by the defining property of correct rounding:
// the exact result lies within half an ulp of the returned value (ties to even).
#include <gtest/gtest.h>

#include <cmath>

#include "stableflash/numerics/exact_ops.hpp"
#include "stableflash/numerics/random.hpp"

namespace stableflash {
namespace {

bf16 random_bf16(SplitMix64& rng, int exp_lo, int exp_hi) {
  const double mag = std::ldexp(rng.uniform(1.0, 2.0), exp_lo + int(rng.next() % std::uint64_t(exp_hi - exp_lo + 1)));
  return bf16::from_float(static_cast<float>(rng.bernoulli(0.5) ? -mag : mag));
}

// The BF16 values adjacent to r (one BF16 ulp below and above in the value order).
std::pair<double, double> neighbours(bf16 r) {
  const float f = r.to_float();
  const std::uint32_t u = float_to_bits(f);
  const float up = bits_to_float(f >= 0 ? u + 0x10000u : u - 0x10000u);
  const float down = bits_to_float(f > 0 ? u - 0x10000u : (f == 0 ? 0x80010000u : u + 0x10000u));
  return {down, up};
}

TEST(ExactOps, DivisionIsCorrectlyRounded) {
  SplitMix64 rng(5);
  for (int n = 0; n < 200000; ++n) {
    const bf16 a = random_bf16(rng, -20, 20), b = random_bf16(rng, -20, 20);
    const bf16 r = a / b;
    const auto [down, up] = neighbours(r);
    const double x = a.to_float(), y = b.to_float(), rv = r.to_float();
    // The midpoints m have 9 significant bits, so x - m*y is exact in FP64 (fma), and its sign
    // (relative to y's) tells on which side of m the exact quotient x/y lies.
    const double lo_mid = (rv + down) / 2, hi_mid = (rv + up) / 2;
    const double s = y > 0 ? 1.0 : -1.0;
    ASSERT_GE(s * std::fma(-lo_mid, y, x), 0.0) << x << " / " << y << " -> " << rv;
    ASSERT_LE(s * std::fma(-hi_mid, y, x), 0.0) << x << " / " << y << " -> " << rv;
  }
}

TEST(ExactOps, SumAndProductAreCorrectlyRounded) {
  SplitMix64 rng(6);
  for (int n = 0; n < 200000; ++n) {
    const bf16 a = random_bf16(rng, -10, 10), b = random_bf16(rng, -10, 10);
    for (const auto& [r, exact] : {std::pair{a + b, double(a.to_float()) + b.to_float()},
                                   std::pair{a * b, double(a.to_float()) * b.to_float()}}) {
      const auto [down, up] = neighbours(r);
      const double rv = r.to_float();
      ASSERT_GE(exact, (rv + down) / 2 - 1e-300);
      ASSERT_LE(exact, (rv + up) / 2 + 1e-300);
      // at an exact midpoint the even neighbour wins
      if (exact == (rv + down) / 2 || exact == (rv + up) / 2) {
        ASSERT_EQ(r.bits & 1u, 0u);
      }
    }
  }
}

TEST(ExactOps, UlpOfBf16) {
  EXPECT_EQ(bf16_ulp(1.0), 1.0 / 128);
  EXPECT_EQ(bf16_ulp(-4.7), 4.0 / 128);
  EXPECT_EQ(bf16_ulp(0.0), std::ldexp(1.0, -133));
  EXPECT_EQ(bf16_ulp(std::ldexp(1.0, -130)), std::ldexp(1.0, -133));  // subnormal spacing
}

}  // namespace
}  // namespace stableflash
