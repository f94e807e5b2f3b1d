// Bit-exact software BF16 (1 sign, 8 exponent, 7 stored significand bits) and the rounding of
// FP32 values to a narrower significand (docs/numerics-contract.md, "BF16" and `round_bits`).
//
// Everything here is __host__ __device__ and branch-light, so kernels use the same code as the
// CPU oracle. Conversions operate on the FP32 bit pattern: BF16 shares FP32's exponent range, so
// rounding away the low 16 bits of the pattern is exactly FP32 -> BF16 conversion, subnormals
// included, and a carry out of the significand correctly bumps the exponent (up to +inf).
#pragma once

#include <cstdint>
#include <cstring>

#include "stableflash/numerics/host_device.hpp"

namespace stableflash {

enum class Rounding : std::uint8_t { nearest_even, toward_zero, stochastic };

SF_HD std::uint32_t float_to_bits(float x) {
#if SF_DEVICE_CODE && defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

SF_HD float bits_to_float(std::uint32_t u) {
#if SF_DEVICE_CODE && defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

SF_HD bool is_nan_bits(std::uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }
SF_HD bool is_inf_or_nan_bits(std::uint32_t u) { return (u & 0x7f800000u) == 0x7f800000u; }

// Rounds the FP32 value x to `stored_bits` significand bits (0..23) with round-to-nearest-even,
// returning an FP32 value. stored_bits = 7 yields exactly the BF16 values; fewer bits magnify each
// rounding event (docs/numerics-contract.md `round_bits`, an experiment knob). NaN stays a quiet NaN, +-inf stays.
SF_HD float round_to_bits_rne(float x, int stored_bits) {
  std::uint32_t u = float_to_bits(x);
  const int drop = 23 - stored_bits;
  if (drop <= 0) return x;
  if (is_inf_or_nan_bits(u)) return is_nan_bits(u) ? bits_to_float(u | 0x00400000u) : x;
  const std::uint32_t lsb = (u >> drop) & 1u;
  const std::uint32_t half_minus_one = (1u << (drop - 1)) - 1u;
  u += half_minus_one + lsb;  // a carry into the exponent is the correct rounding (up to inf)
  u &= ~((1u << drop) - 1u);
  return bits_to_float(u);
}

struct bf16 {
  std::uint16_t bits = 0;

  static constexpr std::uint16_t kQuietNaN = 0x7fc0;

  SF_HD static bf16 from_bits(std::uint16_t b) {
    bf16 r;
    r.bits = b;
    return r;
  }

  // Round to nearest, ties to even.
  SF_HD static bf16 from_float(float x) {
    const std::uint32_t u = float_to_bits(x);
    if (is_nan_bits(u)) return from_bits(static_cast<std::uint16_t>((u >> 16) | 0x0040u));
    return from_bits(static_cast<std::uint16_t>(float_to_bits(round_to_bits_rne(x, 7)) >> 16));
  }

  // Round toward zero: drop the low 16 bits (inf and NaN survive; NaN is kept quiet).
  SF_HD static bf16 from_float_toward_zero(float x) {
    const std::uint32_t u = float_to_bits(x);
    if (is_nan_bits(u)) return from_bits(static_cast<std::uint16_t>((u >> 16) | 0x0040u));
    return from_bits(static_cast<std::uint16_t>(u >> 16));
  }

  // Stochastic rounding: round away from zero with probability equal to the dropped fraction.
  // `random16` supplies the uniform 16 random bits (callers own the generator, so runs replay).
  SF_HD static bf16 from_float_stochastic(float x, std::uint32_t random16) {
    const std::uint32_t u = float_to_bits(x);
    if (is_inf_or_nan_bits(u)) return from_float_toward_zero(x);
    return from_bits(static_cast<std::uint16_t>((u + (random16 & 0xffffu)) >> 16));
  }

  SF_HD static bf16 from_float(float x, Rounding mode, std::uint32_t random16 = 0) {
    switch (mode) {
      case Rounding::toward_zero: return from_float_toward_zero(x);
      case Rounding::stochastic: return from_float_stochastic(x, random16);
      default: return from_float(x);
    }
  }

  SF_HD float to_float() const { return bits_to_float(static_cast<std::uint32_t>(bits) << 16); }
  SF_HD explicit operator float() const { return to_float(); }

  SF_HD bool is_nan() const { return (bits & 0x7fffu) > 0x7f80u; }
  SF_HD bool is_finite() const { return (bits & 0x7f80u) != 0x7f80u; }
  SF_HD friend bool bitwise_equal(bf16 a, bf16 b) { return a.bits == b.bits; }
};
static_assert(sizeof(bf16) == 2, "bf16 must be a plain 16-bit value (safetensors, kernels)");

// Rounds an FP32 value to the nearest BF16 value, returned as FP32 (the common emulation step).
// On the GPU the hardware conversion (cvt.rn.bf16.f32: RNE, subnormals kept) gives the same value
// in one instruction; only a NaN's payload may differ, and a NaN stays a NaN.
SF_HD float round_bf16(float x) {
#if defined(__CUDA_ARCH__)
  unsigned short h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
  return __uint_as_float(static_cast<unsigned>(h) << 16);
#else
  return bf16::from_float(x).to_float();
#endif
}

// The largest finite BF16 value (0x7f7f); the paper's code masks scores with its negation.
SF_HD float max_bf16() { return bits_to_float(0x7f7f0000u); }

}  // namespace stableflash
