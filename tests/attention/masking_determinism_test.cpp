// Conventions every mode keeps: fully masked rows, layouts, bitwise determinism.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>

#include "attention_test_util.hpp"

namespace stableflash::attention {
namespace {

TEST(Masking, FullyMaskedRowsGiveZeroOutputInfiniteLseZeroGradientsInEveryMode) {
  // Tq > Tk causal (bottom-right aligned): rows 0..Tq-Tk-1 see no key.
  const testing::Problem p({1, 2, 40, 24, 64}, 4);
  for (Numerics n : {Numerics::paper, Numerics::fused}) {
    for (DeltaSource src : {DeltaSource::rounded, DeltaSource::compensated, DeltaSource::exact}) {
      AttentionOptions opt;
      opt.numerics = n, opt.causal = true, opt.tile_k = 16, opt.delta_source = src;
      opt.policy = ShiftPolicy::hashed_offset;
      const testing::FlashRun r = testing::run_flash(p, opt, true);
      EXPECT_EQ(r.ties.masked_rows, 2 * 16);
      for (int h = 0; h < 2; ++h)
        for (int i = 0; i < 16; ++i) {
          const std::size_t row = std::size_t(h) * 40 + i;
          ASSERT_TRUE(std::isinf(r.lse[row]) && r.lse[row] > 0);
          ASSERT_EQ(r.delta[row], 0.0f);
          for (int d = 0; d < 64; ++d) {
            ASSERT_EQ(r.o[row * 64 + d].bits, 0);
            ASSERT_EQ(r.dq[row * 64 + d].bits, 0);
          }
        }
      for (auto* g : {&r.dq, &r.dk, &r.dv})
        for (bf16 x : *g) ASSERT_TRUE(x.is_finite());
    }
  }
}

TEST(Layouts, BthdGivesTheSameBitsAsBhtd) {
  const AttentionShape s{2, 3, 33, 33, 64};
  const testing::Problem hm(s, 9);
  testing::Problem tm = hm;
  tm.layout = Layout::bthd;
  auto to_bthd = [&](const std::vector<bf16>& x) {
    std::vector<bf16> y(x.size());
    for (int b = 0; b < s.batch; ++b)
      for (int h = 0; h < s.heads; ++h)
        for (int t = 0; t < s.q_len; ++t)
          for (int d = 0; d < s.head_dim; ++d)
            y[((std::size_t(b) * s.q_len + t) * s.heads + h) * s.head_dim + d] = x[((std::size_t(b) * s.heads + h) * s.q_len + t) * s.head_dim + d];
    return y;
  };
  tm.q = to_bthd(hm.q), tm.k = to_bthd(hm.k), tm.v = to_bthd(hm.v), tm.d_o = to_bthd(hm.d_o);
  for (Numerics n : {Numerics::paper, Numerics::fused}) {
    AttentionOptions opt;
    opt.numerics = n, opt.causal = true, opt.tile_k = 16, opt.policy = ShiftPolicy::paper;
    const testing::FlashRun a = testing::run_flash(hm, opt), b = testing::run_flash(tm, opt);
    EXPECT_TRUE(testing::bitwise_equal(to_bthd(a.o), b.o));
    EXPECT_TRUE(testing::bitwise_equal(to_bthd(a.dq), b.dq));
    EXPECT_TRUE(testing::bitwise_equal(to_bthd(a.dk), b.dk));
    EXPECT_TRUE(testing::bitwise_equal(to_bthd(a.dv), b.dv));
    EXPECT_EQ(a.lse, b.lse);
  }
}

TEST(Determinism, RepeatsAndThreadCountsGiveIdenticalBits) {
  const testing::Problem p({1, 2, 97, 97, 64}, 12, 3.0);
  for (Numerics n : {Numerics::paper, Numerics::fused}) {
    AttentionOptions opt;
    opt.numerics = n, opt.causal = true, opt.tile_q = 8, opt.tile_k = 32, opt.policy = ShiftPolicy::hashed_offset;
    const testing::FlashRun first = testing::run_flash(p, opt);
    const int saved = omp_get_max_threads();
    for (int rep = 0; rep < 6; ++rep) {
      omp_set_num_threads(1 + rep % 3);
      const testing::FlashRun again = testing::run_flash(p, opt);
      ASSERT_TRUE(testing::bitwise_equal(first.o, again.o));
      ASSERT_TRUE(testing::bitwise_equal(first.dq, again.dq));
      ASSERT_TRUE(testing::bitwise_equal(first.dk, again.dk));
      ASSERT_TRUE(testing::bitwise_equal(first.dv, again.dv));
      ASSERT_EQ(first.lse, again.lse);
    }
    omp_set_num_threads(saved);
  }
}

TEST(Options, BadValuesAreRefusedNamingTheField) {
  const testing::Problem p({1, 1, 4, 4, 64}, 1);
  auto expect_named = [&](AttentionOptions opt, const std::string& field) {
    try {
      testing::run_flash(p, opt, false);
      ADD_FAILURE() << "accepted a bad " << field;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  AttentionOptions o;
  o.round_bits = 0;
  expect_named(o, "round_bits");
  o = {}, o.policy = ShiftPolicy::paper, o.policy_params.beta = 0.5f;
  expect_named(o, "beta");
  o = {}, o.numerics = Numerics::paper, o.normalizer = Normalizer::bf16;
  expect_named(o, "normalizer");
  o = {}, o.scale = -1.0f;
  expect_named(o, "scale");
  o = {}, o.numerics = Numerics::reference;
  expect_named(o, "reference");
}

}  // namespace
}  // namespace stableflash::attention
