#include "stableflash/numerics/exact_ops.hpp"

#include <cstdint>
#include <cstring>
#include <cmath>
#include <limits>

namespace stableflash {
namespace {

constexpr int kMinNormalExponent = -126;  // BF16 shares FP32's exponent range
constexpr int kStoredBits = 7;

}  // namespace

bf16 bf16_from_double(double x) {
  if (std::isnan(x)) return bf16::from_bits(std::signbit(x) ? 0xffc0 : bf16::kQuietNaN);
  if (std::isinf(x) || x == 0.0) return bf16::from_float(static_cast<float>(x));
  // Scale so the BF16 grid at |x| becomes the integers, round to nearest-even there, scale back.
  // Both scalings are exact (powers of two well inside FP64's range).
  const int e = std::max(std::ilogb(x), kMinNormalExponent);
  const double ulp = std::ldexp(1.0, e - kStoredBits);
  const double r = std::nearbyint(x / ulp) * ulp;  // default rounding mode: to nearest, ties to even
  if (std::fabs(r) > double(max_bf16())) return bf16::from_float(std::copysign(std::numeric_limits<float>::infinity(), x));
  return bf16::from_float(static_cast<float>(r));  // r is a BF16 value: exact in FP32
}

double bf16_ulp(double x) {
  if (x == 0.0 || !std::isfinite(x)) return std::ldexp(1.0, kMinNormalExponent - kStoredBits);
  return std::ldexp(1.0, std::max(std::ilogb(x), kMinNormalExponent) - kStoredBits);
}

bf16 operator/(bf16 a, bf16 b) {
  const double x = a.to_float(), y = b.to_float();
  double q = x / y;
  if (!std::isfinite(q) || q == 0.0) return bf16_from_double(q);
  // Round to odd at FP64's 53 bits, then to nearest-even at 8 bits: correctly rounded overall
  // (53 >= 8 + 2). The remainder tells whether q was exact and on which side it rounded.
  const double rem = std::fma(-q, y, x);  // x - q*y exactly
  if (rem != 0.0) {
    const bool q_above = (rem < 0.0) == (y > 0.0);  // q overshot |x/y| toward +inf
    double trunc = q;
    if (q_above == (q > 0.0)) trunc = std::nextafter(q, 0.0);  // q was rounded away from zero
    std::int64_t bits;
    std::memcpy(&bits, &trunc, sizeof bits);
    if ((bits & 1) == 0) trunc = std::nextafter(trunc, trunc > 0 ? std::numeric_limits<double>::infinity()
                                                                   : -std::numeric_limits<double>::infinity());
    q = trunc;
  }
  return bf16_from_double(q);
}

}  // namespace stableflash
