// The CUTLASS GELU products (cutlass_gelu_gemm.hpp) against an FP64 host reference, called
// directly and through Blas::gemm in the trainer's form (deterministic: the CUTLASS kernel; tuned:
// whichever is faster, cuBLASLt included, under the same bound).
//
// Inputs are small integers times powers of two, exact in BF16, so every product a b is exact in
// FP32 and the reference sees the kernel's inputs bit for bit. Bound per element, the GEMM lab's
// (model/cuda/lab/gemm_lab.cpp, "Check"), each term derived:
//   acc  = k 2^-24 sum |a b|: FP32 accumulation in any order (plus the bias, exact);
//   D, forward:  2 BF16 ulps of GELU(z) (twice the naive BF16's half ulp plus one, the project's
//                rule) + (|GELU'(z)| + 0.01) acc (an error acc in z moves GELU by GELU' acc, and
//                |GELU''| <= 0.8 adds 0.8 acc^2 < 0.01 acc for acc < 1e-2) + 2^-16 (1 + |z|) for
//                GELU's FP32 evaluation (cutlass_gelu_gemm.cuh derives a few 2^-20; tanh.approx,
//                ~5e-4 relative in tanh, overshoots it 10-100x in the negative tail);
//   aux, forward: 2 BF16 ulps of z + acc (the FP32 z, rounded once);
//   D, backward: 2 ulps of p GELU'(a) + |GELU'(a)| acc + 2^-16 (1 + a^2) |p| (GELU' and its terms
//                are below 1 + a^2), with p the product and a the BF16 aux read.
// The operands spread z over about [-7, 7] so that the negative tail, where an inaccurate tanh
// shows, is sampled.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "stableflash/model/cuda/blas.hpp"
#include "stableflash/model/cuda/cutlass_gelu_gemm.hpp"
#include "stableflash/model/cuda/device_array.hpp"
#include "stableflash/numerics/bf16.hpp"

namespace stableflash::model::cuda {
namespace {

constexpr double kSqrt2OverPi = 0.7978845608028654;
double gelu(double x) { return 0.5 * x * (1 + std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x))); }
double gelu_grad(double x) {
  const double t = std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * kSqrt2OverPi * (1 + 3 * 0.044715 * x * x);
}
double ulp_bf16(double x) {
  x = std::fabs(x);
  return x == 0 ? 0 : std::ldexp(1.0, std::max(std::ilogb(x), -126) - 7);
}

bool has_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// An integer in [-half, half] times `scale` (a power of two): exact in BF16 for half <= 255.
std::vector<float> exact_values(std::size_t n, std::uint64_t seed, int half, float scale) {
  std::vector<float> v(n);
  std::uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (float& x : v) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;  // xorshift64
    x = float(int(s % std::uint64_t(2 * half + 1)) - half) * scale;
  }
  return v;
}

struct Device {
  DeviceArray<bf16> data;
  explicit Device(const std::vector<float>& host) : data(host.size()) {
    std::vector<bf16> b;
    for (float x : host) b.push_back(bf16::from_float(x));
    data.upload(b.data(), b.size(), nullptr);
  }
  explicit Device(std::size_t n) : data(n) {}
  std::vector<float> download() const {
    std::vector<bf16> h(data.size());
    data.download(h.data(), h.size(), nullptr);
    check_cuda(cudaDeviceSynchronize(), "sync");
    std::vector<float> out;
    for (bf16 x : h) out.push_back(x.to_float());
    return out;
  }
  std::vector<std::uint16_t> bits() const {
    std::vector<bf16> h(data.size());
    data.download(h.data(), h.size(), nullptr);
    check_cuda(cudaDeviceSynchronize(), "sync");
    std::vector<std::uint16_t> out;
    for (bf16 x : h) out.push_back(x.bits);
    return out;
  }
};

