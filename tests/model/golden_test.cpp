// The whole FP32 model and its optimizers against PyTorch in float64
// (tests/golden/make_gpt2_golden.py wrote tests/golden/gpt2_tiny_golden.safetensors).
//
// Tolerances follow from FP32's unit roundoff u = 2^-24 and the longest chain of FP32 operations
// that feeds a result (Higham's gamma_n = n u bound for a chain of n roundings, normwise: the
// error of a tensor is compared with n u max|reference|, which also absorbs the ratio
// sum|terms| / |sum| of random-sign sums up to sqrt(n)):
// - forward chain per layer: LayerNorm sums (2C), the qkv dot (C), scores (D), softmax sum and
//   P V (2T), projection (C), LayerNorm (2C), fc (C), MLP projection (4C); then the final
//   LayerNorm (2C) and the head (C): n_fwd = L (11C + D + 2T) + 3C.
// - gradients run the chain back (another n_fwd) and sum weight gradients over the B T rows:
//   n_bwd = 2 n_fwd + B T.
// - the mean loss: each row's loss moves by at most ||p - onehot||_1 <= 2 times the largest logit
//   error, plus the log-sum-exp (Vp terms) and the mean (B T terms): 2 tol_logits + (Vp + BT) u loss.
// - after optimizer steps, a parameter error d_theta moves the loss by at most ||g||_1 max|d_theta|
//   (first order). AdamW's update m_hat / (sqrt(v_hat) + eps) is scale invariant and its
//   magnitude is bounded by (1 - b1) / sqrt(1 - b2) / sqrt(1 - b1^2 / b2) ~ 1.2 for b = (0.9, 0.95),
//   so a relative gradient error rho = n_bwd u changes each update by at most 2 * 1.2 * rho * lr
//   (numerator and denominator both perturbed); summed over the steps so far.
// This assumes error amplification of order one per layer, which holds for a LayerNorm'd network
// at initialisation (and is why the reference runs in float64: none of its own error enters).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>

#include "stableflash/data/safetensors.hpp"
#include "stableflash/model/gpt2.hpp"
#include "stableflash/optim/optimizer.hpp"

#ifndef STABLEFLASH_GOLDEN_FILE
#error "STABLEFLASH_GOLDEN_FILE must name tests/golden/gpt2_tiny_golden.safetensors"
#endif

namespace stableflash::model {
namespace {

using data::SafetensorsFile;
constexpr double kU = 0x1p-24;

class Golden : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { file_ = new SafetensorsFile(SafetensorsFile::read(STABLEFLASH_GOLDEN_FILE)); }
  static void TearDownTestSuite() { delete file_; }

  static std::vector<double> f64(const std::string& name) {
    const data::Tensor* t = file_->find(name);
    if (!t) throw std::runtime_error("golden file lacks " + name);
    auto v = t->as<double>();
    return {v.begin(), v.end()};
  }
  static int meta_int(const std::string& k) { return std::stoi(file_->metadata.at(k)); }
  static double meta(const std::string& k) { return std::stod(file_->metadata.at(k)); }

