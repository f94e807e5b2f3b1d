// The shared numerics headers compiled for the device give the host's results: BF16 rounding
// (hardware cvt on the GPU) bit for bit, round_bits rounding bit for bit, and the fused kernels'
// exp2 within its documented accuracy.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gpu_support.hpp"
#include "paper_pairs.cuh"
#include "stableflash/attention/rounding_points.hpp"
#include "stableflash/numerics/bf16.hpp"
#include "stableflash/numerics/random.hpp"

namespace stableflash::attention::gpu_test {
namespace {

__global__ void round_kernel(const float* in, float* out_bf16, float* out_bits, int n, int bits) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  out_bf16[i] = round_bf16(in[i]);
  out_bits[i] = round_to_bits_rne(in[i], bits);
}

__global__ void exp2_kernel(const float* in, float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = exp2_fast(in[i]);
}

// in: pairs (s, m) of BF16 values and FP32 dots d; out: BF16(s - m) and paper::score of (d, d')
// computed on packed pairs.
__global__ void paper_pairs_kernel(const float* in, float* shifted, float* scores, int n, float scale) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (2 * i + 1 >= n) return;
  const float s0 = in[2 * i], s1 = in[2 * i + 1];
  const std::uint32_t d = cuda::paper_shifted_pair(cuda::pack_bf16x2(round_bf16(s0), round_bf16(s1)), round_bf16(s0 * 0.75f));
  shifted[2 * i] = cuda::bf16_lo(d), shifted[2 * i + 1] = cuda::bf16_hi(d);
  const std::uint32_t sc = cuda::paper_score_pair(s0, s1, scale);
  scores[2 * i] = cuda::bf16_lo(sc), scores[2 * i + 1] = cuda::bf16_hi(sc);
}

float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::vector<float> test_values() {
  std::vector<float> v;
  SplitMix64 rng(7);
  for (int i = 0; i < (1 << 20); ++i) v.push_back(from_bits(std::uint32_t(rng.next())));
  // midpoints and their neighbours around many exponents, subnormals, the ends of the range
  for (std::uint32_t e = 0; e < 255; e += 3)
    for (std::uint32_t low : {0x8000u, 0x7fffu, 0x8001u, 0x18000u, 0xffffu, 0x0u})
      for (std::uint32_t sign : {0u, 0x80000000u}) v.push_back(from_bits(sign | (e << 23) | low));
  for (std::uint32_t u : {0x7f7fffffu, 0x7f7f8000u, 0x7f800000u, 0xff800000u, 0x00000001u, 0x807fffffu}) v.push_back(from_bits(u));
  return v;
}

template <class F>
std::vector<float> on_device(const std::vector<float>& in, F launch, std::vector<float>* second = nullptr) {
  float *d_in, *d_a, *d_b;
  const std::size_t bytes = in.size() * sizeof(float);
  cudaMalloc(&d_in, bytes), cudaMalloc(&d_a, bytes), cudaMalloc(&d_b, bytes);
  cudaMemcpy(d_in, in.data(), bytes, cudaMemcpyHostToDevice);
  launch(d_in, d_a, d_b, int(in.size()));
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> a(in.size());
  cudaMemcpy(a.data(), d_a, bytes, cudaMemcpyDeviceToHost);
  if (second) {
    second->resize(in.size());
    cudaMemcpy(second->data(), d_b, bytes, cudaMemcpyDeviceToHost);
  }
  cudaFree(d_in), cudaFree(d_a), cudaFree(d_b);
  return a;
}

bool same(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);  // payloads may differ
  std::uint32_t x, y;
  std::memcpy(&x, &a, 4), std::memcpy(&y, &b, 4);
  return x == y;
}

