// The FP64 oracle's backward against central finite differences of its own forward, in FP64.
#include <gtest/gtest.h>

#include <cmath>

#include "attention_test_util.hpp"

namespace stableflash::attention {
namespace {

// L = sum(dO * O): its gradient w.r.t. q, k, v is exactly what the backward returns for dO.
double loss(const Fp64Inputs& in, const AttentionOptions& opt, const std::vector<double>& d_o) {
  const ReferenceForward f = reference_forward(in, opt);
  double l = 0.0;
  for (std::size_t i = 0; i < d_o.size(); ++i) l += d_o[i] * f.o[i];
  return l;
}

struct FdCase {
  int tq, tk;
  bool causal;
};

class ReferenceGradient : public ::testing::TestWithParam<FdCase> {};

TEST_P(ReferenceGradient, MatchesCentralFiniteDifferences) {
  const FdCase c = GetParam();
  const AttentionShape s{1, 2, c.tq, c.tk, 8};
  SplitMix64 rng(99);
  auto fill = [&](std::size_t n) {
    std::vector<double> x(n);
    for (auto& v : x) v = rng.normal();
    return x;
  };
  std::vector<double> q = fill(std::size_t(s.q_elements())), k = fill(std::size_t(s.k_elements())),
                      v = fill(std::size_t(s.k_elements())), d_o = fill(std::size_t(s.q_elements()));
  AttentionOptions opt;
  opt.causal = c.causal;
  const ReferenceBackward g = reference_backward(Fp64Inputs{s, q.data(), k.data(), v.data(), d_o.data()}, opt);
  // Central differences: truncation ~ h^2 |L'''| / 6 and cancellation ~ eps |L| / h. With O(1)
  // inputs and derivatives, h = 1e-5 gives ~1e-10 + 1e-11; the tolerance 1e-7 (relative to the
  // gradient's scale) leaves a factor ~1000 for derivative constants.
  const double h = 1e-5;
  for (auto [x, grad, name] : {std::tuple{&q, &g.dq, "dq"}, std::tuple{&k, &g.dk, "dk"}, std::tuple{&v, &g.dv, "dv"}}) {
    const double scale = std::max(1.0, testing::max_abs(*grad));
    for (std::size_t i = 0; i < x->size(); ++i) {
      const double saved = (*x)[i];
      (*x)[i] = saved + h;
      const double up = loss(Fp64Inputs{s, q.data(), k.data(), v.data(), nullptr}, opt, d_o);
      (*x)[i] = saved - h;
      const double down = loss(Fp64Inputs{s, q.data(), k.data(), v.data(), nullptr}, opt, d_o);
      (*x)[i] = saved;
      ASSERT_NEAR((up - down) / (2 * h), (*grad)[i], 1e-7 * scale) << name << "[" << i << "]";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, ReferenceGradient,
                         ::testing::Values(FdCase{5, 5, false}, FdCase{5, 5, true}, FdCase{3, 7, true}, FdCase{7, 3, true},
                                           FdCase{1, 4, false}));

TEST(ReferenceGradient, FullyMaskedRowsGiveZeroOutputInfiniteLseAndZeroGradients) {
  // Tq > Tk causal, bottom-right aligned: query i sees keys j <= i + Tk - Tq, so rows 0..Tq-Tk-1 see none.
  testing::Problem p({1, 1, 6, 2, 8}, 5);
  AttentionOptions opt;
  opt.causal = true;
  const ReferenceForward f = reference_forward(p.forward_args(), opt);
  const ReferenceBackward g = reference_backward(p.backward_args(), opt);
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(std::isinf(f.lse[i]) && f.lse[i] > 0) << i;
    for (int d = 0; d < 8; ++d) {
      EXPECT_EQ(f.o[i * 8 + d], 0.0);
      EXPECT_EQ(g.dq[i * 8 + d], 0.0);
    }
  }
  EXPECT_TRUE(std::isfinite(f.lse[4]) && std::isfinite(f.lse[5]));
}

}  // namespace
}  // namespace stableflash::attention
