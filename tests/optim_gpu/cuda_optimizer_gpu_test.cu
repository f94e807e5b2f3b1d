// CudaOptimizer against the CPU oracle Optimizer<double> (FP64). Every tolerance is derived from
// the roundings of the arithmetic it bounds (comments at each bound); BF16 copies, clipping and
// state transfers are checked bit for bit where the arithmetic is exactly specified.
//
// AdamW and Muon are checked one step at a time: before each step the FP64 oracle is loaded with
// the GPU's own FP32 state, so a bound covers the roundings of a single step instead of an error
// that compounds (and the test still fails at once if any step applies a wrong rule).
#include <gtest/gtest.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "stableflash/model/cuda/blas.hpp"
#include "stableflash/model/cuda/device_array.hpp"
#include "stableflash/model/gpt2.hpp"
#include "stableflash/numerics/bf16.hpp"
#include "stableflash/optim/cuda_optimizer.hpp"
#include "stableflash/optim/optimizer.hpp"
#include "stableflash/optim/sharding.hpp"
#include "require_gpu.hpp"

namespace stableflash::optim {
namespace {

using model::ParamRole;
using model::ParamTensor;
using model::cuda::Blas;
using model::cuda::check_cuda;
using model::cuda::DeviceArray;

constexpr double kU = 0x1p-24;  // FP32 unit roundoff (round to nearest)

class Stream {
 public:
  Stream() { check_cuda(cudaStreamCreate(&s_), "cudaStreamCreate"); }
  ~Stream() { cudaStreamDestroy(s_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

std::int64_t total_size(const std::vector<ParamTensor>& tensors) {
  std::int64_t n = 0;
  for (const auto& t : tensors) n = std::max(n, t.offset + t.size);
  return n;
}

void append(std::vector<ParamTensor>& tensors, std::string name, std::vector<std::int64_t> shape, ParamRole role) {
  std::int64_t size = 1;
  for (auto d : shape) size *= d;
  const std::int64_t offset = total_size(tensors);
  tensors.push_back({std::move(name), std::move(shape), offset, size, role});
}

// A tiny GPT-2 (1-D LayerNorm weights and biases, 2-D embeddings, wide and tall hidden matrices)
// plus three tensors for the edges: a 2-D AdamW tensor spanning three table chunks with a tail, a
// 1-D one whose last chunk holds one element, and an odd tall Muon matrix.
std::vector<ParamTensor> test_layout() {
  model::Gpt2Config c;
  c.n_layer = 2, c.n_head = 2, c.n_embd = 16, c.block_size = 8, c.vocab_size = 64, c.padded_vocab_size = 64, c.bias = true;
  auto tensors = model::parameter_layout(c);
  append(tensors, "test.big_matrix", {257, 521}, ParamRole::embedding);
  append(tensors, "test.long_vector", {65537}, ParamRole::vector);
  append(tensors, "test.odd_tall", {97, 33}, ParamRole::hidden_matrix);
  return tensors;
}

std::vector<float> normal_floats(std::int64_t n, std::uint64_t seed, double scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> dist(0.0, scale);
  std::vector<float> out(static_cast<std::size_t>(n));
  for (auto& x : out) x = float(dist(rng));
  return out;
}

// Gradients whose scale differs per tensor (1e-3 .. 10), so the bounds meet varied magnitudes.
std::vector<float> test_grads(const std::vector<ParamTensor>& tensors, std::uint64_t seed) {
  auto g = normal_floats(total_size(tensors), seed, 1.0);
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    const float scale = float(std::pow(10.0, double(int(k % 5) - 3)));
    for (std::int64_t i = 0; i < tensors[k].size; ++i) g[std::size_t(tensors[k].offset + i)] *= scale;
  }
  return g;
}

std::vector<double> to_double(std::span<const float> x) { return {x.begin(), x.end()}; }

std::uint32_t bits_of(float x) { return float_to_bits(x); }
std::uint16_t bits_of(__nv_bfloat16 x) {
  std::uint16_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

// The device parameters (FP32 and BF16) and gradients, each followed by kGuard poisoned elements
// that no kernel may touch.
class DeviceModel {
 public:
  static constexpr std::size_t kGuard = 64;
  explicit DeviceModel(std::int64_t n) : n_(static_cast<std::size_t>(n)), params_(n_ + kGuard), grads_(n_ + kGuard), bf16_(n_ + kGuard) {
    const std::vector<float> poison(kGuard, bits_to_float(0x7fa5a5a5u));
    const std::vector<std::uint16_t> poison16(kGuard, 0x7fa5u);
    check_cuda(cudaMemcpy(params_.get() + n_, poison.data(), kGuard * sizeof(float), cudaMemcpyHostToDevice), "guard");
    check_cuda(cudaMemcpy(grads_.get() + n_, poison.data(), kGuard * sizeof(float), cudaMemcpyHostToDevice), "guard");
    check_cuda(cudaMemcpy(bf16_.get() + n_, poison16.data(), kGuard * sizeof(std::uint16_t), cudaMemcpyHostToDevice), "guard");
  }
  float* params() { return params_.get(); }
  float* grads() { return grads_.get(); }
  __nv_bfloat16* params_bf16() { return bf16_.get(); }

  void set_params(const std::vector<float>& p) { put(params_.get(), p); }
  void set_grads(const std::vector<float>& g) { put(grads_.get(), g); }
  std::vector<float> get_params() const { return get(params_.get(), n_); }
  std::vector<float> get_grads() const { return get(grads_.get(), n_); }
  std::vector<__nv_bfloat16> get_bf16() const { return get(bf16_.get(), n_); }

  ::testing::AssertionResult guards_intact() const {
    const auto p = get(params_.get() + n_, kGuard), g = get(grads_.get() + n_, kGuard);
    const auto h = get(bf16_.get() + n_, kGuard);
    for (std::size_t i = 0; i < kGuard; ++i)
      if (bits_of(p[i]) != 0x7fa5a5a5u || bits_of(g[i]) != 0x7fa5a5a5u || bits_of(h[i]) != 0x7fa5u)
        return ::testing::AssertionFailure() << "write past the end, guard element " << i;
    return ::testing::AssertionSuccess();
  }

 private:
  template <class T>
  void put(T* dst, const std::vector<T>& src) {
    ASSERT_EQ(src.size(), n_);
    check_cuda(cudaMemcpy(dst, src.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy (test upload)");
  }
  template <class T>
  static std::vector<T> get(const T* src, std::size_t n) {
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize (test)");
    std::vector<T> out(n);
    check_cuda(cudaMemcpy(out.data(), src, n * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy (test download)");
    return out;
  }
  std::size_t n_;
  DeviceArray<float> params_, grads_;
  DeviceArray<__nv_bfloat16> bf16_;
};

// Largest err / tol over a tensor's elements; a NaN error counts as infinitely wrong.
struct Worst {
  double ratio = 0, err = 0, tol = 0;
  std::int64_t at = -1;
  void add(std::int64_t i, double e, double t) {
    const double r = std::isnan(e) ? std::numeric_limits<double>::infinity() : (e <= t ? (t > 0 ? e / t : 0.0) : (t > 0 ? e / t : std::numeric_limits<double>::infinity()));
    if (r > ratio || at < 0) ratio = r, err = e, tol = t, at = i;
  }
};
#define EXPECT_WITHIN(worst, what, tensor)                                                                             \
  EXPECT_LE((worst).ratio, 1.0) << (what) << " of " << (tensor).name << ": element " << (worst).at << " off by " \
                                << (worst).err << ", bound " << (worst).tol

// The BF16 copy is exactly BF16(p) (round to nearest even) for every element.
void expect_bf16_copy(const std::vector<float>& p, const std::vector<__nv_bfloat16>& p16) {
  std::int64_t bad = 0, first = -1;
  for (std::size_t i = 0; i < p.size(); ++i)
    if (bits_of(p16[i]) != bf16::from_float(p[i]).bits && bad++ == 0) first = std::int64_t(i);
  EXPECT_EQ(bad, 0) << "BF16 copy differs from BF16(p), first at element " << first;
}

// First-order bound on |FP32 AdamW - FP64 AdamW| for one element after one step from the same
// FP32 p, g, m0, v0 (u = 2^-24; each FP32 operation adds a relative u, and each constant cast to
// FP32 (beta, 1 - beta through beta, eps, bc2_sqrt, lr, bc1, decay) a relative u of its own):
//   m1 = b1 m0 + (1-b1) g:          b1's cast, its product, (1-b1)'s cast, its product, the sum
//                                   -> |dm| <= 3u (|m0| + |g|)
//   v1 = b2 v0 + ((1-b2) g) g:      likewise with one product more -> |dv| <= 3u (v0 + g^2)
//   d = sqrt(v1) / bc2s + eps:      relative dv / (2 v1) from v, then sqrt, bc2s's cast, the
//                                   division, eps's cast and the sum -> rel(d) <= dv / (2 v1) + 4u
//   q = step_size (m1 / d):         step_size = lr / bc1 carries 3u; the quotient dm/d +
//                                   |m1| rel(d)/d + u; the product u -> |dq| <= step (dm + |m1| rel(d)) / d + 5u |q|
//   p1 = p decay - q:               decay's cast and its product 2u|p|, the difference u|p1|
//                                   -> |dp| <= 2u |p| + u |p1| + |dq|
// Returned doubled: the second-order terms and the FP64 oracle's own roundings (~2^-53 relative)
// are far below the first-order terms.
struct AdamwBound {
  double p = 0, m = 0, v = 0;
};
AdamwBound adamw_bound(const OptimizerConfig& c, double lr, std::int64_t t, bool decays, double p, double g, double m0, double v0) {
  const double m1 = c.beta1 * m0 + (1 - c.beta1) * g;
  const double v1 = c.beta2 * v0 + (1 - c.beta2) * g * g;
  const double step = lr / (1 - std::pow(c.beta1, double(t)));
  const double d = std::sqrt(v1) / std::sqrt(1 - std::pow(c.beta2, double(t))) + c.eps;
  const double dm = 3 * kU * (std::abs(m0) + std::abs(g));
  const double dv = 3 * kU * (v0 + g * g);
  const double rel_d = (v1 > 0 ? dv / (2 * v1) : 0.0) + 4 * kU;
  const double q = step * std::abs(m1) / d;
  const double dq = step * (dm + std::abs(m1) * rel_d) / d + 5 * kU * q;
  const double p1 = std::abs(p) * (decays ? 1 - lr * c.weight_decay : 1.0) + q;
  return {2 * (2 * kU * std::abs(p) + kU * p1 + dq), 2 * dm, 2 * dv};
}

// Checks one AdamW tensor after a step: params and both moments within adamw_bound of the FP64 oracle.
void expect_adamw_tensor(const ParamTensor& t, const OptimizerConfig& c, double lr, std::int64_t step, const std::vector<float>& p0,
                         const std::vector<float>& g, const std::vector<float>& m0, const std::vector<float>& v0,
                         const std::vector<float>& p1, const std::vector<float>& m1, const std::vector<float>& v1,
                         std::span<const double> p_ref, std::span<const double> m_ref, std::span<const double> v_ref) {
  Worst wp, wm, wv;
  for (std::int64_t k = 0; k < t.size; ++k) {
    const std::size_t i = std::size_t(t.offset + k);
    const AdamwBound b = adamw_bound(c, lr, step, t.is_2d(), p0[i], g[i], m0[i], v0[i]);
    wp.add(k, std::abs(p1[i] - p_ref[i]), b.p);
    wm.add(k, std::abs(m1[i] - m_ref[i]), b.m);
    wv.add(k, std::abs(v1[i] - v_ref[i]), b.v);
  }
  EXPECT_WITHIN(wp, "AdamW parameter", t);
  EXPECT_WITHIN(wm, "AdamW first moment", t);
  EXPECT_WITHIN(wv, "AdamW second moment", t);
}

TEST(CudaOptimizerGpu, AdamwMatchesFp64OracleWithinDerivedBound) {
  SF_REQUIRE_GPU();
  const auto tensors = test_layout();
  const std::int64_t n = total_size(tensors);
  OptimizerConfig cfg;
  cfg.kind = OptimizerKind::adamw;
  cfg.weight_decay = 0.1;  // > 0: the oracle applies it to 2-D tensors only, so a GPU decaying 1-D tensors fails
  Stream stream;
  Blas blas(stream.get());
  CudaOptimizer gpu(cfg, tensors, blas);
  DeviceModel dev(n);
  std::vector<float> p0 = normal_floats(n, 1, 0.1);
  dev.set_params(p0);
  for (int s = 0; s < 4; ++s) {
    const double lr = 3e-3 * (s + 1);
    const auto g = test_grads(tensors, 100 + s);
    dev.set_grads(g);
    std::vector<float> m0(static_cast<std::size_t>(n)), v0(static_cast<std::size_t>(n));
    gpu.download_state(m0, v0);
    Optimizer<double> ref(cfg, tensors);
    ref.load_state(gpu.steps_taken(), to_double(m0), to_double(v0));

    gpu.step(dev.params(), dev.params_bf16(), dev.grads(), lr);
    const auto p1 = dev.get_params();
    const auto p16 = dev.get_bf16();
    std::vector<float> m1(static_cast<std::size_t>(n)), v1(static_cast<std::size_t>(n));
    gpu.download_state(m1, v1);
    std::vector<double> p_ref = to_double(p0);
    ref.step(p_ref, to_double(g), lr);

    ASSERT_EQ(gpu.steps_taken(), s + 1);
    for (const auto& t : tensors)
      expect_adamw_tensor(t, cfg, lr, gpu.steps_taken(), p0, g, m0, v0, p1, m1, v1, p_ref, ref.first_moment(), ref.second_moment());
    expect_bf16_copy(p1, p16);
    EXPECT_TRUE(dev.guards_intact());
    EXPECT_EQ(dev.get_grads(), g) << "step() must not write the gradients";
    p0 = p1;
  }
}

// With zero gradients the AdamW update term is exactly 0 (m = v = 0, 0 / eps = 0), so the step is
// the decay alone: 2-D tensors become FP32(p * FP32(1 - lr wd)) bit for bit, 1-D tensors keep
// every bit (decoupled decay never touches LayerNorm weights or biases).
TEST(CudaOptimizerGpu, AdamwDecaysOnly2dTensors) {
  SF_REQUIRE_GPU();
  const auto tensors = test_layout();
  const std::int64_t n = total_size(tensors);
  OptimizerConfig cfg;
  cfg.weight_decay = 0.5;
  const double lr = 0.1;
  Stream stream;
  Blas blas(stream.get());
  CudaOptimizer gpu(cfg, tensors, blas);
  DeviceModel dev(n);
  const auto p0 = normal_floats(n, 2, 1.0);
  dev.set_params(p0);
  dev.set_grads(std::vector<float>(std::size_t(n), 0.0f));
  gpu.step(dev.params(), dev.params_bf16(), dev.grads(), lr);
  const auto p1 = dev.get_params();
  const float decay = float(1 - lr * cfg.weight_decay);
  for (const auto& t : tensors) {
    std::int64_t bad = 0;
    for (std::int64_t k = 0; k < t.size; ++k) {
      const std::size_t i = std::size_t(t.offset + k);
      const float want = t.is_2d() ? p0[i] * decay : p0[i];
      bad += bits_of(p1[i]) != bits_of(want);
    }
    EXPECT_EQ(bad, 0) << t.name << (t.is_2d() ? ": 2-D tensor not decayed by exactly lr * wd" : ": 1-D tensor changed by weight decay");
  }
  expect_bf16_copy(p1, dev.get_bf16());
}

double bf16r(double x) { return bf16::from_float(float(x)).to_float(); }

// An honest naive BF16 Newton-Schulz: torch.optim.Muon's algorithm with its rounding points (the
// look-ahead and X in BF16, every product of an addmm rounded to BF16 once) and exact (FP64)
// accumulation, so its error is that of BF16 storage alone. g: the FP64 look-ahead [rows, cols].
// (FP64 -> FP32 -> BF16 can round twice; a rare one-ulp difference does not matter for a bound.)
std::vector<double> naive_bf16_newton_schulz(const std::vector<double>& g, int rows, int cols, int steps) {
  constexpr double a = 3.4445, b = -4.7750, c = 2.0315;
  const bool tall = rows > cols;
  const int r = tall ? cols : rows, k = tall ? rows : cols;
  std::vector<double> x(g.size()), gram(std::size_t(r) * r), poly(gram.size()), next(g.size());
  double sq = 0;
  for (double v : g) sq += bf16r(v) * bf16r(v);
  const double inv = 1.0 / std::max(std::sqrt(sq), 1e-7);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j)
      x[tall ? std::size_t(j) * k + i : std::size_t(i) * k + j] = bf16r(bf16r(g[std::size_t(i) * cols + j]) * inv);
  for (int s = 0; s < steps; ++s) {
    for (int i = 0; i < r; ++i)
      for (int j = 0; j < r; ++j) {
        double acc = 0;
        for (int l = 0; l < k; ++l) acc += x[std::size_t(i) * k + l] * x[std::size_t(j) * k + l];
        gram[std::size_t(i) * r + j] = bf16r(acc);
      }
    for (int i = 0; i < r; ++i)
      for (int j = 0; j < r; ++j) {
        double acc = 0;
        for (int l = 0; l < r; ++l) acc += gram[std::size_t(i) * r + l] * gram[std::size_t(l) * r + j];
        poly[std::size_t(i) * r + j] = bf16r(b * gram[std::size_t(i) * r + j] + c * acc);
      }
    for (int i = 0; i < r; ++i)
      for (int j = 0; j < k; ++j) {
        double acc = 0;
        for (int l = 0; l < r; ++l) acc += poly[std::size_t(i) * r + l] * x[std::size_t(l) * k + j];
        next[std::size_t(i) * k + j] = bf16r(a * x[std::size_t(i) * k + j] + acc);
      }
    x.swap(next);
  }
  std::vector<double> out(g.size());
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) out[std::size_t(i) * cols + j] = tall ? x[std::size_t(j) * k + i] : x[std::size_t(i) * k + j];
  return out;
}

// One BF16 ulp at the magnitude x.
double bf16_ulp(double x) { return std::ldexp(1.0, std::ilogb(x) - 7); }

TEST(CudaOptimizerGpu, MuonMatchesFp64OracleWithinNaiveBf16Bound) {
  SF_REQUIRE_GPU();
  const auto tensors = test_layout();
  const std::int64_t n = total_size(tensors);
  OptimizerConfig cfg;
  cfg.kind = OptimizerKind::muon;
  cfg.weight_decay = 0.1;
  Stream stream;
  Blas blas(stream.get());
  CudaOptimizer gpu(cfg, tensors, blas);
  DeviceModel dev(n);
  std::vector<float> p0 = normal_floats(n, 3, 0.1);
  dev.set_params(p0);
  int muon_tensors = 0;
  for (int s = 0; s < 3; ++s) {  // three steps: the momentum buffer is non-zero from the second on
    const double lr = 0.02 / (s + 1);
    const auto g = test_grads(tensors, 200 + s);
    dev.set_grads(g);
    std::vector<float> m0(static_cast<std::size_t>(n)), v0(static_cast<std::size_t>(n));
    gpu.download_state(m0, v0);
    Optimizer<double> ref(cfg, tensors);
    ref.load_state(gpu.steps_taken(), to_double(m0), to_double(v0));

    gpu.step(dev.params(), dev.params_bf16(), dev.grads(), lr);
    const auto p1 = dev.get_params();
    std::vector<float> m1(static_cast<std::size_t>(n)), v1(static_cast<std::size_t>(n));
    gpu.download_state(m1, v1);
    std::vector<double> p_ref = to_double(p0);
    ref.step(p_ref, to_double(g), lr);
    const auto m_ref = ref.first_moment();

    for (const auto& t : tensors) {
      if (t.role != ParamRole::hidden_matrix) {
        expect_adamw_tensor(t, cfg, lr, gpu.steps_taken(), p0, g, m0, v0, p1, m1, v1, p_ref, m_ref, ref.second_moment());
        continue;
      }
      ++muon_tensors;
      const int rows = int(t.shape[0]), cols = int(t.shape[1]);
      const double mu = cfg.muon_momentum;
      // Momentum buf + (1-mu)(g - buf) in FP32: (1-mu)'s cast from mu's, the difference, the
      // product and the sum -> |d buf| <= 3u |g - buf0| + u |buf1|, doubled as in adamw_bound.
      Worst wm;
      std::vector<double> look(std::size_t(t.size));
      for (std::int64_t k = 0; k < t.size; ++k) {
        const std::size_t i = std::size_t(t.offset + k);
        wm.add(k, std::abs(m1[i] - m_ref[i]), 2 * (3 * kU * std::abs(double(g[i]) - m0[i]) + kU * std::abs(m_ref[i])));
        EXPECT_EQ(bits_of(v1[i]), bits_of(v0[i])) << "Muon must leave the second moment of " << t.name << " alone";
        look[std::size_t(k)] = g[i] + mu * (m_ref[i] - g[i]);  // Nesterov look-ahead in FP64
      }
      EXPECT_WITHIN(wm, "Muon momentum", t);

      // The update: |gpu - fp64| <= 2 |naive_bf16 - fp64| + one BF16 ulp of the update scale, plus
      // the FP32 roundings of p * decay - scaled_lr * X (decay's and scaled_lr's casts, two
      // products, the difference: 2u|p| + 2u scaled_lr |X| + u|p1|, doubled).
      std::vector<double> x64 = look;
      newton_schulz(x64.data(), rows, cols, cfg.muon_ns_steps);
      const auto naive = naive_bf16_newton_schulz(look, rows, cols, cfg.muon_ns_steps);
      const double decay = 1 - lr * cfg.weight_decay, scaled_lr = lr * muon_rms_scale(rows, cols);
      double err_gpu = 0, err_naive = 0, max_x = 0, fp32 = 0;
      for (std::int64_t k = 0; k < t.size; ++k) {
        const std::size_t i = std::size_t(t.offset + k);
        const double naive_p = p0[i] * decay - scaled_lr * naive[std::size_t(k)];
        const double e = std::abs(p1[i] - p_ref[i]);
        err_gpu = std::isnan(e) ? std::numeric_limits<double>::infinity() : std::max(err_gpu, e);
        err_naive = std::max(err_naive, std::abs(naive_p - p_ref[i]));
        max_x = std::max(max_x, std::abs(x64[std::size_t(k)]));
        fp32 = std::max(fp32, 2 * kU * (2 * std::abs(p0[i]) + 2 * scaled_lr * std::abs(x64[std::size_t(k)]) + std::abs(p_ref[i])));
      }
      const double bound = 2 * err_naive + scaled_lr * bf16_ulp(max_x) + 2 * fp32;
      EXPECT_LE(err_gpu, bound) << "Muon update of " << t.name << " at step " << s + 1 << ": naive BF16 error " << err_naive
                                << ", update scale " << scaled_lr * max_x;
      // The bound is only meaningful while BF16 Newton-Schulz tracks the FP64 one: the naive
      // error must stay well under the update itself.
      EXPECT_LT(err_naive, 0.25 * scaled_lr * max_x) << t.name;
    }
    expect_bf16_copy(p1, dev.get_bf16());
    EXPECT_TRUE(dev.guards_intact());
    p0 = p1;
  }
  EXPECT_EQ(muon_tensors, 3 * 9);  // 4 hidden matrices per layer, 2 layers, and test.odd_tall
}

// The sum of squares runs in FP64 on squares of FP32 values, which are exact in FP64 (48
// significand bits), so in any order its relative error is at most (n-1) 2^-53; the square root
// halves that and adds 2^-53. The GPU and the CPU oracle each obey this, so they differ by at most
// ((n-1) 2^-53 + 2 * 2^-53) * norm <= (n+1) 2^-53 * norm; the test allows twice that, (n+1) 2^-52
// (far tighter than an FP32 sum would allow, so an FP32 accumulation fails it).
TEST(CudaOptimizerGpu, ClipGradNormIsDeterministicAndMatchesFp64) {
  SF_REQUIRE_GPU();
  Stream stream;
  Blas blas(stream.get());
  for (std::int64_t n : {1, 17, 1000, 65537, 1000003}) {
    std::vector<ParamTensor> tensors;
    append(tensors, "test.grads", {n}, ParamRole::vector);
    CudaOptimizer gpu(OptimizerConfig{}, tensors, blas);
    DeviceModel dev(n);
    auto g = normal_floats(n, 10 + std::uint64_t(n), 1.0);
    // A spike, as after a loss spike; its square is not an FP32 number (unlike 1e4^2), so an FP32
    // square or sum anywhere in the reduction shows.
    g[std::size_t(n / 2)] = 12345.678f;
    dev.set_grads(g);

    const double norm = gpu.clip_grad_norm(dev.grads(), 0.0);  // measure only
    const double again = gpu.clip_grad_norm(dev.grads(), 0.0);
    EXPECT_EQ(std::memcmp(&norm, &again, sizeof norm), 0) << "n = " << n << ": two calls differ (" << norm << " vs " << again << ")";
    EXPECT_EQ(dev.get_grads(), g) << "n = " << n << ": max_norm = 0 must only measure";
    auto g64 = to_double(g);
    const double want = clip_grad_norm<double>(std::span<double>(g64), 0.0);
    EXPECT_LE(std::abs(norm - want), double(n + 1) * 0x1p-52 * want) << "n = " << n;

    EXPECT_EQ(gpu.clip_grad_norm(dev.grads(), 2 * norm), norm);
    EXPECT_EQ(dev.get_grads(), g) << "n = " << n << ": clip_grad_norm never writes the gradients";

    // Clipping is lazy: the gradients stay unscaled in memory, and step() applies FP32(g * factor)
    // as it reads them, so the update equals step() on gradients pre-scaled on the host, bit for bit.
    const double max_norm = norm / 3;
    const double before = gpu.clip_grad_norm(dev.grads(), max_norm);
    EXPECT_EQ(std::memcmp(&before, &norm, sizeof norm), 0) << "n = " << n << ": the returned norm is the one before clipping";
    EXPECT_EQ(dev.get_grads(), g) << "n = " << n << ": clip_grad_norm must not rescale the gradients in place";
    const float factor = float(max_norm / (norm + 1e-6));
    std::vector<float> scaled(g.size());
    for (std::size_t i = 0; i < g.size(); ++i) scaled[i] = g[i] * factor;
    CudaOptimizer ref(OptimizerConfig{}, tensors, blas);
    DeviceModel dev_ref(n);
    const auto p0 = normal_floats(n, 20 + std::uint64_t(n), 0.1);
    dev.set_params(p0);
    dev_ref.set_params(p0);
    dev_ref.set_grads(scaled);
    gpu.step(dev.params(), dev.params_bf16(), dev.grads(), 1e-3);
    ref.step(dev_ref.params(), dev_ref.params_bf16(), dev_ref.grads(), 1e-3);
    const auto p1 = dev.get_params(), p1_ref = dev_ref.get_params();
    EXPECT_EQ(std::memcmp(p1.data(), p1_ref.data(), p1.size() * sizeof(float)), 0)
        << "n = " << n << ": step() after clipping differs from step() on FP32(g * factor)";
    std::vector<float> m(g.size()), v(g.size()), m_ref(g.size()), v_ref(g.size());
    gpu.download_state(m, v);
    ref.download_state(m_ref, v_ref);
    EXPECT_EQ(std::memcmp(m.data(), m_ref.data(), m.size() * sizeof(float)), 0) << "n = " << n << ": first moments differ";
    EXPECT_EQ(std::memcmp(v.data(), v_ref.data(), v.size() * sizeof(float)), 0) << "n = " << n << ": second moments differ";
    EXPECT_EQ(dev.get_grads(), g) << "n = " << n << ": step() must not write the gradients";
    EXPECT_TRUE(dev.guards_intact()) << "n = " << n;
  }
}

// Lazy clipping through both optimizers (AdamW and Muon's momentum): clip_grad_norm then step()
// equals step() on the host-clipped gradients FP32(g * factor) bit for bit, leaves the device
// gradients unscaled, and the factor is used by that one step only (the next, unclipped step
// matches step() on the raw gradients).
TEST(CudaOptimizerGpu, LazyClipMatchesStepOnPrescaledGradsBitwise) {
  SF_REQUIRE_GPU();
  const auto tensors = test_layout();
  const std::int64_t n = total_size(tensors);
  for (const OptimizerKind kind : {OptimizerKind::adamw, OptimizerKind::muon}) {
    SCOPED_TRACE(kind == OptimizerKind::muon ? "muon" : "adamw");
    OptimizerConfig cfg;
    cfg.kind = kind;
    cfg.weight_decay = 0.1;
    Stream stream;
    Blas blas(stream.get());
    CudaOptimizer a(cfg, tensors, blas), b(cfg, tensors, blas);
    DeviceModel dev_a(n), dev_b(n);
    const auto p0 = normal_floats(n, 6, 0.1);
    dev_a.set_params(p0);
    dev_b.set_params(p0);
    auto expect_same = [&](const char* when) {
      const auto pa = dev_a.get_params(), pb = dev_b.get_params();
      EXPECT_EQ(std::memcmp(pa.data(), pb.data(), pa.size() * sizeof(float)), 0) << when << ": parameters differ";
      const auto ha = dev_a.get_bf16(), hb = dev_b.get_bf16();
      EXPECT_EQ(std::memcmp(ha.data(), hb.data(), ha.size() * sizeof(__nv_bfloat16)), 0) << when << ": BF16 copies differ";
      const auto size = static_cast<std::size_t>(n);
      std::vector<float> fa(size), sa(size), fb(size), sb(size);
      a.download_state(fa, sa);
      b.download_state(fb, sb);
      EXPECT_EQ(std::memcmp(fa.data(), fb.data(), fa.size() * sizeof(float)), 0) << when << ": first moments / momentum differ";
      EXPECT_EQ(std::memcmp(sa.data(), sb.data(), sa.size() * sizeof(float)), 0) << when << ": second moments differ";
    };

    // Step 1: a clips lazily, b steps on gradients clipped on the host.
    const auto g = test_grads(tensors, 500);
    dev_a.set_grads(g);
    const double norm = a.clip_grad_norm(dev_a.grads(), 0.0);
    const double max_norm = norm / 5;
    EXPECT_EQ(a.clip_grad_norm(dev_a.grads(), max_norm), norm);
    const float factor = float(max_norm / (norm + 1e-6));
    ASSERT_LT(factor, 1.0f);
    std::vector<float> scaled(g.size());
    for (std::size_t i = 0; i < g.size(); ++i) scaled[i] = g[i] * factor;
    dev_b.set_grads(scaled);
    a.step(dev_a.params(), dev_a.params_bf16(), dev_a.grads(), 0.01);
    b.step(dev_b.params(), dev_b.params_bf16(), dev_b.grads(), 0.01);
    EXPECT_EQ(dev_a.get_grads(), g) << "the gradients must stay unscaled in memory";
    expect_same("clipped step");

    // Step 2: no clip_grad_norm call, so no scaling: both step on the same raw gradients.
    const auto g2 = test_grads(tensors, 501);
    dev_a.set_grads(g2);
    dev_b.set_grads(g2);
    a.step(dev_a.params(), dev_a.params_bf16(), dev_a.grads(), 0.005);
    b.step(dev_b.params(), dev_b.params_bf16(), dev_b.grads(), 0.005);
    expect_same("the step after a clipped one (the factor must be forgotten)");

    // Step 3: a clip below the threshold sets no factor.
    const auto g3 = test_grads(tensors, 502);
    dev_a.set_grads(g3);
    dev_b.set_grads(g3);
    const double norm3 = a.clip_grad_norm(dev_a.grads(), 0.0);
    EXPECT_EQ(a.clip_grad_norm(dev_a.grads(), 2 * norm3), norm3);
    a.step(dev_a.params(), dev_a.params_bf16(), dev_a.grads(), 0.002);
    b.step(dev_b.params(), dev_b.params_bf16(), dev_b.grads(), 0.002);
    expect_same("a step after clip_grad_norm below max_norm");
    EXPECT_TRUE(dev_a.guards_intact() && dev_b.guards_intact());
  }
}

// A state downloaded after some steps and loaded into a fresh optimizer continues bit for bit
// (Muon covers both state arrays: momentum for hidden matrices, both moments elsewhere).
TEST(CudaOptimizerGpu, StateRoundTripContinuesBitwise) {
  SF_REQUIRE_GPU();
  const auto tensors = test_layout();
  const std::int64_t n = total_size(tensors);
  OptimizerConfig cfg;
  cfg.kind = OptimizerKind::muon;
  cfg.weight_decay = 0.1;
  Stream stream;
  Blas blas(stream.get());
  CudaOptimizer a(cfg, tensors, blas);
  DeviceModel dev_a(n), dev_b(n);
  dev_a.set_params(normal_floats(n, 4, 0.1));
  for (int s = 0; s < 2; ++s) {
    dev_a.set_grads(test_grads(tensors, 300 + s));
    a.step(dev_a.params(), dev_a.params_bf16(), dev_a.grads(), 0.01);
  }
  std::vector<float> first(static_cast<std::size_t>(n)), second(static_cast<std::size_t>(n));
  a.download_state(first, second);
  CudaOptimizer b(cfg, tensors, blas);
  b.load_state(a.steps_taken(), first, second);
  EXPECT_EQ(b.steps_taken(), 2);
  dev_b.set_params(dev_a.get_params());

  const auto g = test_grads(tensors, 400);
  dev_a.set_grads(g);
  dev_b.set_grads(g);
  a.step(dev_a.params(), dev_a.params_bf16(), dev_a.grads(), 0.005);
  b.step(dev_b.params(), dev_b.params_bf16(), dev_b.grads(), 0.005);
  const auto pa = dev_a.get_params(), pb = dev_b.get_params();
  EXPECT_EQ(std::memcmp(pa.data(), pb.data(), pa.size() * sizeof(float)), 0) << "parameters differ after reload";
  std::vector<float> fa(static_cast<std::size_t>(n)), sa(static_cast<std::size_t>(n)), fb(static_cast<std::size_t>(n)), sb(static_cast<std::size_t>(n));
  a.download_state(fa, sa);
  b.download_state(fb, sb);
  EXPECT_EQ(std::memcmp(fa.data(), fb.data(), fa.size() * sizeof(float)), 0) << "first moments differ after reload";
  EXPECT_EQ(std::memcmp(sa.data(), sb.data(), sa.size() * sizeof(float)), 0) << "second moments differ after reload";
}

TEST(CudaOptimizerGpu, StateSizeMismatchThrows) {
  SF_REQUIRE_GPU();
  const auto tensors = test_layout();
  const std::size_t n = std::size_t(total_size(tensors));
  Stream stream;
  Blas blas(stream.get());
  CudaOptimizer opt(OptimizerConfig{}, tensors, blas);
  std::vector<float> ok(n), short_(n - 1);
  EXPECT_THROW(opt.load_state(1, short_, ok), std::invalid_argument);
  EXPECT_THROW(opt.load_state(1, ok, short_), std::invalid_argument);
  EXPECT_THROW(opt.load_state(-1, ok, ok), std::invalid_argument);
  EXPECT_THROW(opt.download_state(short_, ok), std::invalid_argument);
  try {
    opt.load_state(1, short_, ok);
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(std::to_string(n - 1)), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(n)), std::string::npos) << msg;
  }
  EXPECT_EQ(opt.steps_taken(), 0) << "a rejected load must not change the step count";
}

std::uint64_t bits_of_double(double x) {
  std::uint64_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

// The clipping factor the device computes from its sums (queue_clip_grad_norm, what the trainer
// uses) is the host formula of clip_with_sum_of_squares bit for bit, with one norm slice and with
// many (a one-rank shard plan cuts the norm into per-bucket slices, added in ascending order), at,
// just below and far from the threshold; the norm that reaches the host (last_grad_norm) is that
// of the synchronous path, bit for bit.
TEST(CudaOptimizerGpu, DeviceClipFactorIsTheHostFormulaBitwise) {
  SF_REQUIRE_GPU();
  const auto tensors = test_layout();
  const std::int64_t n = total_size(tensors);
  Stream stream;
  Blas blas(stream.get());
  const ShardPlan plan = ShardPlan::make(tensors, OptimizerKind::adamw, 1, 5000);
  ASSERT_GT(plan.norm_slices(0).size(), 10u);
  for (const bool sliced : {false, true}) {
    SCOPED_TRACE(sliced ? "per-bucket norm slices" : "one norm slice");
    CudaOptimizer gpu(OptimizerConfig{}, tensors, blas, sliced ? &plan : nullptr, 0);
    DeviceModel dev(n);
    const auto g = test_grads(tensors, 700);
    dev.set_grads(g);
    const double sum = gpu.grad_sum_of_squares(dev.grads());
    const double norm = std::sqrt(sum);
    EXPECT_EQ(gpu.pending_clip_factor(), 1.0f) << "no clip pending yet";
    for (const double max_norm : {0.0, 2 * norm, norm, std::nextafter(norm, 0.0), norm / 3, 1e-30}) {
      gpu.queue_clip_grad_norm(dev.grads(), max_norm);
      const double device_norm = gpu.last_grad_norm();
      const float device_factor = gpu.pending_clip_factor();
      const double host_norm = gpu.clip_with_sum_of_squares(sum, max_norm);
      const float host_factor = gpu.pending_clip_factor();
      const float formula = max_norm > 0 && norm > max_norm ? float(max_norm / (norm + 1e-6)) : 1.0f;
      EXPECT_EQ(bits_of_double(device_norm), bits_of_double(host_norm)) << "max_norm " << max_norm;
      EXPECT_EQ(bits_of(device_factor), bits_of(formula)) << "max_norm " << max_norm << ": device " << device_factor << ", host " << formula;
      EXPECT_EQ(bits_of(host_factor), bits_of(formula)) << "max_norm " << max_norm;
      EXPECT_EQ(bits_of_double(gpu.last_grad_norm()), bits_of_double(host_norm));
      EXPECT_EQ(bits_of_double(gpu.clip_grad_norm(dev.grads(), max_norm)), bits_of_double(host_norm));
    }
    EXPECT_EQ(dev.get_grads(), g) << "the norm never writes the gradients";
  }
}

// A gradient norm that is not finite (a NaN or an infinite gradient) makes the next step write
// nothing: parameters, BF16 copy, moments and gradients keep every bit (the trainer stops there,
// "before updating the weights", without waiting for the norm first). The next step without a
// clip is an ordinary one.
TEST(CudaOptimizerGpu, NonFiniteNormSkipsTheStep) {
  SF_REQUIRE_GPU();
  const auto tensors = test_layout();
  const std::int64_t n = total_size(tensors);
  for (const OptimizerKind kind : {OptimizerKind::adamw, OptimizerKind::muon})
    for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      SCOPED_TRACE(std::string(kind == OptimizerKind::muon ? "muon" : "adamw") + (std::isnan(bad) ? ", NaN" : ", inf"));
      OptimizerConfig cfg;
      cfg.kind = kind;
      cfg.weight_decay = 0.1;
      Stream stream;
      Blas blas(stream.get());
      CudaOptimizer gpu(cfg, tensors, blas);
      DeviceModel dev(n);
      dev.set_params(normal_floats(n, 8, 0.1));
      dev.set_grads(test_grads(tensors, 800));
      gpu.clip_grad_norm(dev.grads(), 1.0);
      gpu.step(dev.params(), dev.params_bf16(), dev.grads(), 0.01);  // moments not zero from here on
      auto g = test_grads(tensors, 801);
      g[std::size_t(n / 2)] = bad;
      dev.set_grads(g);
      const auto p0 = dev.get_params();
      const auto h0 = dev.get_bf16();
      std::vector<float> m0(static_cast<std::size_t>(n)), v0(static_cast<std::size_t>(n)), m1(static_cast<std::size_t>(n)), v1(static_cast<std::size_t>(n));
      gpu.download_state(m0, v0);
      const double norm = gpu.clip_grad_norm(dev.grads(), 1.0);
      EXPECT_FALSE(std::isfinite(norm));
      EXPECT_TRUE(std::isnan(gpu.pending_clip_factor())) << "a pending skip reads as NaN";
      gpu.step(dev.params(), dev.params_bf16(), dev.grads(), 0.01, {}, /*zero_grads=*/true);
      const auto p1 = dev.get_params();
      const auto h1 = dev.get_bf16();
      gpu.download_state(m1, v1);
      EXPECT_EQ(std::memcmp(p0.data(), p1.data(), p0.size() * sizeof(float)), 0) << "parameters changed";
      EXPECT_EQ(std::memcmp(h0.data(), h1.data(), h0.size() * sizeof(__nv_bfloat16)), 0) << "BF16 copy changed";
      EXPECT_EQ(std::memcmp(m0.data(), m1.data(), m0.size() * sizeof(float)), 0) << "first moment changed";
      EXPECT_EQ(std::memcmp(v0.data(), v1.data(), v0.size() * sizeof(float)), 0) << "second moment changed";
      const auto g1 = dev.get_grads();
      EXPECT_EQ(std::memcmp(g.data(), g1.data(), g.size() * sizeof(float)), 0) << "gradients changed";
      dev.set_grads(test_grads(tensors, 802));
      gpu.step(dev.params(), dev.params_bf16(), dev.grads(), 0.01);
      EXPECT_NE(dev.get_params(), p0) << "the step after a skipped one must update";
      EXPECT_TRUE(dev.guards_intact());
    }
}

// The update in parts (what the one-GPU trainer overlaps with the next forward) on a second
// stream with its own cuBLASLt handle, zeroing the gradients as it reads them, against the
// one-launch update on the first stream: the same bits in the parameters, the BF16 copy and both
// moments, for AdamW and Muon, clipped and not; after_part runs once per part in ascending order;
// the gradients end at zero and nothing past the end is written. The cuts include one inside an
// AdamW tensor and one inside a Muon matrix (which updates with the part it starts in).
TEST(CudaOptimizerGpu, UpdateInPartsOnAnotherStreamIsBitwiseTheWholeUpdate) {
  SF_REQUIRE_GPU();
  const auto tensors = test_layout();
  const std::int64_t n = total_size(tensors);
  auto offset_of = [&](const std::string& name) {
    for (const auto& t : tensors)
      if (t.name == name) return t.offset;
    ADD_FAILURE() << name;
    return std::int64_t(0);
  };
  std::vector<std::int64_t> cuts = {0,
                                    offset_of("transformer.h.0.ln_1.weight"),
                                    offset_of("transformer.h.1.ln_1.weight"),
                                    offset_of("transformer.ln_f.weight"),
                                    offset_of("test.big_matrix") + 1000,
                                    offset_of("test.long_vector"),
                                    offset_of("test.odd_tall") + 5,
                                    n};
  std::vector<FlatRange> parts;
  for (std::size_t k = 0; k + 1 < cuts.size(); ++k) parts.push_back({cuts[k], cuts[k + 1]});
  for (const OptimizerKind kind : {OptimizerKind::adamw, OptimizerKind::muon}) {
    SCOPED_TRACE(kind == OptimizerKind::muon ? "muon" : "adamw");
    OptimizerConfig cfg;
    cfg.kind = kind;
    cfg.weight_decay = 0.1;
    Stream first, second;
    Blas blas_a(first.get()), blas_b(second.get());
    CudaOptimizer a(cfg, tensors, blas_a), b(cfg, tensors, blas_b, nullptr, 0, parts);
    EXPECT_EQ(a.part_count(), 1);
    ASSERT_EQ(b.part_count(), int(parts.size()));
    DeviceModel dev_a(n), dev_b(n);
    const auto p0 = normal_floats(n, 9, 0.1);
    dev_a.set_params(p0);
    dev_b.set_params(p0);
    for (int s = 0; s < 3; ++s) {
      const auto g = test_grads(tensors, 900 + s);
      dev_a.set_grads(g);
      dev_b.set_grads(g);
      const double norm = a.clip_grad_norm(dev_a.grads(), 0.0);
      const double max_norm = s == 1 ? 0.0 : norm / 4;  // clipped, not clipped, clipped
      a.clip_grad_norm(dev_a.grads(), max_norm);
      b.queue_clip_grad_norm(dev_b.grads(), max_norm);
      std::vector<int> seen;
      b.step(dev_b.params(), dev_b.params_bf16(), dev_b.grads(), 0.01 / (s + 1), [&](int k) { seen.push_back(k); }, /*zero_grads=*/true);
      a.step(dev_a.params(), dev_a.params_bf16(), dev_a.grads(), 0.01 / (s + 1));
      EXPECT_EQ(bits_of_double(b.last_grad_norm()), bits_of_double(norm)) << "step " << s;
      std::vector<int> want(parts.size());
      std::iota(want.begin(), want.end(), 0);
      EXPECT_EQ(seen, want) << "step " << s;
      const auto pa = dev_a.get_params(), pb = dev_b.get_params();
      EXPECT_EQ(std::memcmp(pa.data(), pb.data(), pa.size() * sizeof(float)), 0) << "step " << s << ": parameters differ";
      const auto ha = dev_a.get_bf16(), hb = dev_b.get_bf16();
      EXPECT_EQ(std::memcmp(ha.data(), hb.data(), ha.size() * sizeof(__nv_bfloat16)), 0) << "step " << s << ": BF16 copies differ";
      std::vector<float> fa(static_cast<std::size_t>(n)), sa(static_cast<std::size_t>(n)), fb(static_cast<std::size_t>(n)), sb(static_cast<std::size_t>(n));
      a.download_state(fa, sa);
      b.download_state(fb, sb);
      EXPECT_EQ(std::memcmp(fa.data(), fb.data(), fa.size() * sizeof(float)), 0) << "step " << s << ": first moments differ";
      EXPECT_EQ(std::memcmp(sa.data(), sb.data(), sa.size() * sizeof(float)), 0) << "step " << s << ": second moments differ";
      EXPECT_EQ(dev_a.get_grads(), g) << "step " << s << ": without zero_grads the gradients are read only";
      const auto gb = dev_b.get_grads();
      EXPECT_EQ(std::count(gb.begin(), gb.end(), 0.0f), std::ptrdiff_t(gb.size())) << "step " << s << ": zero_grads left gradients";
      EXPECT_TRUE(dev_a.guards_intact() && dev_b.guards_intact());
    }
  }
  // Parts must cover [0, n) in order.
  Stream stream;
  Blas blas(stream.get());
  EXPECT_THROW(CudaOptimizer(OptimizerConfig{}, tensors, blas, nullptr, 0, {{0, 10}, {11, n}}), std::invalid_argument);
  EXPECT_THROW(CudaOptimizer(OptimizerConfig{}, tensors, blas, nullptr, 0, {{0, 10}, {10, n - 1}}), std::invalid_argument);
}

// to_bf16 rounds like the CPU's bf16::from_float (nearest even), ties, subnormals and overflow included.
TEST(CudaOptimizerGpu, ToBf16RoundsToNearestEven) {
  SF_REQUIRE_GPU();
  auto x = normal_floats(4096, 5, 3.0);
  for (std::uint32_t hi : {0x3f80u, 0x3f81u, 0xbf80u, 0x0001u, 0x7f7fu})  // ties to even/odd, a subnormal, near FLT_MAX
    for (std::uint32_t lo : {0x8000u, 0x7fffu, 0x8001u, 0xffffu}) x.push_back(bits_to_float(hi << 16 | lo));
  x.push_back(std::numeric_limits<float>::infinity());
  x.push_back(-0.0f);
  const std::int64_t n = std::int64_t(x.size());
  DeviceModel dev(n);
  dev.set_params(x);
  to_bf16(dev.params_bf16(), dev.params(), n, nullptr);
  expect_bf16_copy(x, dev.get_bf16());
  EXPECT_TRUE(dev.guards_intact());
}

}  // namespace
}  // namespace stableflash::optim