// One product of the trainer's form, row-major: A [m, k]; B [k, n] (forward) or [n, k] (backward);
// D, aux [m, n]; the forward's bias [n].
struct Problem {
  GeluGemm which;
  int m, n, k;
  std::vector<float> a, b, bias, aux;
  Device da, db, dbias, daux, dd;
  Problem(GeluGemm w, int m_, int n_, int k_)
      : which(w), m(m_), n(n_), k(k_),
        a(exact_values(std::size_t(m) * k, 1, 127, 1.0f / 128)),
        b(exact_values(std::size_t(k) * n, 2, 127, 1.0f / 256)),
        bias(exact_values(std::size_t(n), 3, 127, 1.0f / 64)),
        aux(exact_values(std::size_t(m) * n, 4, 224, 1.0f / 32)),  // the backward's GELU input, in [-7, 7]
        da(a), db(b), dbias(bias), daux(w == GeluGemm::backward ? Device(aux) : Device(aux.size())), dd(std::size_t(m) * n) {}
  bool forward() const { return which == GeluGemm::forward; }
  double b_at(int kk, int j) const { return forward() ? b[std::size_t(kk) * n + j] : b[std::size_t(j) * k + kk]; }
  GeluGemmArgs args() {
    GeluGemmArgs p;
    p.m = m, p.n = n, p.k = k;
    p.a = da.data.get(), p.lda = k;
    p.b = db.data.get(), p.ldb = forward() ? n : k;
    p.d = dd.data.get(), p.ldd = n;
    p.aux = daux.data.get();
    p.bias = forward() ? dbias.data.get() : nullptr;
    return p;
  }
  void blas_gemm(Blas& blas) {
    GemmOptions o;
    o.epilogue = forward() ? Epilogue::gelu : Epilogue::dgelu;
    o.aux = daux.data.get();
    o.bias = forward() ? dbias.data.get() : nullptr;
    blas.gemm(Trans::no, forward() ? Trans::no : Trans::yes, bf16_matrix(da.data.get(), m, k),
              forward() ? bf16_matrix(db.data.get(), k, n) : bf16_matrix(db.data.get(), n, k), bf16_matrix(dd.data.get(), m, n), o);
  }
  // Compares D (and the forward's aux) at `points` (all where empty) with the FP64 reference.
  void check(const std::string& label, std::vector<std::pair<int, int>> points = {}) const {
    if (points.empty())
      for (int i = 0; i < m; ++i)
        for (int j = 0; j < n; ++j) points.push_back({i, j});
    const std::vector<float> d = dd.download();
    const std::vector<float> got_aux = forward() ? daux.download() : std::vector<float>{};
    int bad = 0;
    double worst = 0;
    auto compare = [&](const char* what, int i, int j, double got, double want, double bound) {
      const double ratio = std::fabs(got - want) / bound;
      worst = std::max(worst, std::isnan(ratio) ? INFINITY : ratio);
      if (!(ratio <= 1.0) && bad++ < 5)
        ADD_FAILURE() << label << ": " << what << " at (" << i << ", " << j << "): got " << got << ", want " << want << ", bound " << bound;
    };
    for (auto [i, j] : points) {
      double p = 0, sum_abs = 0;
      for (int kk = 0; kk < k; ++kk) {
        const double t = double(a[std::size_t(i) * k + kk]) * b_at(kk, j);
        p += t, sum_abs += std::fabs(t);
      }
      const double acc = k * std::ldexp(1.0, -24) * sum_abs;
      const std::size_t at = std::size_t(i) * n + j;
      if (forward()) {
        const double z = p + bias[std::size_t(j)];
        const double want = gelu(z);
        compare("D", i, j, d[at], want, 2 * ulp_bf16(want) + (std::fabs(gelu_grad(z)) + 0.01) * acc + std::ldexp(1.0, -16) * (1 + std::fabs(z)));
        compare("aux", i, j, got_aux[at], z, 2 * ulp_bf16(z) + acc);
      } else {
        const double x = aux[at], g = gelu_grad(x), want = p * g;
        compare("D", i, j, d[at], want, 2 * ulp_bf16(want) + std::fabs(g) * acc + std::ldexp(1.0, -16) * (1 + x * x) * std::fabs(p));
      }
    }
    EXPECT_EQ(bad, 0) << label << ": " << bad << " of " << points.size() << " elements outside their bound (worst " << worst << " of it)";
  }
};

std::vector<std::pair<int, int>> sampled(int m, int n, int count) {
  std::vector<std::pair<int, int>> s = {{0, 0}, {m - 1, n - 1}, {0, n - 1}, {m - 1, 0}};
  std::uint64_t h = 12345;
  while (int(s.size()) < count) {
    h ^= h << 13, h ^= h >> 7, h ^= h << 17;
    s.push_back({int(h % std::uint64_t(m)), int((h >> 32) % std::uint64_t(n))});
  }
  return s;
}

