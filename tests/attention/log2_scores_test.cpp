// The fused forward's scores in log2 units (rounding_points.hpp: score_log2, shift_log2, pbar_log2,
// rescale_log2; the GPU's pipelined walk where the scale is not a power of two). Checked on the host,
// where exp2_fast is exp2f: the row maximum gives exactly 1 under the standard shift (tied maxima stay
// exact ties, the audit's mechanism), and P-bar stays within the bound its roundings give of
// exp(S - m) computed in FP64 from the same FP32 S and m.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <vector>

#include "stableflash/attention/rounding_points.hpp"
#include "stableflash/numerics/random.hpp"

namespace stableflash::attention {
namespace {

// Scales 1/sqrt(D) of head dims whose scale is not a power of two, and a few others.
std::vector<float> scales() {
  std::vector<float> s;
  for (int d : {8, 32, 48, 80, 96, 128, 192, 512}) s.push_back(1.0f / std::sqrt(float(d)));
  for (float x : {0.0137f, 0.3f, 0.69f, 1.7f}) s.push_back(x);
  return s;
}

TEST(Log2Scores, TheStandardShiftsScoreIsExactlyOneAndTiesStayTies) {
  SplitMix64 rng(11);
  int rows = 0;
  for (const float scale : scales()) {
    const float c = fused::log2_scale(scale);
    for (int i = 0; i < 20000; ++i, ++rows) {
      const float r_dot = float(rng.uniform(-1e4, 1e4)) * float(std::pow(10.0, rng.uniform(-6.0, 0.0)));
      const float r_m = fused::score(r_dot, scale);  // the standard shift: m = r_m
      const float m_t = fused::shift_log2(r_dot, c, r_m, r_m);
      const float top = fused::pbar_log2(fused::score_log2(r_dot, c), m_t);
      ASSERT_EQ(top, 1.0f) << "scale " << scale << ", maximum " << r_dot;
      ASSERT_EQ(fused::rescale_log2(m_t, m_t), 1.0f) << "an unmoved shift must rescale by exactly 1";
    }
  }
  EXPECT_GT(rows, 200000);
}

// |P-bar - exp(S - m)| / exp(S - m), S = FP32(dot scale) and m the FP32 shift as the policies give it,
// against the bound of the form's roundings: c = RN(scale log2 e), t = RN(dot c), m_t (RN(r_dot c), plus
// RN(RN(m - r_m) log2 e) under an offset) and t - m_t each carry a relative 2^-24, S and m one each as
// well, so the exponent in log2 units is off by at most 3 (|t| + |m_t|) 2^-24 + |t - m_t| 2^-24 (and
// the offset's own two roundings, |m - r_m| log2 e 2 2^-24), i.e. a relative ln 2 times that in P-bar
// (first order; the 1.01 covers the products of the 2^-24 terms), plus exp2f's half ulp and P-bar's own
// rounding: 2^-24 each.
double log2_form_bound(double t, double m_t, double offset_log2) {
  const double u = std::ldexp(1.0, -24);
  return 1.01 * std::log(2.0) * (3.0 * (std::fabs(t) + std::fabs(m_t)) + std::fabs(t - m_t) + 2.0 * std::fabs(offset_log2)) * u + 2.0 * u;
}

TEST(Log2Scores, PbarIsWithinTheBoundOfItsRoundingsOfExpSMinusM) {
  SplitMix64 rng(12);
  double worst_ratio = 0.0;
  int checked = 0;
  for (const float scale : scales()) {
    const float c = fused::log2_scale(scale);
    for (int i = 0; i < 20000; ++i) {
      const double magnitude = std::pow(10.0, rng.uniform(-3.0, 3.0));
      const float r_dot = float(rng.uniform(-1.0, 1.0) * magnitude);
      const float dot = r_dot - float(rng.uniform(0.0, 1.0) * std::fmin(magnitude, 40.0 / scale));  // P-bar >= e^-40
      const float r_m = fused::score(r_dot, scale);
      // the standard shift, or an offset one as hashed_offset's: m = RN(r_m + o), o in [0.5, 1)
      const bool offset = i % 2 == 1;
      const float m = offset ? add_rn(r_m, float(rng.uniform(0.5, 1.0))) : r_m;
      const float t = fused::score_log2(dot, c), m_t = fused::shift_log2(r_dot, c, r_m, m);
      const float got = fused::pbar_log2(t, m_t);
      const double want = std::exp(double(fused::score(dot, scale)) - double(m));
      ASSERT_LE(got, 1.0f) << "P-bar above 1 at scale " << scale;
      const double error = std::fabs(double(got) - want) / want;
      const double bound = log2_form_bound(t, m_t, offset ? (double(m) - double(r_m)) * 1.4426950408889634 : 0.0);
      ASSERT_LE(error, bound) << "scale " << scale << ", dot " << dot << ", maximum " << r_dot << ", m " << m;
      worst_ratio = std::fmax(worst_ratio, error / bound);
      ++checked;
    }
  }
  EXPECT_GT(checked, 200000);
  // the bound is not loose by orders of magnitude: the form's error reaches a fair part of it
  EXPECT_GT(worst_ratio, 0.05) << "the bound no longer describes the form";
}

// Masked scores (-inf) give 0 against any shift, the first shift of an unseen row (the finite
// kUnseen = -FLT_MAX) rescales by 0, and a row that stays unseen by 1: the kernels' no-test path.
TEST(Log2Scores, MaskedScoresAndUnseenRowsNeedNoTest) {
  const float unseen = -FLT_MAX, scale = 1.0f / std::sqrt(128.0f), c = fused::log2_scale(scale);
  const float masked = fused::score_log2(-HUGE_VALF, c);
  EXPECT_EQ(fused::pbar_log2(masked, unseen), 0.0f);
  EXPECT_EQ(fused::pbar_log2(masked, 3.0f), 0.0f);
  const float r_m = fused::score(2.5f, scale);  // a first maximum, standard shift
  EXPECT_EQ(fused::rescale_log2(unseen, fused::shift_log2(2.5f, c, r_m, r_m)), 0.0f);
  EXPECT_EQ(fused::rescale_log2(unseen, unseen), 1.0f);
}

}  // namespace
}  // namespace stableflash::attention
