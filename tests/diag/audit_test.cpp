// Audit regressions: the bias the paper describes is measured where it must be, and removed where
// the fixes claim to remove it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "stableflash/diag/audit.hpp"

namespace stableflash::diag {
namespace {

using namespace stableflash::attention;

// docs/numerics-contract.md's regression case: `paper` numerics, one key tile, 2 ties, remainder ~1e-4, V
// mostly negative, row maxima spread over >= 0.5 (here 4: r_m in [6, 10]).
AuditCase regression_case(double spread) {
  AuditCase c;
  c.ties = 2, c.remainder = 1e-4, c.v_neg = 0.9, c.do_neg = 0.9, c.logit_scale = 8, c.spread = spread;
  c.T = 256, c.D = 64, c.tile = 256, c.heads = 8, c.seed = 0;
  return c;
}

std::vector<AuditResult> run(const AuditCase& c, Numerics n, std::vector<ShiftPolicy> policies) {
  std::vector<AuditVariant> vs;
  for (ShiftPolicy p : policies) vs.push_back({n, p, Normalizer::fp32, 7});
  return audit_case(c, vs, {DeltaSource::rounded, DeltaSource::compensated, DeltaSource::exact}, PolicyParams{});
}

TEST(Audit, RemainderMassIsCalibrated) {
  for (double rem : {1e-5, 1e-4, 1e-2}) {
    AuditCase c = regression_case(1.0);
    c.remainder = rem, c.heads = 1;
    const AuditInputs in = generate_audit_inputs(c);
    EXPECT_NEAR(in.remainder_achieved, rem, 0.05 * rem);  // BF16 rounding of q moves it by ~2^-8 relative per row
  }
}

TEST(Audit, PaperNumericsStandardPolicyIsStronglyBiasedAndThePublishedPolicyRemovesIt) {
  const auto r = run(regression_case(4.0), Numerics::paper, {ShiftPolicy::standard, ShiftPolicy::paper, ShiftPolicy::hashed_offset});
  ASSERT_TRUE(r[0].o_bias.value && r[1].o_bias.value && r[2].o_bias.value);
  EXPECT_LE(*r[0].o_bias.value, -0.3) << "standard";
  EXPECT_GT(r[0].ties.tie_event_rows, r[0].ties.rows / 2);  // the exact-1.0 events are there
  EXPECT_LE(std::fabs(*r[1].o_bias.value), 0.1) << "published";
  EXPECT_EQ(r[1].ties.tie_event_rows, 0);
  EXPECT_LE(std::fabs(*r[2].o_bias.value), 0.1) << "hashed_offset";
  EXPECT_EQ(r[2].ties.tie_event_rows, 0);
  // the delta of the rounded O inherits the bias (dO mostly negative too): positive drift
  EXPECT_GE(*r[0].deltas[0].bias.value, 0.3);
}

// docs/numerics-findings.md section 2, "Equal row maxima": when every row shares r_m,
// exp(-(beta-1) r_m) rounds the same way in all of them, so the published policy's O bias grows as
// the spread of row maxima shrinks. hashed_offset's per-row offset does not depend on the spread: in
// `fused` numerics its O bias stays within +-0.02 at every spread and does not move with it
// (measured +0.0056 +- 0.020 at spreads 0, 0.5 and 4 alike, to four decimals: held to 0.005); in `paper` numerics, which round l and O to BF16 at every
// tile, equal maxima leave it a bias too (-0.14 at spread 0), but never more than the published
// rule's (-0.19).
TEST(Audit, HashedOffsetDoesNotDependOnTheSpreadOfRowMaxima) {
  const std::vector<ShiftPolicy> policies = {ShiftPolicy::paper, ShiftPolicy::hashed_offset};
  const auto paper0 = run(regression_case(0.0), Numerics::paper, policies);
  const auto paper4 = run(regression_case(4.0), Numerics::paper, policies);
  for (const auto* r : {&paper0, &paper4})
    for (const AuditResult& x : *r) ASSERT_TRUE(x.o_bias.value && x.o_bias.se);
  // paper numerics: the published rule is worse with equal maxima; hashed_offset never worse than it
  EXPECT_GT(std::fabs(*paper0[0].o_bias.value), std::fabs(*paper4[0].o_bias.value));
  EXPECT_LE(std::fabs(*paper0[1].o_bias.value), std::fabs(*paper0[0].o_bias.value)) << "spread 0";
  EXPECT_LE(std::fabs(*paper4[1].o_bias.value), std::fabs(*paper4[0].o_bias.value)) << "spread 4";
  // fused numerics: hashed_offset's bias is small and the same at every spread
  std::vector<Bias> fused;
  for (double spread : {0.0, 0.5, 4.0}) {
    const auto r = run(regression_case(spread), Numerics::fused, {ShiftPolicy::hashed_offset});
    ASSERT_TRUE(r[0].o_bias.value && r[0].o_bias.se) << "spread " << spread;
    fused.push_back(r[0].o_bias);
    EXPECT_LE(std::fabs(*r[0].o_bias.value), 0.02) << "fused hashed_offset, spread " << spread;
  }
  for (std::size_t i = 1; i < fused.size(); ++i)
    EXPECT_LE(std::fabs(*fused[i].value - *fused[0].value), 0.005)
        << "fused hashed_offset O bias moved with the spread: " << *fused[0].value << " -> " << *fused[i].value;
  std::printf("O bias, paper numerics: published %+.3f (spread 0), %+.3f (4); hashed_offset %+.3f, %+.3f. "
              "fused hashed_offset: %+.4f +- %.4f, %+.4f +- %.4f, %+.4f +- %.4f (spread 0, 0.5, 4)\n",
              *paper0[0].o_bias.value, *paper4[0].o_bias.value, *paper0[1].o_bias.value, *paper4[1].o_bias.value,
              *fused[0].value, *fused[0].se, *fused[1].value, *fused[1].se, *fused[2].value, *fused[2].se);
}

TEST(Audit, CompensatedAndExactDeltaRemoveTheDriftOfTheRoundedOutput) {
  for (Numerics n : {Numerics::paper, Numerics::fused}) {
    const auto r = run(regression_case(4.0), n, {ShiftPolicy::standard});
    const double rounded = std::fabs(r[0].deltas[0].drift), compensated = std::fabs(r[0].deltas[1].drift),
                 exact = std::fabs(r[0].deltas[2].drift);
    std::printf("%s standard: delta drift rounded %.2e, compensated %.2e, exact %.2e\n", std::string(to_string(n)).c_str(),
                rounded, compensated, exact);
    EXPECT_GT(rounded, 1e-4);  // the rounded O's systematic part, ~0.1-0.2 BF16 ulp per row
    // the residual restores ~8 more bits: the drift must fall by at least 2^8
    EXPECT_LT(compensated, rounded / 256);
    if (n == Numerics::fused) {
      EXPECT_LT(exact, rounded / 256);
    }
  }
}

TEST(Audit, FusedNumericsWithPublishedPolicyGivesNaNAtHugeLogits) {
  AuditCase c = regression_case(1.0);
  c.logit_scale = 1e4, c.heads = 1;
  const auto r = run(c, Numerics::fused, {ShiftPolicy::paper, ShiftPolicy::hashed_offset});
  EXPECT_EQ(r[0].nonfinite, std::int64_t(c.T) * c.D);
  EXPECT_EQ(r[1].nonfinite, 0);
  EXPECT_EQ(r[1].zeroed_rows, 0);
}

TEST(Audit, JsonLinesCarryTheContractFields) {
  AuditCase c = regression_case(1.0);
  c.heads = 1, c.T = 32, c.tile = 32;
  const auto r = run(c, Numerics::paper, {ShiftPolicy::standard});
  const auto lines = to_json_lines(r[0]);
  ASSERT_EQ(lines.size(), 3u);
  for (const char* field : {"numerics", "policy", "delta_source", "normalizer", "round_bits", "ties", "remainder",
                            "logit_scale", "\"T\"", "\"D\"", "tile", "seed", "o_bias", "delta_bias", "mean_err_ulp", "rel_l2",
                            "nonfinite", "tie_rows"})
    EXPECT_NE(lines[0].find(field), std::string::npos) << field;
}

}  // namespace
}  // namespace stableflash::diag
