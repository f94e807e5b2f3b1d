// The model's flash layers (BF16 q, k, v in; BF16 O out; BF16 dO in; BF16 dq, dk, dv out) against
// the same model with standard FP32 attention, for the numerics a run can select per layer.
//
// Tolerance: each flash layer adds relative perturbations at its BF16 rounding points: q, k, v
// (2^-9 each, RNE), the output O and the incoming dO (2^-(round_bits+2), the half-ulp of the
// output significand; at round_bits = 7 that is 2^-9), and dq, dk, dv (2^-9). In a LayerNorm'd
// network at initialisation (error amplification of order one per layer, as in golden_test.cpp)
// these add up along the backward chain of L layers to at most
//   rho = L * (3 * 2^-9 + 2 * 2^-(round_bits+2)) + 2^-9
// of the largest gradient of a tensor, and of the largest logit; FP32's own error (~1e-5, golden_test.cpp)
// is far below. A wiring error (a swapped q/k/v slot, a wrong layout, a dropped dO) changes
// gradients by O(1) of their size.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "stableflash/model/gpt2.hpp"
#include "stableflash/numerics/random.hpp"

namespace stableflash::model {
namespace {

using attention::DeltaSource;
using attention::Numerics;
using attention::ShiftPolicy;

struct Setting {
  Numerics numerics;
  ShiftPolicy policy;
  DeltaSource delta;
  int round_bits;
};

TEST(FlashLayers, MatchStandardAttentionWithinTheBf16RoundingBound) {
  Gpt2Config c;
  c.n_layer = 2, c.n_head = 2, c.n_embd = 64, c.block_size = 32, c.vocab_size = 100, c.padded_vocab_size = 128;
  const int B = 2, T = 32;
  SplitMix64 rng(5);
  std::vector<int> tokens(B * T), targets(B * T);
  for (int i = 0; i < B * T; ++i) tokens[i] = int(rng.next() % 100), targets[i] = int(rng.next() % 100);

  double max_logit = 0;
  auto run = [&](std::vector<LayerAttention> att, std::vector<float>& grads) {
    Gpt2<float> m(c, std::move(att));
    m.init_weights(11);
    m.forward(tokens, {}, B, T);
    for (float x : m.logits()) max_logit = std::max(max_logit, double(std::fabs(x)));
    m.zero_grad();
    const float loss = m.forward(tokens, targets, B, T);
    m.backward(1.0f);
    grads.assign(m.grads().begin(), m.grads().end());
    return std::pair{loss, m.tensors()};
  };
  std::vector<float> ref_grads;
  const auto [ref_loss, tensors] = run(std::vector<LayerAttention>(2, LayerAttention{AttentionKind::standard, {}}), ref_grads);

  const Setting settings[] = {{Numerics::fused, ShiftPolicy::standard, DeltaSource::automatic, 7},  // the default
                              {Numerics::fused, ShiftPolicy::standard, DeltaSource::compensated, 7},
                              {Numerics::fused, ShiftPolicy::hashed_offset, DeltaSource::compensated, 7},
                              {Numerics::fused, ShiftPolicy::standard, DeltaSource::exact, 7},
                              {Numerics::paper, ShiftPolicy::standard, DeltaSource::rounded, 7},
                              {Numerics::paper, ShiftPolicy::paper, DeltaSource::rounded, 3}};
  for (const Setting& s : settings) {
    LayerAttention la{AttentionKind::flash, {}};
    la.options.numerics = s.numerics, la.options.policy = s.policy, la.options.delta_source = s.delta, la.options.round_bits = s.round_bits;
    std::vector<float> grads;
    const float loss = run(std::vector<LayerAttention>(2, la), grads).first;
    const double rho = c.n_layer * (3 * 0x1p-9 + 2 * std::ldexp(1.0, -(s.round_bits + 2))) + 0x1p-9;
    const std::string name = std::string(attention::to_string(s.numerics)) + "/" + std::string(attention::to_string(s.policy)) + "/" +
                             std::string(attention::to_string(s.delta)) + "/bits " + std::to_string(s.round_bits);
    // The loss moves by at most ||p - onehot||_1 <= 2 times the largest logit change.
    const double tol_loss = 2 * rho * max_logit;
    EXPECT_LE(std::fabs(loss - ref_loss), tol_loss) << name;
    bool any_difference = false;
    double worst = 0;
    for (const auto& t : tensors) {
      double max_ref = 0, max_err = 0;
      for (std::int64_t i = t.offset; i < t.offset + t.size; ++i) {
        max_ref = std::max(max_ref, double(std::fabs(ref_grads[i])));
        max_err = std::max(max_err, double(std::fabs(grads[i] - ref_grads[i])));
      }
      EXPECT_LE(max_err, rho * max_ref) << name << " " << t.name;
      worst = std::max(worst, max_err / (rho * max_ref));
      any_difference |= max_err > 0;
    }
    EXPECT_TRUE(any_difference) << name << ": the flash path was not taken";
    std::printf("%s: loss err %.3g (tol %.3g), worst gradient err / tol %.3g\n", name.c_str(), std::fabs(loss - ref_loss), tol_loss, worst);
  }
}

}  // namespace
}  // namespace stableflash::model