  Gpt2Config config() const {
    Gpt2Config c;
    c.n_layer = meta_int("n_layer"), c.n_head = meta_int("n_head"), c.n_embd = meta_int("n_embd");
    c.block_size = meta_int("block_size"), c.vocab_size = meta_int("vocab_size"), c.padded_vocab_size = meta_int("padded_vocab_size");
    c.bias = false;
    return c;
  }
  Gpt2<float> model() const {
    Gpt2<float> m(config(), std::vector<LayerAttention>(config().n_layer, LayerAttention{AttentionKind::standard, {}}));
    for (const auto& t : m.tensors()) {
      const auto v = f64("param." + t.name);
      EXPECT_EQ(std::int64_t(v.size()), t.size) << t.name;
      for (std::int64_t i = 0; i < t.size; ++i) m.params()[t.offset + i] = float(v[i]);
    }
    return m;
  }
  // Batch k's inputs and targets, [B, T] each.
  std::pair<std::vector<int>, std::vector<int>> batch(int k) const {
    const data::Tensor* t = file_->find("tokens");
    const auto tok = t->as<std::int32_t>();
    const int B = int(t->shape[1]), T1 = int(t->shape[2]);
    std::vector<int> in, tg;
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < T1 - 1; ++i) {
        in.push_back(tok[(k * B + b) * T1 + i]);
        tg.push_back(tok[(k * B + b) * T1 + i + 1]);
      }
    return {in, tg};
  }
  int B() const { return meta_int("batch"); }
  int T() const { return meta_int("seq_len"); }
  double n_fwd() const {
    const Gpt2Config c = config();
    return c.n_layer * (11.0 * c.n_embd + c.head_dim() + 2.0 * T()) + 3.0 * c.n_embd;
  }
  double n_bwd() const { return 2 * n_fwd() + B() * T(); }
  double tol_logits() const {
    double max = 0;
    for (double x : f64("logits")) max = std::max(max, std::fabs(x));
    return n_fwd() * kU * max;
  }
  double tol_loss(double loss) const { return 2 * tol_logits() + (config().padded_vocab_size + B() * T()) * kU * std::fabs(loss); }

  static double max_abs_err(std::span<const float> got, const std::vector<double>& want) {
    double e = 0;
    for (std::size_t i = 0; i < want.size(); ++i) e = std::max(e, std::fabs(double(got[i]) - want[i]));
    return e;
  }

  static SafetensorsFile* file_;
};
SafetensorsFile* Golden::file_ = nullptr;

TEST_F(Golden, LogitsLossAndEveryGradient) {
  auto m = model();
  const auto [in, tg] = batch(0);
  m.forward(in, {}, B(), T());
  const auto want_logits = f64("logits");
  const double logit_err = max_abs_err(m.logits(), want_logits);
  EXPECT_LE(logit_err, tol_logits());
  m.zero_grad();
  const double loss = m.forward(in, tg, B(), T());
  const double want_loss = f64("loss")[0];
  EXPECT_LE(std::fabs(loss - want_loss), tol_loss(want_loss));
  m.backward(1.0f);
  double worst_ratio = 0;
  for (const auto& t : m.tensors()) {
    const auto want = f64("grad." + t.name);
    double max = 0;
    for (double x : want) max = std::max(max, std::fabs(x));
    const double err = max_abs_err(m.grads().subspan(t.offset, t.size), want), tol = n_bwd() * kU * max;
    EXPECT_LE(err, tol) << t.name;
    worst_ratio = std::max(worst_ratio, err / tol);
  }
  std::printf("golden: logits max err %.3g (tol %.3g); loss err %.3g (tol %.3g); worst gradient err/tol %.3g\n", logit_err,
              tol_logits(), std::fabs(loss - want_loss), tol_loss(want_loss), worst_ratio);
}

TEST_F(Golden, FiveAdamWStepsWithScheduleAndClipping) {
  optim::OptimizerConfig oc;
  oc.kind = optim::OptimizerKind::adamw;
  oc.lr = meta("adamw.lr"), oc.min_lr = meta("adamw.min_lr");
  oc.warmup_steps = meta_int("adamw.warmup_steps"), oc.decay_steps = meta_int("adamw.decay_steps");
  oc.beta1 = meta("adamw.beta1"), oc.beta2 = meta("adamw.beta2"), oc.eps = meta("adamw.eps");
  oc.weight_decay = meta("adamw.weight_decay"), oc.grad_clip = meta("adamw.grad_clip");
  auto m = model();
  optim::Optimizer<float> opt(oc, m.tensors());
  const auto want_loss = f64("adamw.loss"), want_lr = f64("adamw.lr"), want_norm = f64("adamw.grad_norm"), l1 = f64("adamw.grad_l1");
  const double rho = n_bwd() * kU, adam_sensitivity = 2 * 1.2;
  double drift = 0;  // first-order loss error carried by the parameter errors so far
  for (int step = 0; step <= 5; ++step) {
    const auto [in, tg] = batch(step);
    m.zero_grad();
    const double loss = m.forward(in, tg, B(), T());
    const double tol = tol_loss(want_loss[step]) + drift;
    EXPECT_LE(std::fabs(loss - want_loss[step]), tol) << "loss before step " << step;
    std::printf("golden adamw: loss %d err %.3g (tol %.3g)\n", step, std::fabs(loss - want_loss[step]), tol);
    if (step == 5) break;
    m.backward(1.0f);
    const double norm = optim::clip_grad_norm(m.grads(), oc.grad_clip);
    EXPECT_LE(std::fabs(norm - want_norm[step]), rho * want_norm[step]) << "grad norm at step " << step;
    const double lr = optim::learning_rate(oc, step);
    EXPECT_DOUBLE_EQ(lr, want_lr[step]);
    opt.step(m.params(), m.grads(), lr);
    drift += l1[step] * adam_sensitivity * rho * lr;
  }
}

