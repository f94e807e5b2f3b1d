// Input generation for the bias audit. Scores are built coordinate by coordinate so that the tied
// maxima are exact in every numerics (tied keys are the same vector), the row maxima sit where the
// case says, and the remainder mass is calibrated per row:
//   k[0] = k[3] = 1 for every key; tied keys have nothing else.
//   near keys (non-tied keys in a tile holding a tie): k[1] = g_j in [1, 2), k[4:] ~ N(0, 1)
//   far keys (every other key): k[2] = 1, k[4:] ~ N(0, 1)
//   q[0] + q[3] = L_i / scale (q[0] its BF16 rounding, q[3] the rest, so large row maxima keep
//   their spread), q[1] = -b_i / scale, q[2] = -kFarGap / scale, q[4:] = noise
// so S_tie = L_i, S_near = L_i - b_i g_j + noise, S_far = L_i - kFarGap + noise, where b_i is solved
// so the near keys carry the target remainder mass. Far keys get exactly zero weight in FP32.
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "stableflash/diag/audit.hpp"
#include "stableflash/numerics/random.hpp"

namespace stableflash::diag {
namespace {

constexpr int kFirstNoiseDim = 4;
constexpr double kFarGap = 200.0;     // exp(-200) is 0 in FP32 even after BF16 rounding of S
constexpr double kNoiseStd = 0.5;     // per-row variation of near scores, in units of S
constexpr double kMagnitudeLo = 0.5, kMagnitudeHi = 4.0;  // |V|, |dO| (equal exponents are common)

enum class KeyRole { tie, near, far };

std::vector<KeyRole> key_roles(const AuditCase& c) {
  std::vector<KeyRole> roles(c.T, KeyRole::far);
  std::vector<bool> tile_has_tie((c.T + c.tile - 1) / c.tile, false);
  for (int t = 0; t < c.ties; ++t) {
    const int key = c.cross_tile ? t * c.tile : t;
    roles[key] = KeyRole::tie;
    tile_has_tie[key / c.tile] = true;
  }
  for (int j = 0; j < c.T; ++j)
    if (roles[j] != KeyRole::tie && tile_has_tie[j / c.tile]) roles[j] = KeyRole::near;
  return roles;
}

// Solves sum_j exp(-(b g_j - n_j)) = target for b > 0 (the sum falls as b grows).
double solve_gap_scale(const std::vector<double>& g, const std::vector<double>& noise, double target) {
  auto mass = [&](double b) {
    double m = 0.0;
    for (std::size_t j = 0; j < g.size(); ++j) m += std::exp(-(b * g[j] - noise[j]));
    return m;
  };
  double lo = 1e-3, hi = kFarGap;
  if (mass(hi) > target) return hi;
  if (mass(lo) < target) return lo;
  for (int it = 0; it < 200; ++it) {
    const double mid = std::sqrt(lo * hi);
    (mass(mid) > target ? lo : hi) = mid;
  }
  return std::sqrt(lo * hi);
}

bf16 to_bf16(double x) { return bf16::from_float(static_cast<float>(x)); }

void check_case(const AuditCase& c) {
  auto fail = [](const std::string& m) { throw std::invalid_argument("audit case: " + m); };
  if (c.ties < 1) fail("ties must be >= 1");
  if (c.D < kFirstNoiseDim + 1 || c.D > attention::kMaxHeadDim) fail("D must be in 5.." + std::to_string(attention::kMaxHeadDim));
  if (c.T < c.ties) fail("T must be at least the number of ties");
  if (c.tile < 1) fail("tile must be >= 1");
  if (c.cross_tile && std::int64_t(c.ties - 1) * c.tile >= c.T)
    fail("cross_tile needs (ties-1)*tile < T, got ties=" + std::to_string(c.ties) + " tile=" + std::to_string(c.tile));
  if (!(c.remainder >= 0.0 && c.remainder < 1.0)) fail("remainder must be in [0, 1)");
  if (!(c.v_neg >= 0 && c.v_neg <= 1 && c.do_neg >= 0 && c.do_neg <= 1)) fail("v_neg and do_neg are probabilities");
  if (c.heads < 1) fail("heads must be >= 1");
}

}  // namespace

AuditInputs generate_audit_inputs(const AuditCase& c) {
  check_case(c);
  const int T = c.T, D = c.D;
  const double scale = 1.0 / std::sqrt(static_cast<float>(D));  // the FP32 1/sqrt(D) the modes use
  const double noise_coeff = kNoiseStd / (scale * std::sqrt(double(D - kFirstNoiseDim)));
  const std::vector<KeyRole> roles = key_roles(c);
  AuditInputs in;
  in.shape = {1, c.heads, T, T, D};
  const std::size_t n = std::size_t(c.heads) * T * D;
  in.q.resize(n), in.k.resize(n), in.v.resize(n), in.d_o.resize(n);
  double remainder_sum = 0.0;

  for (int h = 0; h < c.heads; ++h) {
    SplitMix64 rng(c.seed, std::uint64_t(h));
    const std::size_t base = std::size_t(h) * T * D;
    // keys
    std::vector<double> g(T, 0.0), z(std::size_t(T) * D, 0.0);
    for (int j = 0; j < T; ++j) {
      bf16* kj = in.k.data() + base + std::size_t(j) * D;
      std::fill(kj, kj + D, bf16{});
      kj[0] = kj[3] = to_bf16(1.0);
      if (roles[j] == KeyRole::tie) continue;
      if (roles[j] == KeyRole::near) kj[1] = to_bf16(g[j] = rng.uniform(1.0, 2.0));
      else kj[2] = to_bf16(1.0);
      for (int d = kFirstNoiseDim; d < D; ++d) kj[d] = to_bf16(z[std::size_t(j) * D + d] = rng.normal());
    }
    // queries: row max, calibrated gap scale, noise
    for (int i = 0; i < T; ++i) {
      const double row_max = c.logit_scale + c.spread * (rng.uniform() - 0.5);
      std::vector<double> w(D, 0.0);
      for (int d = kFirstNoiseDim; d < D; ++d) w[d] = noise_coeff * rng.normal();
      std::vector<double> near_g, near_noise;
      for (int j = 0; j < T; ++j) {
        if (roles[j] != KeyRole::near) continue;
        double dot = 0.0;
        for (int d = kFirstNoiseDim; d < D; ++d) dot += w[d] * z[std::size_t(j) * D + d];
        near_g.push_back(g[j]);
        near_noise.push_back(scale * dot);
      }
      const double target = c.ties * c.remainder / (1.0 - c.remainder);
      const double b = (c.remainder == 0.0 || near_g.empty()) ? kFarGap : solve_gap_scale(near_g, near_noise, target);
      bf16* qi = in.q.data() + base + std::size_t(i) * D;
      qi[0] = to_bf16(row_max / scale);
      qi[3] = to_bf16(row_max / scale - double(qi[0].to_float()));
      qi[1] = to_bf16(-b / scale);
      qi[2] = to_bf16(-kFarGap / scale);
      for (int d = kFirstNoiseDim; d < D; ++d) qi[d] = to_bf16(w[d]);
    }
    // V and dO: the first D/2 features are sign-skewed
    auto fill_skewed = [&](bf16* x, double p_neg) {
      for (int t = 0; t < T; ++t)
        for (int d = 0; d < D; ++d) {
          const double mag = rng.uniform(kMagnitudeLo, kMagnitudeHi);
          const bool neg = rng.bernoulli(d < D / 2 ? p_neg : 0.5);
          x[std::size_t(t) * D + d] = to_bf16(neg ? -mag : mag);
        }
    };
    fill_skewed(in.v.data() + base, c.v_neg);
    fill_skewed(in.d_o.data() + base, c.do_neg);

    // achieved remainder: FP64 softmax mass outside the tied keys, from the BF16 values
    for (int i = 0; i < T; ++i) {
      const bf16* qi = in.q.data() + base + std::size_t(i) * D;
      std::vector<double> s(T);
      double mx = -std::numeric_limits<double>::infinity();
      for (int j = 0; j < T; ++j) {
        double dot = 0.0;
        for (int d = 0; d < D; ++d) dot += double(qi[d].to_float()) * in.k[base + std::size_t(j) * D + d].to_float();
        mx = std::max(mx, s[j] = dot * scale);
      }
      double total = 0.0, tied = 0.0;
      for (int j = 0; j < T; ++j) {
        const double p = std::exp(s[j] - mx);
        total += p;
        if (roles[j] == KeyRole::tie) tied += p;
      }
      remainder_sum += 1.0 - tied / total;
    }
  }
  in.remainder_achieved = remainder_sum / (double(c.heads) * T);
  return in;
}

}  // namespace stableflash::diag
