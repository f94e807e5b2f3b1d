// A small counter-friendly random generator with fixed, portable output (std::normal_distribution
// differs between standard libraries; runs must replay bit for bit everywhere).
#pragma once

#include <cmath>
#include <cstdint>

namespace stableflash {

// SplitMix64: 64-bit state, passes BigCrush, trivially seekable by re-seeding with (seed, stream).
class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}
  SplitMix64(std::uint64_t seed, std::uint64_t stream) : state_(seed ^ (stream * 0xd1b54a32d192ed03ull + 0x8bb84b93962eacc9ull)) {}

  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  bool bernoulli(double p) { return uniform() < p; }
  // Standard normal by Box-Muller (one value per call; simplicity over speed).
  double normal() {
    const double u1 = 1.0 - uniform();  // (0, 1]
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  std::uint64_t state_;
};

}  // namespace stableflash