TEST_F(Golden, OneMuonStep) {
  optim::OptimizerConfig oc;
  oc.kind = optim::OptimizerKind::muon;
  oc.lr = meta("muon.lr"), oc.min_lr = 0, oc.warmup_steps = 0, oc.decay_steps = 1;
  oc.beta1 = meta("adamw.beta1"), oc.beta2 = meta("adamw.beta2"), oc.eps = meta("adamw.eps");
  oc.weight_decay = meta("muon.weight_decay"), oc.grad_clip = 0;
  oc.muon_momentum = meta("muon.momentum"), oc.muon_ns_steps = meta_int("muon.ns_steps");
  auto m = model();
  const auto [in, tg] = batch(0);
  m.zero_grad();
  m.forward(in, tg, B(), T());
  m.backward(1.0f);
  optim::Optimizer<float> opt(oc, m.tensors());
  opt.step(m.params(), m.grads(), optim::learning_rate(oc, 0));
  // Newton-Schulz on a [r, k] matrix: each iteration chains sums of k (X X^T), r (A A) and r (B X)
  // terms; its polynomial's slope is at most a = 3.4445, so an input error grows by <= a per
  // iteration: rho_ns = (rho_grad + steps (k + 2r) u) a^steps, relative to max|update| <= 1.
  double max_param_tol = 0;
  for (const auto& t : m.tensors()) {
    const auto want = f64("muon.param." + t.name);
    double tol;
    if (t.role == ParamRole::hidden_matrix) {
      const double r = double(std::min(t.shape[0], t.shape[1])), k = double(std::max(t.shape[0], t.shape[1]));
      const double rho_ns = (n_bwd() * kU + oc.muon_ns_steps * (k + 2 * r) * kU) * std::pow(3.4445, oc.muon_ns_steps);
      tol = oc.lr * optim::muon_rms_scale(t.shape[0], t.shape[1]) * rho_ns;
    } else {
      tol = 2 * 1.2 * n_bwd() * kU * oc.lr;  // AdamW's first update is lr * g / |g|: only its sign can err
    }
    double max_param = 0;
    for (double x : want) max_param = std::max(max_param, std::fabs(x));
    tol += kU * max_param;  // storing the parameter in FP32
    const double err = max_abs_err(m.params().subspan(t.offset, t.size), want);
    EXPECT_LE(err, tol) << t.name;
    max_param_tol = std::max(max_param_tol, tol);
    if (t.role == ParamRole::hidden_matrix) std::printf("golden muon: %s err %.3g (tol %.3g)\n", t.name.c_str(), err, tol);
  }
  const auto [in1, tg1] = batch(1);
  const double loss = m.forward(in1, tg1, B(), T()), want = f64("muon.loss_after")[0];
  double g1 = 0;
  for (double x : f64("adamw.grad_l1")) g1 = std::max(g1, x);
  EXPECT_LE(std::fabs(loss - want), tol_loss(want) + g1 * max_param_tol);
}

}  // namespace
}  // namespace stableflash::model
