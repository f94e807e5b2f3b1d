// delta = rowsum(dO * O) from the three sources of docs/numerics-contract.md: they agree in exact arithmetic,
// and `compensated` recovers the delta of the unrounded FP32 output; `auto` is one of two of them
// per call.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "attention_test_util.hpp"

namespace stableflash::attention {
namespace {

TEST(DeltaSources, AgreeInExactArithmetic) {
  // FP64: rowsum(dO * O) (rounded/compensated read O) equals rowsum(dP * P) (exact) up to FP64 rounding.
  const testing::Problem p({1, 2, 33, 33, 64}, 17);
  AttentionOptions opt;
  opt.causal = true;
  const ReferenceBackward g = reference_backward(p.backward_args(), opt);
  const ReferenceForward f = reference_forward(p.forward_args(), opt);
  const float scale = opt.resolved_scale(64);
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 33; ++i) {
      const std::size_t row = std::size_t(h) * 33 + i;
      double dp_p = 0, scale_abs = 0;
      for (int j = 0; j <= i; ++j) {
        double s = 0, dp = 0;
        for (int d = 0; d < 64; ++d) {
          s += double(p.q[row * 64 + d].to_float()) * p.k[(std::size_t(h) * 33 + j) * 64 + d].to_float();
          dp += double(p.d_o[row * 64 + d].to_float()) * p.v[(std::size_t(h) * 33 + j) * 64 + d].to_float();
        }
        const double prob = std::exp(s * scale - f.lse[row]);
        dp_p += dp * prob, scale_abs += std::fabs(dp * prob);
      }
      // both sums are over O(T*D) FP64 products: 1e-12 of their magnitude is ~1e3 x the rounding
      ASSERT_NEAR(g.delta[row], dp_p, 1e-12 * std::max(1.0, scale_abs)) << row;
    }
}

// The unrounded `fused` output O_fp32 = acc / l for one key tile holding the whole row, computed
// independently of the library from docs/numerics-contract.md's fused definition.
std::vector<float> fused_unrounded_output(const testing::Problem& p, float scale) {
  const AttentionShape& s = p.shape;
  const int D = s.head_dim, T = s.k_len;
  std::vector<float> out(p.q.size());
  for (int h = 0; h < s.heads; ++h)
    for (int i = 0; i < s.q_len; ++i) {
      const std::size_t row = std::size_t(h) * s.q_len + i;
      std::vector<float> sc(T);
      for (int j = 0; j < T; ++j) {
        double dot = 0;
        for (int d = 0; d < D; ++d) dot += double(p.q[row * D + d].to_float()) * p.k[(std::size_t(h) * T + j) * D + d].to_float();
        sc[j] = float(dot) * scale;
      }
      const float m = *std::max_element(sc.begin(), sc.end());
      double l = 0;
      std::vector<double> acc(D, 0.0);
      for (int j = 0; j < T; ++j) {
        const float pbar = std::exp(sc[j] - m);
        l += pbar;
        for (int d = 0; d < D; ++d) acc[d] += double(round_bf16(pbar)) * p.v[(std::size_t(h) * T + j) * D + d].to_float();
      }
      for (int d = 0; d < D; ++d) out[row * D + d] = float(acc[d]) / float(l);
    }
  return out;
}

TEST(DeltaSources, CompensatedRecoversTheFp32OutputDelta) {
  const testing::Problem p({1, 2, 64, 64, 64}, 23, 3.0);
  const std::vector<float> o32 = fused_unrounded_output(p, AttentionOptions{}.resolved_scale(64));
  for (int bits : {7, 3, 2}) {
    AttentionOptions opt;
    opt.tile_k = 64, opt.round_bits = bits;
    for (DeltaSource src : {DeltaSource::rounded, DeltaSource::compensated}) {
      opt.delta_source = src;
      const testing::FlashRun r = testing::run_flash(p, opt, true);
      double worst = 0;
      for (std::size_t row = 0; row < r.delta.size(); ++row) {
        double want = 0, mag = 0;
        for (int d = 0; d < 64; ++d) {
          want += double(p.d_o[row * 64 + d].to_float()) * o32[row * 64 + d];
          mag += std::fabs(double(p.d_o[row * 64 + d].to_float()) * o32[row * 64 + d]);
        }
        worst = std::max(worst, std::fabs(r.delta[row] - want) / mag);
      }
      // O = RNE_bits(O32) is off by <= 2^-(bits+1) |O|; the BF16 residual r = BF16(O32 - O) keeps that
      // error to 2^-8 of itself, so |O + r - O32| <= 2^-(bits+1) * 2^-8 |O| (2^-16 at 7 bits), plus
      // FP32 rounding of the products and the sum (~2^-23).
      const double compensated_bound = std::ldexp(1.0, -(bits + 1) - 8) + std::ldexp(1.0, -22);
      if (src == DeltaSource::compensated) {
        EXPECT_LE(worst, compensated_bound) << "round_bits " << bits;
      } else {
        // the rounded O is visibly worse: the point of the compensated source
        EXPECT_GT(worst, 4 * compensated_bound) << "round_bits " << bits;
      }
    }
  }
}

TEST(DeltaSources, CompensatedNeedsTheResidual) {
  const testing::Problem p({1, 1, 8, 8, 64}, 2);
  AttentionOptions opt;
  opt.delta_source = DeltaSource::compensated;
  std::vector<bf16> o(p.q.size());
  std::vector<float> lse(8);
  ForwardArgs fa = p.forward_args();
  fa.o = o.data(), fa.lse = lse.data();
  EXPECT_THROW(attention_forward(fa, opt), std::invalid_argument);
}

// `auto` (the recommended source): the exact delta in fused numerics up to one backward key block,
// the compensated one above it and in paper numerics (where the exact one inherits lse's bias).
TEST(DeltaSources, AutoIsExactUpToOneKeyBlockInFusedNumericsElseCompensated) {
  struct Case {
    Numerics numerics;
    int k_len;
    DeltaSource want;
  };
  for (const Case& c : {Case{Numerics::fused, 1, DeltaSource::exact}, Case{Numerics::fused, 128, DeltaSource::exact},
                        Case{Numerics::fused, 129, DeltaSource::compensated}, Case{Numerics::paper, 64, DeltaSource::compensated},
                        Case{Numerics::paper, 4096, DeltaSource::compensated}}) {
    AttentionOptions opt;
    opt.numerics = c.numerics, opt.delta_source = DeltaSource::automatic;
    AttentionShape s{2, 4, 200, c.k_len, 64};
    SCOPED_TRACE(std::string(to_string(c.numerics)) + " Tk " + std::to_string(c.k_len));
    EXPECT_EQ(opt.resolved_delta_source(s), c.want);
    EXPECT_EQ(opt.for_shape(s).delta_source, c.want);
    EXPECT_EQ(opt.needs_residual(s), c.want == DeltaSource::compensated);
  }
  // the other sources are never changed, and only compensated needs a residual
  for (DeltaSource src : {DeltaSource::rounded, DeltaSource::compensated, DeltaSource::exact}) {
    AttentionOptions opt;
    opt.delta_source = src;
    for (int k_len : {1, 128, 129, 100000}) {
      const AttentionShape s{1, 1, 8, k_len, 64};
      EXPECT_EQ(opt.resolved_delta_source(s), src);
      EXPECT_EQ(opt.needs_residual(s), src == DeltaSource::compensated);
    }
  }
  EXPECT_EQ(parse_delta_source("auto"), DeltaSource::automatic);
  EXPECT_EQ(to_string(DeltaSource::automatic), "auto");
}

using testing::same_bits;

// Each entry point resolves `auto` for its call: the same bits as naming the resolved source.
TEST(DeltaSources, AutoGivesTheBitsOfTheSourceItResolvesTo) {
  for (Numerics n : {Numerics::fused, Numerics::paper})
    for (int k_len : {97, 128, 129, 200}) {
      const testing::Problem p({1, 2, 150, k_len, 64}, 31 + k_len, 2.0);
      AttentionOptions automatic;
      automatic.numerics = n, automatic.causal = true, automatic.tile_k = 64, automatic.delta_source = DeltaSource::automatic;
      AttentionOptions named = automatic;
      named.delta_source = automatic.resolved_delta_source(p.shape);
      SCOPED_TRACE(std::string(to_string(n)) + " Tk " + std::to_string(k_len) + " -> " + std::string(to_string(named.delta_source)));
      const testing::FlashRun a = testing::run_flash(p, automatic), b = testing::run_flash(p, named);
      EXPECT_TRUE(same_bits(a.o, b.o) && same_bits(a.lse, b.lse)) << "forward";
      EXPECT_TRUE(same_bits(a.delta, b.delta)) << "delta";
      EXPECT_TRUE(same_bits(a.dq, b.dq) && same_bits(a.dk, b.dk) && same_bits(a.dv, b.dv)) << "gradients";
      std::vector<float> alone(a.delta.size());
      BackwardArgs ba = p.backward_args();
      ba.o = a.o.data(), ba.lse = a.lse.data(), ba.o_residual = a.residual.data();
      attention_delta(ba, automatic, alone.data());
      EXPECT_TRUE(same_bits(alone, b.delta)) << "attention_delta";
    }
}

// Where `auto` is the exact delta no residual is needed; above one key block the error names the rule.
TEST(DeltaSources, AutoNeedsTheResidualOnlyAboveOneKeyBlock) {
  AttentionOptions opt;
  opt.delta_source = DeltaSource::automatic;
  for (int k_len : {128, 129}) {
    const testing::Problem p({1, 1, 8, k_len, 64}, 5);
    std::vector<bf16> o(p.q.size()), dq(p.q.size()), dk(p.k.size()), dv(p.k.size());
    std::vector<float> lse(8);
    ForwardArgs fa = p.forward_args();
    fa.o = o.data(), fa.lse = lse.data();  // no o_residual
    if (k_len <= kAutoExactMaxKeys) {
      EXPECT_NO_THROW(attention_forward(fa, opt));
      BackwardArgs ba = p.backward_args();
      ba.o = o.data(), ba.lse = lse.data(), ba.dq = dq.data(), ba.dk = dk.data(), ba.dv = dv.data();
      EXPECT_NO_THROW(attention_backward(ba, opt));
    } else {
      try {
        attention_forward(fa, opt);
        ADD_FAILURE() << "auto above one key block ran without o_residual";
      } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("'auto' above 128 keys in fused numerics"), std::string::npos) << e.what();
      }
    }
  }
}

}  // namespace
}  // namespace stableflash::attention
