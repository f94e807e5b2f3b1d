// The spectral-norm probe (power iteration) against a full SVD from a linear-algebra library
// (Eigen's JacobiSVD, in FP64, of the same FP32 matrix).
//
// Tolerance: both compute sigma_max of the same matrix in FP64. Power iteration after k rounds is
// within sigma_1 (sigma_2 / sigma_1)^(2k) of it (from below); with the planted spectrum below
// (sigma_2 / sigma_1 <= 0.6 and k = 100) that is below 1e-40 sigma_1, so what remains is FP64
// rounding: each round's matrix-vector products sum n = max(rows, cols) terms, an error of n u
// relative (u = 2^-53), and the SVD's own is of the same order: 4 n u sigma_1 in all.
#include <gtest/gtest.h>

#include <Eigen/Dense>

#include <cmath>
#include <vector>

#include "stableflash/diag/spectral.hpp"
#include "stableflash/numerics/random.hpp"

namespace stableflash::diag {
namespace {

// W = U diag(s) V^T with random orthogonal U, V (QR of Gaussian matrices), stored as FP32 with a
// leading dimension past its columns (as W_Q sits inside c_attn's [C, 3C]).
std::vector<float> planted(int rows, int cols, std::int64_t ld, const std::vector<double>& s, std::uint64_t seed) {
  SplitMix64 rng(seed);
  auto gaussian = [&](int r, int c) {
    Eigen::MatrixXd m(r, c);
    for (int i = 0; i < r; ++i)
      for (int j = 0; j < c; ++j) m(i, j) = rng.normal();
    return m;
  };
  const int k = std::min(rows, cols);
  const Eigen::MatrixXd U = Eigen::HouseholderQR<Eigen::MatrixXd>(gaussian(rows, k)).householderQ() * Eigen::MatrixXd::Identity(rows, k);
  const Eigen::MatrixXd V = Eigen::HouseholderQR<Eigen::MatrixXd>(gaussian(cols, k)).householderQ() * Eigen::MatrixXd::Identity(cols, k);
  Eigen::VectorXd d(k);
  for (int i = 0; i < k; ++i) d(i) = s[std::size_t(i)];
  const Eigen::MatrixXd W = U * d.asDiagonal() * V.transpose();
  std::vector<float> out(std::size_t(rows) * std::size_t(ld), -7.0f);  // the columns past `cols` must be ignored
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) out[std::size_t(i * ld + j)] = float(W(i, j));
  return out;
}

double svd_sigma_max(const std::vector<float>& w, int rows, int cols, std::int64_t ld) {
  Eigen::MatrixXd m(rows, cols);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) m(i, j) = double(w[std::size_t(i * ld + j)]);
  return Eigen::JacobiSVD<Eigen::MatrixXd>(m).singularValues()(0);
}

TEST(SpectralNorm, PowerIterationEqualsTheFullSvd) {
  for (auto [rows, cols] : {std::pair{48, 48}, std::pair{64, 40}, std::pair{33, 90}}) {
    const int k = std::min(rows, cols);
    std::vector<double> s(static_cast<std::size_t>(k));
    for (int i = 0; i < k; ++i) s[std::size_t(i)] = i == 0 ? 10.0 : 6.0 * std::pow(0.97, i);  // sigma_2 / sigma_1 = 0.6
    const std::int64_t ld = 3 * cols;
    const auto w = planted(rows, cols, ld, s, 7 + std::uint64_t(rows));
    const double want = svd_sigma_max(w, rows, cols, ld);
    std::vector<double> v;
    const double got = spectral_norm(w.data(), rows, cols, ld, v, 100);
    EXPECT_NEAR(got, want, 4.0 * std::max(rows, cols) * 0x1p-53 * want) << rows << " x " << cols;
    EXPECT_LE(got, want * (1 + 4.0 * std::max(rows, cols) * 0x1p-53));  // from below
  }
}

TEST(SpectralNorm, AWarmStartNeedsFewRounds) {
  const int n = 64;
  std::vector<double> s(n);
  for (int i = 0; i < n; ++i) s[std::size_t(i)] = i == 0 ? 10.0 : 6.0 * std::pow(0.97, i);
  auto w = planted(n, n, n, s, 3);
  std::vector<double> v;
  spectral_norm(w.data(), n, n, n, v, 100);
  // A small change, as one optimizer step makes: the old vector is close to the new one.
  SplitMix64 rng(5);
  for (float& x : w) x += float(1e-4 * rng.normal());
  const double want = svd_sigma_max(w, n, n, n);
  std::vector<double> cold;
  const double warm_estimate = spectral_norm(w.data(), n, n, n, v, 8);
  const double cold_estimate = spectral_norm(w.data(), n, n, n, cold, 2);
  // Eight warm rounds: (0.6)^16 of the small start error is far below 1e-6 relative.
  EXPECT_NEAR(warm_estimate, want, 1e-6 * want);
  EXPECT_GT(std::abs(cold_estimate - want), 1e-6 * want) << "two cold rounds should not suffice (else the warm test shows nothing)";
}

TEST(SpectralNorm, RefusesBadShapesAndHandlesZero) {
  std::vector<float> w(16, 0.0f);
  std::vector<double> v;
  EXPECT_EQ(spectral_norm(w.data(), 4, 4, 4, v, 3), 0.0);
  EXPECT_THROW(spectral_norm(w.data(), 4, 4, 3, v, 3), std::invalid_argument);
  EXPECT_THROW(spectral_norm(w.data(), 0, 4, 4, v, 3), std::invalid_argument);
}

}  // namespace
}  // namespace stableflash::diag