TEST(DeviceNumerics, RoundingMatchesHostBitForBit) {
  SF_REQUIRE_GPU();
  const std::vector<float> in = test_values();
  for (int bits = 1; bits <= 7; ++bits) {
    std::vector<float> dev_bits;
    const std::vector<float> dev_bf16 = on_device(
        in, [&](float* i, float* a, float* b, int n) { round_kernel<<<(n + 255) / 256, 256>>>(i, a, b, n, bits); }, &dev_bits);
    std::int64_t bad_bf16 = 0, bad_bits = 0;
    for (std::size_t k = 0; k < in.size(); ++k) {
      bad_bf16 += !same(dev_bf16[k], round_bf16(in[k]));
      bad_bits += !same(dev_bits[k], round_to_bits_rne(in[k], bits));
    }
    EXPECT_EQ(bad_bf16, 0) << "round_bf16 differs between device and host";
    EXPECT_EQ(bad_bits, 0) << "round_to_bits_rne(bits=" << bits << ") differs between device and host";
  }
}

// The forward's packed paper path (paper_pairs.cuh) must give the scalar rounding points bit for
// bit: BF16(S - m) for BF16 S and m over every exponent gap, and BF16(BF16(dot) * scale) for a
// power-of-two and a general scale.
TEST(DeviceNumerics, PackedPaperPairsMatchTheScalarRoundingPoints) {
  SF_REQUIRE_GPU();
  std::vector<float> in = test_values();
  SplitMix64 rng(11);
  for (int i = 0; i < (1 << 18); ++i) {  // values of similar size: differences that round
    const float x = float(rng.uniform(-64.0, 64.0));
    in.push_back(x), in.push_back(x * float(rng.uniform(0.5, 1.5)));
  }
  if (in.size() % 2) in.push_back(0.0f);
  for (float scale : {0.125f, 0.08838834764831845f}) {
    std::vector<float> scores;
    const std::vector<float> shifted = on_device(
        in,
        [&](float* i, float* a, float* b, int n) { paper_pairs_kernel<<<(n / 2 + 255) / 256, 256>>>(i, a, b, n, scale); },
        &scores);
    std::int64_t bad_shift = 0, bad_score = 0, checked = 0;
    for (std::size_t k = 0; k < in.size(); ++k) {
      const float s_bf = round_bf16(in[k]), m_bf = round_bf16(in[k & ~std::size_t(1)] * 0.75f);
      if (std::isnan(s_bf) || std::isnan(m_bf) || (std::isinf(s_bf) && std::isinf(m_bf))) continue;  // no such scores
      ++checked;
      bad_shift += !same(shifted[k], round_bf16(sub_rn(s_bf, m_bf)));
      bad_score += !same(scores[k], paper::score(in[k], scale));
    }
    EXPECT_GT(checked, 1 << 19);
    EXPECT_EQ(bad_shift, 0) << "sub.rn.bf16x2 differs from round_bf16(sub_rn(s, m))";
    EXPECT_EQ(bad_score, 0) << "paper_score_pair differs from paper::score at scale " << scale;
  }
}

TEST(DeviceNumerics, Exp2FastIsAccurateToTwoToTheMinus21) {
  SF_REQUIRE_GPU();
  std::vector<float> in;
  SplitMix64 rng(3);
  for (int i = 0; i < 100000; ++i) in.push_back(float(rng.uniform(-126.0, 0.0)));
  in.push_back(0.0f), in.push_back(-__builtin_huge_valf());
  const std::vector<float> out =
      on_device(in, [](float* i, float* a, float*, int n) { exp2_kernel<<<(n + 255) / 256, 256>>>(i, a, n); });
  double worst = 0.0;
  for (std::size_t k = 0; k < in.size(); ++k) {
    const double ref = std::exp2(double(in[k]));
    if (ref == 0.0) {
      EXPECT_EQ(out[k], 0.0f);
      continue;
    }
    worst = std::max(worst, std::fabs(out[k] - ref) / ref);
  }
  EXPECT_LE(worst, std::ldexp(1.0, -21)) << "exp2_fast relative error";
  EXPECT_EQ(out[in.size() - 2], 1.0f) << "exp2(0) must be exactly 1 (P-bar of the row maximum)";
}

}  // namespace
}  // namespace stableflash::attention::gpu_test
