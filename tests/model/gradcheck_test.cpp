// Finite-difference gradient checks of every layer and of the whole model, run in FP64 builds of
// the same templated code the FP32 trainer uses.
//
// Tolerance: for the objective f(x) = sum_i w_i out_i(x) with O(1) inputs and weights, a central
// difference with step h = 1e-5 errs by at most h^2/6 * |f'''| (< 2e-9 for |f'''| <= 100, true of
// these smooth, O(1)-scaled functions) plus 2 * eps_f / h, where eps_f <= n * 2^-53 * sum|terms|
// < 1e-13 for these sizes (so < 2e-8 after dividing by h). We accept |fd - analytic| <=
// 1e-6 * (1 + |analytic|), a 50x margin over that bound; a missing or wrong derivative term errs
// by O(|analytic|), orders of magnitude above it.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "stableflash/attention/standard_fp32.hpp"
#include "stableflash/model/gpt2.hpp"
#include "stableflash/model/layers.hpp"
#include "stableflash/numerics/random.hpp"

namespace stableflash::model {
namespace {

using Vec = std::vector<double>;
constexpr double kStep = 1e-5, kTol = 1e-6;

Vec random_vec(std::size_t n, std::uint64_t seed, double lo = -1, double hi = 1) {
  SplitMix64 rng(seed);
  Vec v(n);
  for (auto& x : v) x = rng.uniform(lo, hi);
  return v;
}

double weighted_sum(const Vec& out, const Vec& w) {
  double s = 0;
  for (std::size_t i = 0; i < out.size(); ++i) s += out[i] * w[i];
  return s;
}

// Checks every element of `x` (a reference into the layer's inputs): `forward` recomputes the
// outputs from the current inputs, `analytic` is the gradient of sum(w * out) w.r.t. x.
void check(const char* what, Vec& x, const std::function<Vec()>& forward, const Vec& w, const Vec& analytic) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + kStep;
    const double up = weighted_sum(forward(), w);
    x[i] = saved - kStep;
    const double down = weighted_sum(forward(), w);
    x[i] = saved;
    const double fd = (up - down) / (2 * kStep);
    ASSERT_NEAR(fd, analytic[i], kTol * (1 + std::fabs(analytic[i]))) << what << " element " << i;
  }
}

TEST(GradCheck, LayerNorm) {
  const int N = 5, C = 7;
  Vec x = random_vec(N * C, 1), weight = random_vec(C, 2, 0.5, 1.5), bias = random_vec(C, 3);
  Vec out(N * C), mean(N), rstd(N);
  auto fwd = [&] {
    layers::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), weight.data(), bias.data(), N, C, 1e-5);
    return out;
  };
  const Vec w = random_vec(N * C, 4);
  fwd();
  Vec dx(N * C), dw(C), db(C);
  layers::layernorm_backward(dx.data(), dw.data(), db.data(), w.data(), x.data(), weight.data(), mean.data(), rstd.data(), N, C);
  check("dx", x, fwd, w, dx);
  check("dweight", weight, fwd, w, dw);
  check("dbias", bias, fwd, w, db);
}

TEST(GradCheck, LinearWithAndWithoutBias) {
  const int N = 6, C = 5, OC = 9;
  Vec x = random_vec(N * C, 1), wt = random_vec(C * OC, 2), b = random_vec(OC, 3);
  for (bool with_bias : {true, false}) {
    Vec out(N * OC);
    auto fwd = [&] {
      layers::linear_forward(out.data(), x.data(), wt.data(), with_bias ? b.data() : nullptr, N, C, OC);
      return out;
    };
    const Vec w = random_vec(N * OC, 4);
    Vec dx(N * C), dw(C * OC), db(OC);
    layers::linear_backward(dx.data(), dw.data(), with_bias ? db.data() : nullptr, w.data(), x.data(), wt.data(), N, C, OC);
    check("dx", x, fwd, w, dx);
    check("dw", wt, fwd, w, dw);
    if (with_bias) check("dbias", b, fwd, w, db);
  }
}

TEST(GradCheck, Gelu) {
  Vec x = random_vec(64, 1, -4, 4), out(64);
  auto fwd = [&] {
    layers::gelu_forward(out.data(), x.data(), 64);
    return out;
  };
  const Vec w = random_vec(64, 2);
  Vec dx(64);
  layers::gelu_backward(dx.data(), x.data(), w.data(), 64);
  check("dx", x, fwd, w, dx);
}

