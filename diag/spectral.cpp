// Power iteration for the largest singular value (see spectral.hpp).
#include "stableflash/diag/spectral.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace stableflash::diag {

double spectral_norm(const float* w, int rows, int cols, std::int64_t ld, std::vector<double>& v, int iterations, double tolerance) {
  if (rows < 1 || cols < 1 || ld < cols || iterations < 1) throw std::invalid_argument("spectral_norm: bad shape or iteration count");
  if (v.size() != std::size_t(cols)) v.assign(std::size_t(cols), 1.0 / std::sqrt(double(cols)));  // fixed, not random: reproducible
  std::vector<double> u(static_cast<std::size_t>(rows));
  double sigma = 0.0;
  // Large matrices split the products over threads: W v by rows, W^T u by column blocks, each
  // element still summed over ascending indices, so the result does not depend on the thread count
  // (inside an already parallel region the loops run on one thread).
  const bool split = std::int64_t(rows) * cols >= (std::int64_t(1) << 18);
  constexpr int kColumnBlock = 64;
  const int column_blocks = (cols + kColumnBlock - 1) / kColumnBlock;
  for (int it = 0; it < iterations; ++it) {
    // u = W v, then v = W^T u / |W^T u|; |W^T u| / |u| -> sigma_max from below.
#pragma omp parallel for schedule(static) if (split)
    for (int i = 0; i < rows; ++i) {
      const float* row = w + std::int64_t(i) * ld;
      double s = 0.0;
      for (int j = 0; j < cols; ++j) s += double(row[j]) * v[std::size_t(j)];
      u[std::size_t(i)] = s;
    }
    double uu = 0.0;
    for (double x : u) uu += x * x;
    if (uu == 0.0) return 0.0;  // W v = 0: W = 0 or v in its null space; the fixed start keeps this reproducible
#pragma omp parallel for schedule(static) if (split)
    for (int blk = 0; blk < column_blocks; ++blk) {
      const int j0 = blk * kColumnBlock, j1 = std::min(cols, j0 + kColumnBlock);
      for (int j = j0; j < j1; ++j) v[std::size_t(j)] = 0.0;
      for (int i = 0; i < rows; ++i) {
        const float* row = w + std::int64_t(i) * ld;
        const double ui = u[std::size_t(i)];
        for (int j = j0; j < j1; ++j) v[std::size_t(j)] += double(row[j]) * ui;
      }
    }
    double vv = 0.0;
    for (double x : v) vv += x * x;
    const double norm = std::sqrt(vv);
    const double previous = sigma;
    sigma = norm / std::sqrt(uu);
    for (double& x : v) x /= norm;
    if (tolerance > 0 && std::abs(sigma - previous) <= tolerance * sigma) break;
  }
  return sigma;
}

}  // namespace stableflash::diag
