// The packed GEMM against an FP64 sum, for every transpose combination and awkward sizes, and its
// promise that results do not depend on the thread count.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "stableflash/model/gemm.hpp"
#include "stableflash/numerics/random.hpp"

namespace stableflash::model {
namespace {

std::vector<float> random_matrix(std::size_t n, std::uint64_t seed) {
  SplitMix64 rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = float(rng.uniform(-1, 1));
  return v;
}

struct Case {
  int M, N, K;
  Trans ta, tb;
};

TEST(Gemm, MatchesFp64WithinTheFp32SummationBound) {
  const Case cases[] = {{1, 1, 1, Trans::no, Trans::no},     {17, 97, 33, Trans::no, Trans::no}, {65, 300, 257, Trans::no, Trans::yes},
                        {130, 17, 513, Trans::yes, Trans::no}, {5, 1000, 64, Trans::yes, Trans::yes}, {64, 256, 256, Trans::no, Trans::no}};
  for (const Case& c : cases)
    for (bool accumulate : {false, true}) {
      const auto A = random_matrix(std::size_t(c.M) * c.K, 1), B = random_matrix(std::size_t(c.K) * c.N, 2);
      auto C = random_matrix(std::size_t(c.M) * c.N, 3);
      const auto C0 = C;
      const int lda = c.ta == Trans::no ? c.K : c.M, ldb = c.tb == Trans::no ? c.N : c.K;
      gemm<float>(c.ta, c.tb, c.M, c.N, c.K, A.data(), lda, B.data(), ldb, C.data(), c.N, accumulate);
      // Forward error of a k-term FP32 sum of products (Higham, Thm 3.1) plus the final add:
      // |err| <= gamma_{K+1} * (sum |a b| + |c0|), gamma_n = n u / (1 - n u), u = 2^-24.
      const double u = std::ldexp(1.0, -24), gamma = (c.K + 1) * u / (1 - (c.K + 1) * u);
      for (int i = 0; i < c.M; ++i)
        for (int j = 0; j < c.N; ++j) {
          double exact = accumulate ? C0[i * c.N + j] : 0.0, magnitude = accumulate ? std::fabs(C0[i * c.N + j]) : 0.0;
          for (int k = 0; k < c.K; ++k) {
            const double a = c.ta == Trans::no ? A[i * lda + k] : A[k * lda + i];
            const double b = c.tb == Trans::no ? B[k * ldb + j] : B[j * ldb + k];
            exact += a * b, magnitude += std::fabs(a * b);
          }
          ASSERT_LE(std::fabs(C[i * c.N + j] - exact), gamma * magnitude) << c.M << "x" << c.N << "x" << c.K << " at " << i << "," << j;
        }
    }
}

TEST(Gemm, BitwiseIndependentOfThreadCount) {
  const int M = 150, N = 700, K = 300;
  const auto A = random_matrix(std::size_t(M) * K, 4), B = random_matrix(std::size_t(K) * N, 5);
  std::vector<float> one(std::size_t(M) * N), two(std::size_t(M) * N);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  gemm<float>(Trans::no, Trans::yes, M, N, K, A.data(), K, B.data(), K, one.data(), N, false);
  omp_set_num_threads(3);
  gemm<float>(Trans::no, Trans::yes, M, N, K, A.data(), K, B.data(), K, two.data(), N, false);
  omp_set_num_threads(threads);
  EXPECT_EQ(0, std::memcmp(one.data(), two.data(), one.size() * sizeof(float)));
}

}  // namespace
}  // namespace stableflash::model