TEST(GradCheck, Embedding) {
  const int B = 2, T = 3, C = 4, V = 5;
  Vec wte = random_vec(V * C, 1), wpe = random_vec(T * C, 2), out(B * T * C);
  const std::vector<int> tokens{0, 3, 3, 4, 1, 3};  // a repeated token accumulates
  auto fwd = [&] {
    layers::embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
    return out;
  };
  const Vec w = random_vec(B * T * C, 3);
  Vec dwte(V * C), dwpe(T * C);
  layers::embedding_backward(dwte.data(), dwpe.data(), w.data(), tokens.data(), B, T, C);
  check("dwte", wte, fwd, w, dwte);
  check("dwpe", wpe, fwd, w, dwpe);
}

TEST(GradCheck, SoftmaxCrossEntropy) {
  const int N = 4, V = 11;
  Vec logits = random_vec(N * V, 1, -3, 3);
  const std::vector<int> targets{0, 10, 5, 5};
  Vec losses(N);
  // The objective is the mean loss itself (w = 1 on a single output).
  auto fwd = [&] {
    Vec work = logits;
    return Vec{layers::softmax_cross_entropy_forward(work.data(), losses.data(), targets.data(), N, V)};
  };
  Vec probs = logits;
  layers::softmax_cross_entropy_forward(probs.data(), losses.data(), targets.data(), N, V);
  layers::softmax_cross_entropy_backward(probs.data(), targets.data(), N, V, 1.0);
  check("dlogits", logits, fwd, Vec{1.0}, probs);
}

TEST(GradCheck, StandardAttentionCausalAndNot) {
  const int B = 2, H = 2, T = 5, D = 3, C = H * D;
  for (bool causal : {true, false}) {
    Vec qkv = random_vec(B * T * 3 * C, 1, -1.5, 1.5), out(B * T * C), probs(B * H * T * T);
    attention::StandardAttentionArgs<double> args{B, H, T, D, 3 * C, causal, nullptr, nullptr, nullptr, out.data(), probs.data()};
    auto fwd = [&] {
      args.q = qkv.data(), args.k = qkv.data() + C, args.v = qkv.data() + 2 * C;
      attention::standard_attention_forward(args);
      return out;
    };
    const Vec w = random_vec(B * T * C, 2);
    fwd();
    Vec dqkv(qkv.size());
    attention::standard_attention_backward(args, w.data(), dqkv.data(), dqkv.data() + C, dqkv.data() + 2 * C);
    check(causal ? "dqkv causal" : "dqkv", qkv, fwd, w, dqkv);
  }
}

// The whole model in FP64: every parameter tensor is checked at a few entries.
TEST(GradCheck, WholeModelFp64) {
  for (bool bias : {false, true}) {
    Gpt2Config c;
    c.n_layer = 2, c.n_head = 2, c.n_embd = 8, c.block_size = 6, c.vocab_size = 13, c.padded_vocab_size = 16, c.bias = bias;
    c.init_std = 0.3;  // large enough that every path carries signal
    Gpt2<double> model(c, std::vector<LayerAttention>(2, LayerAttention{AttentionKind::standard, {}}));
    model.init_weights(7);
    // Biases and LayerNorm weights away from 0/1 so their gradients are generic.
    SplitMix64 rng(3);
    for (const auto& t : model.tensors())
      if (t.role == ParamRole::vector)
        for (std::int64_t i = 0; i < t.size; ++i) model.params()[t.offset + i] += rng.uniform(-0.3, 0.3);
    const int B = 2, T = 5;
    std::vector<int> tokens(B * T), targets(B * T);
    for (int i = 0; i < B * T; ++i) tokens[i] = int(rng.next() % 13), targets[i] = int(rng.next() % 13);
    model.zero_grad();
    model.forward(tokens, targets, B, T);
    model.backward(1.0);
    const Vec grads(model.grads().begin(), model.grads().end());
    auto params = model.params();
    for (const auto& t : model.tensors())
      for (std::int64_t i : {std::int64_t(0), t.size / 2, t.size - 1}) {
        double& p = params[t.offset + i];
        const double saved = p;
        p = saved + kStep;
        const double up = model.forward(tokens, targets, B, T);
        p = saved - kStep;
        const double down = model.forward(tokens, targets, B, T);
        p = saved;
        const double fd = (up - down) / (2 * kStep), g = grads[t.offset + i];
        ASSERT_NEAR(fd, g, kTol * (1 + std::fabs(g))) << t.name << "[" << i << "] bias=" << bias;
      }
  }
}

}  // namespace
}  // namespace stableflash::model