// Host only (no device): the trainer's shapes run, what CUTLASS or TMA cannot take falls back.
TEST(CutlassGeluGemm, SupportsTheTrainersShapesAndRefusesWhatItCannotRun) {
  auto at = [](std::uintptr_t p) { return reinterpret_cast<void*>(p); };
  GeluGemmArgs fwd;  // fc of GPT-2 124M at B 16, T 1024
  fwd.m = 16384, fwd.n = 3072, fwd.k = 768;
  fwd.a = at(0x100000), fwd.lda = 768, fwd.b = at(0x200000), fwd.ldb = 3072, fwd.d = at(0x300000), fwd.ldd = 3072;
  fwd.aux = at(0x400000), fwd.bias = at(0x500000);
  EXPECT_TRUE(cutlass_gelu_gemm_supported(GeluGemm::forward, fwd));
  GeluGemmArgs no_bias = fwd;
  no_bias.bias = nullptr;
  EXPECT_TRUE(cutlass_gelu_gemm_supported(GeluGemm::forward, no_bias));
  GeluGemmArgs bwd = no_bias;  // dX of the MLP projection: W_fcproj [3072, 768]
  bwd.ldb = 768;
  EXPECT_TRUE(cutlass_gelu_gemm_supported(GeluGemm::backward, bwd));

  GeluGemmArgs x = bwd;
  x.bias = fwd.bias;
  EXPECT_FALSE(cutlass_gelu_gemm_supported(GeluGemm::backward, x)) << "no bias in the backward";
  x = fwd, x.a = at(0x100002);
  EXPECT_FALSE(cutlass_gelu_gemm_supported(GeluGemm::forward, x)) << "A not 16-byte aligned";
  x = fwd, x.bias = at(0x500008);
  EXPECT_FALSE(cutlass_gelu_gemm_supported(GeluGemm::forward, x)) << "bias not 16-byte aligned";
  x = fwd, x.k = 764, x.lda = 764;
  EXPECT_FALSE(cutlass_gelu_gemm_supported(GeluGemm::forward, x)) << "rows of A not a multiple of 16 bytes";
  x = bwd, x.ldd = 3076;
  EXPECT_FALSE(cutlass_gelu_gemm_supported(GeluGemm::backward, x)) << "rows of D not a multiple of 16 bytes";
  x = fwd, x.ldb = 3000;
  EXPECT_FALSE(cutlass_gelu_gemm_supported(GeluGemm::forward, x)) << "ld of B below its row";
}

struct Shape {
  int m, n, k;
  bool full;  // every element checked, else 4096 sampled
};
// Odd sizes that leave partial tiles in M, N and K; then the trainer's n and k with 2048 tokens.
const Shape kShapes[] = {{257, 392, 200, true}, {2048, 3072, 768, false}};

void check_all_runners(GeluGemm which) {
  for (const Shape& s : kShapes) {
    Problem p(which, s.m, s.n, s.k);
    const auto points = s.full ? std::vector<std::pair<int, int>>{} : sampled(s.m, s.n, 4096);
    const std::string shape = " [" + std::to_string(s.m) + ", " + std::to_string(s.n) + ", " + std::to_string(s.k) + "]";
    ASSERT_TRUE(cutlass_gelu_gemm_supported(which, p.args())) << shape;
    cutlass_gelu_gemm(which, p.args(), nullptr);
    p.check("CUTLASS" + shape, points);
    if (!s.full) {  // no split sums: the same bits on every run
      const auto first = p.dd.bits();
      cutlass_gelu_gemm(which, p.args(), nullptr);
      EXPECT_EQ(p.dd.bits(), first) << "CUTLASS run twice" << shape;
    }
    for (bool tune : {false, true}) {
      Blas blas(nullptr, tune);
      p.blas_gemm(blas);  // chooses
      p.blas_gemm(blas);  // runs the choice
      p.check(std::string(tune ? "Blas tuned" : "Blas deterministic") + shape, points);
    }
  }
}

TEST(CutlassGeluGemm, ForwardMatchesFp64) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  check_all_runners(GeluGemm::forward);
}

TEST(CutlassGeluGemm, BackwardMatchesFp64) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  check_all_runners(GeluGemm::backward);
}

}  // namespace
}  // namespace stableflash::model::cuda
