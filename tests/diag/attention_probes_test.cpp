// The attention probes (diag/attention_probes.hpp) against independent computations:
//   - row statistics with every row sampled against the CPU kernel's own per-head counters (a
//     separate implementation of the same definitions: docs/numerics-contract.md "The audit's measures"), and
//     the largest logit and top-key mass against an FP64 softmax of the same BF16 inputs;
//   - the delta shadow against FP64 sums of dO * residual;
//   - the rank-1 similarity against explicit C x D matrices (Eigen, FP64).
#include <gtest/gtest.h>

#include <Eigen/Dense>

#include <cmath>
#include <vector>

#include "stableflash/diag/attention_probes.hpp"
#include "stableflash/numerics/random.hpp"

namespace stableflash::diag {
namespace {

using attention::Numerics;
using attention::ShiftPolicy;

// A layer capture of random BF16 tensors in [B, T, H, D], run through the CPU forward (and the
// delta needs dO). Coarse values (multiples of 1/4, few levels) make repeated maxima common.
model::LayerCapture make_capture(Numerics numerics, ShiftPolicy policy, attention::DeltaSource delta, int B, int T, int H, int D, int C,
                                 std::uint64_t seed, bool coarse) {
  model::LayerCapture c;
  c.options.numerics = numerics, c.options.policy = policy, c.options.causal = true, c.options.delta_source = delta;
  c.options.tile_k = 32;
  c.shape = {B, H, T, T, D};
  const std::size_t n = std::size_t(B) * T * H * D;
  SplitMix64 rng(seed);
  auto fill = [&](std::vector<bf16>& v, double scale) {
    v.resize(n);
    for (auto& x : v) x = bf16::from_float(float(coarse ? std::round(rng.normal() * 2) / 4 * scale : rng.normal() * scale));
  };
  fill(c.q, 1.0), fill(c.k, 1.0), fill(c.v, 1.0), fill(c.d_o, 0.1);
  c.o.resize(n), c.o_residual.resize(n), c.lse.resize(std::size_t(B) * H * T);
  c.x.resize(std::size_t(B) * T * C);
  for (auto& x : c.x) x = float(rng.normal());
  attention::ForwardArgs a;
  a.shape = c.shape, a.layout = attention::Layout::bthd;
  a.q = c.q.data(), a.k = c.k.data(), a.v = c.v.data(), a.o = c.o.data(), a.lse = c.lse.data(), a.o_residual = c.o_residual.data();
  attention::attention_forward(a, c.options);
  return c;
}

std::vector<attention::TieCounts> kernel_counts(const model::LayerCapture& c) {
  std::vector<attention::TieCounts> heads(std::size_t(c.shape.heads));
  std::vector<bf16> o(c.o.size()), r(c.o.size());
  std::vector<float> lse(c.lse.size());
  attention::ForwardArgs a;
  a.shape = c.shape, a.layout = attention::Layout::bthd;
  a.q = c.q.data(), a.k = c.k.data(), a.v = c.v.data(), a.o = o.data(), a.lse = lse.data(), a.o_residual = r.data();
  a.head_ties = heads.data();
  attention::attention_forward(a, c.options);
  return heads;
}

TEST(AttentionRowStats, EqualTheKernelCountersWithEveryRowSampled) {
  int tied = 0;
  for (Numerics numerics : {Numerics::paper, Numerics::fused})
    for (ShiftPolicy policy : {ShiftPolicy::standard, ShiftPolicy::paper, ShiftPolicy::hashed_offset}) {
      const auto c = make_capture(numerics, policy, attention::DeltaSource::rounded, 2, 70, 3, 16, 8, 11, /*coarse=*/true);
      const auto stats = attention_row_stats(c, sampled_rows(70, 70));
      const auto kernel = kernel_counts(c);
      for (int h = 0; h < 3; ++h) {
        const auto& s = stats[std::size_t(h)];
        const auto& k = kernel[std::size_t(h)];
        EXPECT_EQ(s.rows, k.rows) << to_string(numerics) << " " << to_string(policy) << " head " << h;
        EXPECT_EQ(s.repeated_max_rows, k.repeated_max_rows) << to_string(numerics) << " " << to_string(policy) << " head " << h;
        EXPECT_EQ(s.tie_event_rows, k.tie_event_rows) << to_string(numerics) << " " << to_string(policy) << " head " << h;
        // A tie event needs >= 2 exact ones in one tile: never more events than half the ones.
        EXPECT_LE(2 * s.tie_event_rows, s.pbar_ones);
        tied += int(k.repeated_max_rows);
      }
    }
  EXPECT_GT(tied, 50) << "the coarse inputs should produce repeated maxima (else the test shows nothing)";
}

// The largest logit and the top key's mass against an FP64 softmax of the BF16 inputs (fused
// numerics). Bounds: the fused score is FP32(FP32(dot) * scale): two roundings, 2^-23 |S|; the
// mass exp(S_max - lse) carries that error in S_max, lse's (l summed in FP32 over <= T terms:
// T 2^-24 relative, plus the FP32 log and add: 2^-23 (1 + |lse|)), and exp_fp32's own 2^-22:
// |p - p_ref| <= p_ref (2^-23 (|S_max| + |lse| + 1) + T 2^-24 + 2^-22), to first order (x 1.01).
TEST(AttentionRowStats, MaxLogitAndTopMassMatchFp64) {
  const int B = 1, T = 40, H = 2, D = 16;
  const auto c = make_capture(Numerics::fused, ShiftPolicy::standard, attention::DeltaSource::rounded, B, T, H, D, 8, 5, false);
  const auto rows = sampled_rows(T, 9);
  const auto stats = attention_row_stats(c, rows);
  const double scale = 1.0 / std::sqrt(double(D));
  for (int h = 0; h < H; ++h) {
    double max_logit = -1e300, mass = 0, bound = 0;
    for (int i : rows) {
      std::vector<double> s(std::size_t(i) + 1);
      for (int j = 0; j <= i; ++j) {
        double dot = 0;
        for (int d = 0; d < D; ++d)
          dot += double(c.q[(std::size_t(i) * H + h) * D + d].to_float()) * double(c.k[(std::size_t(j) * H + h) * D + d].to_float());
        s[std::size_t(j)] = dot * scale;
      }
      double m = -1e300, sum = 0;
      for (double x : s) m = std::max(m, x);
      for (double x : s) sum += std::exp(x - m);
      const double p = 1.0 / sum, lse = m + std::log(sum);
      max_logit = std::max(max_logit, m);
      mass += p;
      bound += 1.01 * p * (0x1p-23 * (std::abs(m) + std::abs(lse) + 1) + T * 0x1p-24 + 0x1p-22);
    }
    EXPECT_NEAR(stats[std::size_t(h)].max_logit, max_logit, 0x1p-23 * std::abs(max_logit) * 1.01) << "head " << h;
    EXPECT_NEAR(stats[std::size_t(h)].top_mass, mass / double(rows.size()), bound / double(rows.size())) << "head " << h;
  }
}

TEST(AttentionRowStats, SampledRowsAreSpreadAndEndWithTheLast) {
  EXPECT_EQ(sampled_rows(8, 4), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(sampled_rows(3, 5), (std::vector<int>{0, 1, 2}));
}

// delta_used - delta_fp32 with delta_fp32 = sum dO (O + r): for a rounded delta, minus the FP64
// sum of dO * r, up to the rounding of delta_used itself (fused: an FP32 row sum of D products,
// at most D 2^-24 sum |dO O| per row); for a compensated delta, within the same bound of 0.
TEST(DeltaShadow, IsTheRoundingResidualSeenThroughDo) {
  for (auto source : {attention::DeltaSource::rounded, attention::DeltaSource::compensated}) {
    const int B = 2, T = 33, H = 2, D = 16;
    const auto c = make_capture(Numerics::fused, ShiftPolicy::standard, source, B, T, H, D, 8, 21, false);
    const auto shadow = delta_shadow(c);
    ASSERT_EQ(shadow.rows, std::int64_t(B) * T * H);
    for (int h = 0; h < H; ++h) {
      double want = 0, bound = 0;
      for (int b = 0; b < B; ++b)
        for (int i = 0; i < T; ++i) {
          const std::size_t at = ((std::size_t(b) * T + i) * H + h) * D;
          double dr = 0, abs_do = 0;
          for (int d = 0; d < D; ++d) {
            dr += double(c.d_o[at + d].to_float()) * double(c.o_residual[at + d].to_float());
            abs_do += std::abs(double(c.d_o[at + d].to_float()) * (double(c.o[at + d].to_float()) + double(c.o_residual[at + d].to_float())));
          }
          if (source == attention::DeltaSource::rounded) want -= dr;
          bound += D * 0x1p-24 * abs_do;
        }
      EXPECT_NEAR(shadow.heads[std::size_t(h)], want, bound) << to_string(source) << " head " << h;
      if (source == attention::DeltaSource::rounded) {
        EXPECT_GT(std::abs(want), bound) << "the residual should be visible";
      }
    }
  }
}

// Explicit R_i = X_i (PK)_i^T and their Frobenius cosines, in FP64 with Eigen. Both sides sum a
// few thousand FP64 terms: they agree to ~1e-13; 1e-10 leaves room and still catches any error
// of the formula (a wrong factor or index moves the mean by far more).
TEST(Rank1Similarity, EqualsExplicitRankOneMatrices) {
  const int B = 2, T = 24, H = 2, D = 8, C = 12;
  const auto c = make_capture(Numerics::fused, ShiftPolicy::standard, attention::DeltaSource::rounded, B, T, H, D, C, 8, false);
  const auto rows = sampled_rows(T, 6);
  const auto got = rank1_similarity(c, rows);
  const float scale = 1.0f / std::sqrt(float(D));
  for (int h = 0; h < H; ++h) {
    std::vector<Eigen::MatrixXd> r;
    for (int b = 0; b < B; ++b)
      for (int i : rows) {
        Eigen::VectorXd x(C), pk = Eigen::VectorXd::Zero(D);
        for (int d = 0; d < C; ++d) x(d) = c.x[(std::size_t(b) * T + i) * C + d];
        const double lse = c.lse[(std::size_t(b) * H + h) * T + i];
        for (int j = 0; j <= i; ++j) {
          double dot = 0;
          for (int d = 0; d < D; ++d)
            dot += double(c.q[((std::size_t(b) * T + i) * H + h) * D + d].to_float()) * double(c.k[((std::size_t(b) * T + j) * H + h) * D + d].to_float());
          const double p = std::exp(double(float(float(dot) * scale)) - lse);  // fused S: FP32 dot, FP32 scale
          for (int d = 0; d < D; ++d) pk(d) += p * double(c.k[((std::size_t(b) * T + j) * H + h) * D + d].to_float());
        }
        r.push_back(x * pk.transpose());
      }
    double sum = 0;
    int pairs = 0;
    for (std::size_t a = 0; a < r.size(); ++a)
      for (std::size_t z = a + 1; z < r.size(); ++z, ++pairs) sum += (r[a].array() * r[z].array()).sum() / (r[a].norm() * r[z].norm());
    EXPECT_NEAR(got[std::size_t(h)], sum / pairs, 1e-10) << "head " << h;
  }
}

// The similarity is a property of the scores, not of the kernel's lse: an lse hundreds of nats off
// (the published rule's collapsed rows at large logits) changes nothing. Before the probe used
// exp(S - max S) it turned such heads into subnormal P K sums and returned null or values above 1.
TEST(Rank1Similarity, DoesNotDependOnTheKernelsLse) {
  const int B = 2, T = 24, H = 2, D = 8, C = 12;
  auto c = make_capture(Numerics::fused, ShiftPolicy::standard, attention::DeltaSource::rounded, B, T, H, D, C, 8, false);
  const auto rows = sampled_rows(T, 6);
  const auto before = rank1_similarity(c, rows);
  for (float& l : c.lse) l += 700.0f;
  const auto after = rank1_similarity(c, rows);
  for (int h = 0; h < H; ++h) {
    ASSERT_TRUE(std::isfinite(after[std::size_t(h)])) << "head " << h;
    EXPECT_EQ(after[std::size_t(h)], before[std::size_t(h)]) << "head " << h;
    EXPECT_LE(std::abs(after[std::size_t(h)]), 1.0) << "head " << h;
  }
}

TEST(Rank1Similarity, IsOneForOneSharedDirection) {
  // Every X row equal, and every key equal: PK_i = k for every row, so all R_i are the same matrix.
  auto c = make_capture(Numerics::fused, ShiftPolicy::standard, attention::DeltaSource::rounded, 1, 16, 1, 8, 4, 3, false);
  for (std::size_t j = 8; j < c.k.size(); ++j) c.k[j] = c.k[j % 8];
  for (std::size_t j = 4; j < c.x.size(); ++j) c.x[j] = c.x[j % 4];
  EXPECT_NEAR(rank1_similarity(c, sampled_rows(16, 8))[0], 1.0, 1e-12);
}

}  // namespace
}  // namespace stableflash::diag
