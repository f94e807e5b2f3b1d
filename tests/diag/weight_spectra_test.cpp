// Every matrix the weight-spectra probe measures against Eigen's full SVD (FP64) of the same FP32
// block, cut from the flat parameters independently of the probe's views. Bound as the trainer's
// W_Q test (tests/train/trainer_test.cpp): power iteration from below, stopped when a round moves
// the estimate by <= 1e-6 of itself, is within 2e-6 r / (1 - r) (r = (sigma_2 / sigma_1)^2, from the
// SVD) when the cold start's round cap (50 for every matrix, 200 for W_Q) cannot bind
// (r^cap < 1e-6), else within twice the gap 2 (1 - sqrt(r)); plus FP64 rounding (4 n 2^-53).
#include <gtest/gtest.h>

#include <Eigen/Dense>

#include <cmath>
#include <map>
#include <vector>

#include "stableflash/diag/weight_spectra.hpp"
#include "stableflash/numerics/random.hpp"

namespace stableflash::diag {
namespace {

// `rounds`: the cold-start cap of the scope (200 for W_Q, 50 for every matrix).
void expect_sigma(double probe, const Eigen::MatrixXd& m, const std::string& what, int rounds = 50) {
  const Eigen::VectorXd s = Eigen::JacobiSVD<Eigen::MatrixXd>(m).singularValues();
  const double r = s.size() > 1 ? std::pow(s(1) / s(0), 2) : 0.0;
  const double fp = 4.0 * double(std::max(m.rows(), m.cols())) * 0x1p-53;
  const double error = (std::pow(r, rounds) < 1e-6 ? 2e-6 * r / (1 - r) : 2 * (1 - std::sqrt(r))) + fp;
  EXPECT_LE(probe, s(0) * (1 + fp)) << what;
  EXPECT_GE(probe, s(0) * (1 - error)) << what << " (r = " << r << ")";
}

TEST(WeightSpectra, EveryMatrixAndHeadEqualsTheSvd) {
  model::Gpt2Config c;
  c.n_layer = 2, c.n_head = 3, c.n_embd = 24, c.block_size = 10, c.vocab_size = 40, c.padded_vocab_size = 48;
  const auto layout = model::parameter_layout(c);
  std::int64_t total = 0;
  for (const auto& t : layout) total += t.size;
  std::vector<float> params(static_cast<std::size_t>(total));
  SplitMix64 rng(17);
  for (float& p : params) p = float(rng.normal());
  // A block [r0, r0 + rows) x [c0, c0 + cols) of a [*, width] tensor at `offset`.
  auto block = [&](std::int64_t offset, int width, int r0, int rows, int c0, int cols) {
    Eigen::MatrixXd m(rows, cols);
    for (int i = 0; i < rows; ++i)
      for (int j = 0; j < cols; ++j) m(i, j) = params[std::size_t(offset + std::int64_t(r0 + i) * width + c0 + j)];
    return m;
  };
  std::map<std::string, const model::ParamTensor*> by_name;
  for (const auto& t : layout) by_name[t.name] = &t;

  WeightSpectra spectra(c);
  const auto r = spectra.measure(params, SpectraScope::all);
  const int C = c.n_embd, D = c.head_dim();
  std::size_t two_d = 0;
  for (const auto& t : layout) two_d += t.is_2d();
  ASSERT_EQ(r.matrices.size(), two_d);
  for (const auto& [name, sigma] : r.matrices) {
    const auto* t = by_name.at("transformer." + name + ".weight");
    expect_sigma(sigma, block(t->offset, int(t->shape[1]), 0, int(t->shape[0]), 0, int(t->shape[1])), name);
  }
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = "transformer.h." + std::to_string(l) + ".";
    const auto qkv = by_name.at(p + "attn.c_attn.weight")->offset, proj = by_name.at(p + "attn.c_proj.weight")->offset;
    const auto L = std::size_t(l);
    expect_sigma(r.wq[L], block(qkv, 3 * C, 0, C, 0, C), p + "wq");
    expect_sigma(r.wk[L], block(qkv, 3 * C, 0, C, C, C), p + "wk");
    expect_sigma(r.wv[L], block(qkv, 3 * C, 0, C, 2 * C, C), p + "wv");
    for (int h = 0; h < c.n_head; ++h) {
      const auto H = std::size_t(h);
      const std::string what = p + " head " + std::to_string(h);
      expect_sigma(r.wq_heads[L][H], block(qkv, 3 * C, 0, C, h * D, D), what + " wq");
      expect_sigma(r.wk_heads[L][H], block(qkv, 3 * C, 0, C, C + h * D, D), what + " wk");
      expect_sigma(r.wv_heads[L][H], block(qkv, 3 * C, 0, C, 2 * C + h * D, D), what + " wv");
      expect_sigma(r.wo_heads[L][H], block(proj, C, h * D, D, 0, C), what + " wo");
    }
  }
  // The W_Q scope measures the same W_Q values (its own warm starts, same rule).
  const auto wq = spectra.measure(params, SpectraScope::wq);
  for (int l = 0; l < c.n_layer; ++l) {
    const auto qkv = by_name.at("transformer.h." + std::to_string(l) + ".attn.c_attn.weight")->offset;
    expect_sigma(wq.wq[std::size_t(l)], block(qkv, 3 * C, 0, C, 0, C), "W_Q scope, layer " + std::to_string(l), 200);
  }
  EXPECT_TRUE(wq.wk.empty() && wq.matrices.empty());
}

}  // namespace
}  // namespace stableflash::diag
