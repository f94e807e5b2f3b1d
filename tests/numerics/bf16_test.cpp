// BF16 conversion against formulations that share no code with the implementation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "stableflash/numerics/bf16.hpp"
#include "stableflash/numerics/random.hpp"

namespace stableflash {
namespace {

// Independent RNE: bracket x between the two BF16 values around it (found by truncating the bit
// pattern and stepping one BF16 ulp away from zero), compare distances in FP64, ties to the even one.
float bracket_rne(float x) {
  const std::uint32_t u = float_to_bits(x);
  const std::uint32_t lo_bits = u & 0xffff0000u;  // toward zero
  const std::uint32_t hi_bits = lo_bits + 0x10000u;  // away from zero (may become inf: correct)
  const double lo = bits_to_float(lo_bits), hi = bits_to_float(hi_bits);
  const double dlo = std::fabs(double(x) - lo);
  if (std::isinf(hi)) {
    // overflow threshold: the midpoint between max_bf16 and 2^128 rounds to inf (to even)
    const double mid = (lo + std::ldexp(1.0, 128) * (x < 0 ? -1 : 1)) / 2;
    return std::fabs(double(x)) >= std::fabs(mid) ? float(hi) : float(lo);
  }
  const double dhi = std::fabs(hi - double(x));
  if (dlo < dhi) return float(lo);
  if (dhi < dlo) return float(hi);
  return ((lo_bits >> 16) & 1u) ? float(hi) : float(lo);
}

// Independent reduction to `bits` stored significand bits: integer quotient and remainder.
std::uint32_t reference_round_bits(std::uint32_t u, int bits) {
  const int drop = 23 - bits;
  const std::uint32_t kept = u >> drop, rem = u & ((1u << drop) - 1u), half = 1u << (drop - 1);
  const bool up = rem > half || (rem == half && (kept & 1u));
  return (kept + (up ? 1u : 0u)) << drop;
}

TEST(Bf16, RneMatchesBracketingOverEveryExponent) {
  SplitMix64 rng(20261129);
  std::int64_t checked = 0;
  for (std::uint32_t sign = 0; sign < 2; ++sign)
    for (std::uint32_t exp = 0; exp < 255; ++exp)  // 255 = inf/NaN, tested separately
      for (int n = 0; n < 4096; ++n) {
        std::uint32_t mant = std::uint32_t(rng.next()) & 0x7fffffu;
        if (n < 4) mant = (n == 0) ? 0 : (n == 1) ? 0x8000u : (n == 2) ? 0x18000u : 0x7fffffu;  // ties, edges
        const float x = bits_to_float((sign << 31) | (exp << 23) | mant);
        const float got = bf16::from_float(x).to_float();
        const float want = bracket_rne(x);
        ASSERT_EQ(float_to_bits(got), float_to_bits(want)) << "x bits " << std::hex << float_to_bits(x);
        ++checked;
      }
  EXPECT_EQ(checked, 2 * 255 * 4096);
}

TEST(Bf16, TowardZeroTruncatesMagnitude) {
  SplitMix64 rng(7);
  for (int n = 0; n < 200000; ++n) {
    const float x = bits_to_float((std::uint32_t(rng.next()) & 0x7f7fffffu) | ((n & 1u) << 31));
    const float t = bf16::from_float_toward_zero(x).to_float();
    ASSERT_LE(std::fabs(t), std::fabs(x));
    ASSERT_LT(std::fabs(double(x) - t), std::ldexp(1.0, std::max(std::ilogb(x), -126) - 7));
    ASSERT_EQ(float_to_bits(t) & 0xffffu, 0u);
  }
}

TEST(Bf16, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(bf16::from_float(inf).bits, 0x7f80);
  EXPECT_EQ(bf16::from_float(-inf).bits, 0xff80);
  EXPECT_EQ(bf16::from_float(0.0f).bits, 0x0000);
  EXPECT_EQ(bf16::from_float(-0.0f).bits, 0x8000);
  // A NaN whose payload lives only in the low 16 bits must stay NaN (plain truncation gives inf).
  const float nan_low = bits_to_float(0x7f800001u);
  EXPECT_TRUE(bf16::from_float(nan_low).is_nan());
  EXPECT_TRUE(bf16::from_float_toward_zero(nan_low).is_nan());
  EXPECT_TRUE(bf16::from_float_stochastic(nan_low, 0xffff).is_nan());
  EXPECT_TRUE(std::isnan(round_to_bits_rne(nan_low, 3)));
  // Overflow: max_bf16 rounds to itself; half an ulp above it rounds (to even) to inf.
  EXPECT_EQ(bf16::from_float(max_bf16()).bits, 0x7f7f);
  EXPECT_EQ(bf16::from_float(bits_to_float(0x7f7f7fffu)).bits, 0x7f7f);
  EXPECT_EQ(bf16::from_float(bits_to_float(0x7f7f8000u)).bits, 0x7f80);
  // Subnormals are kept, not flushed.
  const float sub = bits_to_float(0x00012345u);
  EXPECT_EQ(bf16::from_float(sub).bits, 0x0001);
  EXPECT_GT(bf16::from_float(sub).to_float(), 0.0f);
}

TEST(Bf16, WorkedExampleFromNumericsContract) {
  // docs/numerics-contract.md: FP32 -4.703990459442139 -> BF16 -4.71875 (RNE), about half an ulp away.
  const float x = -4.703990459442139f;
  EXPECT_EQ(bf16::from_float(x).to_float(), -4.71875f);
  // ... and the FP32 sum of -2.40625, -2.296875 and a remainder of about -8.7e-4 lands there:
  // the two tied values sum to -4.703125, exactly a BF16 midpoint (the shifted-out round bit),
  // and the same-sign remainder sets the sticky bit that breaks the tie away from zero.
  const float tied = -2.40625f + -2.296875f;
  EXPECT_EQ(tied, -4.703125f);
  EXPECT_EQ(bf16::from_float(tied).to_float(), -4.6875f);  // a pure tie goes to even
  const float sum = tied + -8.7e-4f;
  EXPECT_EQ(bf16::from_float(sum).to_float(), -4.71875f);
  EXPECT_EQ(bf16::from_float(tied + 8.7e-4f).to_float(), -4.6875f);  // opposite sign: toward zero
}

TEST(Bf16, StochasticRoundingIsUnbiased) {
  // x sits 0.3 ulp above a BF16 value: SR returns the upper neighbour with probability 0.3.
  const float lo = 1.5f, ulp = 1.0f / 128;
  const float x = lo + 0.3f * ulp;
  SplitMix64 rng(11);
  const int n = 200000;
  double mean = 0.0;
  for (int i = 0; i < n; ++i) {
    const float r = bf16::from_float_stochastic(x, std::uint32_t(rng.next())).to_float();
    ASSERT_TRUE(r == lo || r == lo + ulp);
    mean += r;
  }
  mean /= n;
  // Bernoulli(0.3) scaled by ulp: sd of the mean = ulp*sqrt(0.21/n); allow 6 sd.
  EXPECT_NEAR(mean, double(x), 6.0 * ulp * std::sqrt(0.21 / n));
}

TEST(RoundBits, SevenBitsIsBf16AndFewerMatchBitManipulation) {
  SplitMix64 rng(3);
  for (int n = 0; n < 300000; ++n) {
    const std::uint32_t u = std::uint32_t(rng.next()) & 0x7f7fffffu;  // finite, positive
    const float x = bits_to_float(u);
    ASSERT_EQ(float_to_bits(round_to_bits_rne(x, 7)), float_to_bits(bf16::from_float(x).to_float()));
    for (int bits = 1; bits < 7; ++bits) {
      const std::uint32_t want = reference_round_bits(u, bits);
      ASSERT_EQ(float_to_bits(round_to_bits_rne(x, bits)), want) << "bits " << bits;
      ASSERT_EQ(float_to_bits(round_to_bits_rne(-x, bits)), want | 0x80000000u);
    }
  }
}

}  // namespace
}  // namespace stableflash
