// `fused` numerics against the FP64 oracle, bounded by an honest naive BF16 implementation's
// error (docs/architecture.md): err <= 2 x err_naive + one BF16 ulp at max|ref| (3 x for gradients).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <tuple>

#include "attention_test_util.hpp"

namespace stableflash::attention {
namespace {

using testing::error_bound;
using testing::max_abs_error;

struct ShapeCase {
  int t, d;
  bool causal;
};

std::string name(const ::testing::TestParamInfo<ShapeCase>& i) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "T%d_D%d%s", i.param.t, i.param.d, i.param.causal ? "_causal" : "");
  return buf;
}

class FusedErrorBound : public ::testing::TestWithParam<ShapeCase> {};

TEST_P(FusedErrorBound, ForwardAndBackwardWithinTheNaiveBf16Bound) {
  const ShapeCase c = GetParam();
  const int heads = c.t >= 1000 ? 1 : 2;
  const testing::Problem p({1, heads, c.t, c.t, c.d}, 1000 + c.t + c.d);
  AttentionOptions opt;
  opt.causal = c.causal;
  const ReferenceForward ref = reference_forward(p.forward_args(), opt);
  const ReferenceBackward gref = reference_backward(p.backward_args(), opt);

  // the honest baseline
  std::vector<bf16> naive_o(p.q.size()), ndq(p.q.size()), ndk(p.k.size()), ndv(p.k.size());
  ForwardArgs na = p.forward_args();
  na.o = naive_o.data();
  naive_bf16_forward(na, opt);
  BackwardArgs nb = p.backward_args();
  nb.dq = ndq.data(), nb.dk = ndk.data(), nb.dv = ndv.data();
  naive_bf16_backward(nb, opt);
  const double o_bound = error_bound(max_abs_error(naive_o, ref.o), ref.o, 2.0);

  // several tilings, including one key tile for the whole row and a query tile of one row
  for (auto [br, bc] : {std::pair{128, 128}, std::pair{64, 32}, std::pair{1, c.t}}) {
    opt.tile_q = br, opt.tile_k = bc;
    const bool with_backward = br == 128;  // the backward does not depend on the tiling
    const testing::FlashRun r = testing::run_flash(p, opt, with_backward);
    EXPECT_LE(max_abs_error(r.o, ref.o), o_bound) << "tile " << br << "x" << bc;
    // lse = log(l) + m in FP32: l sums <= Tk exp values (each within 2^-23), m is an FP32 score
    // (within 2 roundings of 2^-24 |S|, |S| <= |lse| + log Tk), plus the final add: 2^-20 covers
    // these few roundings with a factor of ~4 to spare.
    for (std::size_t row = 0; row < r.lse.size(); ++row)
      ASSERT_NEAR(r.lse[row], ref.lse[row], std::ldexp(1.0, -20) * (1 + 2 * std::fabs(ref.lse[row]) + std::log(c.t)));
    if (!with_backward) continue;
    EXPECT_LE(max_abs_error(r.dq, gref.dq), error_bound(max_abs_error(ndq, gref.dq), gref.dq, 3.0)) << "dq";
    EXPECT_LE(max_abs_error(r.dk, gref.dk), error_bound(max_abs_error(ndk, gref.dk), gref.dk, 3.0)) << "dk";
    EXPECT_LE(max_abs_error(r.dv, gref.dv), error_bound(max_abs_error(ndv, gref.dv), gref.dv, 3.0)) << "dv";
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, FusedErrorBound,
                         ::testing::ValuesIn([] {
                           std::vector<ShapeCase> v;
                           for (int len : {1, 2, 17, 97, 128, 1000, 1025})
                             for (int dim : {64, 128})
                               for (bool causal : {false, true}) v.push_back({len, dim, causal});
                           return v;
                         }()),
                         name);

TEST(FusedErrorBound, HoldsForEveryPolicyAndForLargeLogits) {
  // q scaled x5 makes the softmax peaked; every policy must keep the fused error bound.
  const testing::Problem p({1, 2, 97, 97, 64}, 77, /*q_sigma=*/5.0);
  AttentionOptions opt;
  const ReferenceForward ref = reference_forward(p.forward_args(), opt);
  std::vector<bf16> naive_o(p.q.size());
  ForwardArgs na = p.forward_args();
  na.o = naive_o.data();
  naive_bf16_forward(na, opt);
  const double bound = error_bound(max_abs_error(naive_o, ref.o), ref.o, 2.0);
  for (ShiftPolicy pol : {ShiftPolicy::standard, ShiftPolicy::paper, ShiftPolicy::hashed_offset, ShiftPolicy::fixed_offset}) {
    opt.policy = pol;
    opt.tile_k = 32;
    EXPECT_LE(max_abs_error(testing::run_flash(p, opt, false).o, ref.o), bound) << to_string(pol);
  }
}

TEST(FusedErrorBound, QueryAndKeyLengthsMayDiffer) {
  for (auto [tq, tk] : {std::pair{17, 97}, std::pair{97, 17}, std::pair{1, 128}}) {
    for (bool causal : {false, true}) {
      const testing::Problem p({2, 1, tq, tk, 64}, 31 + tq);
      AttentionOptions opt;
      opt.causal = causal, opt.tile_q = 16, opt.tile_k = 16;
      const ReferenceForward ref = reference_forward(p.forward_args(), opt);
      std::vector<bf16> naive_o(p.q.size());
      ForwardArgs na = p.forward_args();
      na.o = naive_o.data();
      naive_bf16_forward(na, opt);
      EXPECT_LE(max_abs_error(testing::run_flash(p, opt, false).o, ref.o), error_bound(max_abs_error(naive_o, ref.o), ref.o, 2.0))
          << tq << "x" << tk << (causal ? " causal" : "");
    }
  }
}

}  // namespace
}  // namespace stableflash::attention
