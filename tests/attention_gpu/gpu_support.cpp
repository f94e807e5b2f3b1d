#include "gpu_support.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "launch.hpp"  // cuda::multiprocessors
#include "stableflash/attention/error_bound.hpp"
#include "stableflash/numerics/exact_ops.hpp"
#include "stableflash/numerics/random.hpp"

namespace stableflash::attention::gpu_test {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// Poison values the kernels never produce: a NaN payload for BF16, one for FP32.
template <class T>
T poison();
template <>
bf16 poison<bf16>() {
  return bf16::from_bits(0xffa5);
}
template <>
float poison<float>() {
  std::uint32_t u = 0xffc0a5a5u;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
template <class T>
bool is_poison(T x) {
  const T p = poison<T>();
  return std::memcmp(&x, &p, sizeof(T)) == 0;
}

}  // namespace

template <class T>
GuardedBuffer<T>::GuardedBuffer(std::size_t n) : n_(n) {
  check(cudaMalloc(&base_, (n + 2 * kGuard) * sizeof(T)), "cudaMalloc");
  const std::vector<T> fill(n + 2 * kGuard, poison<T>());
  check(cudaMemcpy(base_, fill.data(), fill.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
}

template <class T>
GuardedBuffer<T>::GuardedBuffer(std::size_t n, const std::vector<T>& init) : GuardedBuffer(n) {
  check(cudaMemcpy(get(), init.data(), n * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
}

template <class T>
GuardedBuffer<T>::~GuardedBuffer() {
  cudaFree(base_);
}

template <class T>
std::vector<T> GuardedBuffer<T>::download() const {
  std::vector<T> out(n_);
  check(cudaMemcpy(out.data(), get(), n_ * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy");
  return out;
}

template <class T>
::testing::AssertionResult GuardedBuffer<T>::intact(bool fully_written) const {
  std::vector<T> all(n_ + 2 * kGuard);
  check(cudaMemcpy(all.data(), base_, all.size() * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy");
  for (std::size_t i = 0; i < kGuard; ++i) {
    if (!is_poison(all[i])) return ::testing::AssertionFailure() << "guard before the buffer overwritten at -" << kGuard - i;
    if (!is_poison(all[n_ + kGuard + i])) return ::testing::AssertionFailure() << "guard after the buffer overwritten at +" << i;
  }
  if (fully_written)
    for (std::size_t i = 0; i < n_; ++i)
      if (is_poison(all[kGuard + i])) return ::testing::AssertionFailure() << "element " << i << " never written";
  return ::testing::AssertionSuccess();
}

template class GuardedBuffer<bf16>;
template class GuardedBuffer<float>;

Inputs random_inputs(const AttentionShape& s, Layout layout, std::uint64_t seed, double logit_scale) {
  Inputs in{s, layout, {}, {}, {}, {}};
  auto fill = [&](std::vector<bf16>& x, std::int64_t n, std::uint64_t stream, double scale) {
    SplitMix64 rng(seed, stream);
    x.resize(std::size_t(n));
    for (auto& e : x) e = bf16_from_double(rng.normal() * scale);
  };
  fill(in.q, s.q_elements(), 1, logit_scale);
  fill(in.k, s.k_elements(), 2, 1.0);
  fill(in.v, s.k_elements(), 3, 1.0);
  fill(in.d_o, s.q_elements(), 4, 1.0);
  return in;
}

Inputs exact_dot_inputs(const AttentionShape& s, Layout layout, std::uint64_t seed) {
  Inputs in = random_inputs(s, layout, seed);
  SplitMix64 rng(seed, 9);
  // |q_d k_d| <= 1 in steps of 2^-6: a D <= 128 sum needs at most 13 significand bits
  for (auto* t : {&in.q, &in.k})
    for (auto& e : *t) e = bf16::from_float(float(int(rng.uniform(-8.0, 9.0))) / 8.0f);
  return in;
}

cuda::ForwardPlan plan_on_this_device(const AttentionShape& s, const AttentionOptions& opt) {
  const auto at = [](std::uintptr_t address) { return reinterpret_cast<bf16*>(address); };  // 16-byte aligned stand-ins
  ForwardArgs a;
  a.shape = s;
  a.q = at(0x10000), a.k = at(0x20000), a.v = at(0x30000), a.o = at(0x40000);
  a.lse = reinterpret_cast<float*>(0x50000);
  return cuda::plan_forward(a, opt.for_shape(s), cuda::multiprocessors());  // as cuda::forward asks it
}

Outputs run_gpu(const Inputs& in, const AttentionOptions& options, bool backward, bool count_ties) {
  AttentionOptions opt = options;
  opt.device = Device::cuda;
  const AttentionShape& s = in.shape;
  const auto nq = std::size_t(s.q_elements()), nk = std::size_t(s.k_elements()), rows = std::size_t(s.rows());
  const bool residual = opt.needs_residual(s);
  GuardedBuffer<bf16> q(nq, in.q), k(nk, in.k), v(nk, in.v), d_o(nq, in.d_o), o(nq), r(residual ? nq : 0);
  GuardedBuffer<float> lse(rows);
  Outputs out;
  ForwardArgs fa;
  fa.shape = s, fa.layout = in.layout, fa.q = q.get(), fa.k = k.get(), fa.v = v.get(), fa.o = o.get();
  fa.lse = lse.get(), fa.o_residual = residual ? r.get() : nullptr, fa.ties = count_ties ? &out.ties : nullptr;
  attention_forward(fa, opt);
  check(cudaDeviceSynchronize(), "forward");
  EXPECT_TRUE(o.intact(true)) << "o";
  EXPECT_TRUE(lse.intact(true)) << "lse";
  if (residual) {
    EXPECT_TRUE(r.intact(true)) << "o_residual";
  }
  EXPECT_TRUE(q.intact(false) && k.intact(false) && v.intact(false)) << "inputs";
  out.o = o.download(), out.lse = lse.download();
  if (residual) out.residual = r.download();
  if (!backward) return out;
  GuardedBuffer<bf16> dq(nq), dk(nk), dv(nk);
  GuardedBuffer<float> delta(rows);
  BackwardArgs ba;
  ba.shape = s, ba.layout = in.layout, ba.q = q.get(), ba.k = k.get(), ba.v = v.get(), ba.o = o.get();
  ba.lse = lse.get(), ba.o_residual = fa.o_residual, ba.d_o = d_o.get();
  ba.dq = dq.get(), ba.dk = dk.get(), ba.dv = dv.get(), ba.delta = delta.get();
  attention_backward(ba, opt);
  check(cudaDeviceSynchronize(), "backward");
  EXPECT_TRUE(dq.intact(true)) << "dq";
  EXPECT_TRUE(dk.intact(true)) << "dk";
  EXPECT_TRUE(dv.intact(true)) << "dv";
  EXPECT_TRUE(delta.intact(true)) << "delta";
  out.dq = dq.download(), out.dk = dk.download(), out.dv = dv.download(), out.delta = delta.download();
  return out;
}

int runs_differing_from_first(const Inputs& in, const AttentionOptions& opt, int runs) {
  const Outputs first = run_gpu(in, opt, /*backward=*/true);
  int differing = 0;
  for (int run = 1; run < runs; ++run) {
    const Outputs again = run_gpu(in, opt, /*backward=*/true);
    differing += !(same_bits(first.o, again.o) && same_bits(first.lse, again.lse) && same_bits(first.residual, again.residual) &&
                   same_bits(first.delta, again.delta) && same_bits(first.dq, again.dq) && same_bits(first.dk, again.dk) &&
                   same_bits(first.dv, again.dv));
  }
  return differing;
}

BackwardInputsOnDevice::BackwardInputsOnDevice(const Inputs& in, const Outputs& forward)
    : shape(in.shape),
      layout(in.layout),
      q(in.q.size(), in.q),
      k(in.k.size(), in.k),
      v(in.v.size(), in.v),
      d_o(in.d_o.size(), in.d_o),
      o(forward.o.size(), forward.o),
      residual(forward.residual.size(), forward.residual),
      lse(forward.lse.size(), forward.lse) {}

BackwardArgs BackwardInputsOnDevice::args() const {
  BackwardArgs ba;
  ba.shape = shape, ba.layout = layout, ba.q = q.get(), ba.k = k.get(), ba.v = v.get(), ba.o = o.get();
  ba.o_residual = residual.size() ? residual.get() : nullptr, ba.lse = lse.get(), ba.d_o = d_o.get();
  return ba;
}

Outputs run_cpu(const Inputs& in, const AttentionOptions& options, bool backward) {
  AttentionOptions opt = options;
  opt.device = Device::cpu;
  const AttentionShape& s = in.shape;
  const auto nq = std::size_t(s.q_elements()), nk = std::size_t(s.k_elements()), rows = std::size_t(s.rows());
  const bool residual = opt.needs_residual(s);
  Outputs out;
  out.o.resize(nq), out.lse.resize(rows), out.residual.resize(residual ? nq : 0);
  ForwardArgs fa;
  fa.shape = s, fa.layout = in.layout, fa.q = in.q.data(), fa.k = in.k.data(), fa.v = in.v.data();
  fa.o = out.o.data(), fa.lse = out.lse.data(), fa.o_residual = residual ? out.residual.data() : nullptr;
  fa.ties = &out.ties;
  attention_forward(fa, opt);
  if (!backward) return out;
  out.dq.resize(nq), out.dk.resize(nk), out.dv.resize(nk), out.delta.resize(rows);
  BackwardArgs ba;
  ba.shape = s, ba.layout = in.layout, ba.q = in.q.data(), ba.k = in.k.data(), ba.v = in.v.data();
  ba.o = out.o.data(), ba.lse = out.lse.data(), ba.o_residual = fa.o_residual, ba.d_o = in.d_o.data();
  ba.dq = out.dq.data(), ba.dk = out.dk.data(), ba.dv = out.dv.data(), ba.delta = out.delta.data();
  attention_backward(ba, opt);
  return out;
}

double max_err(const std::vector<bf16>& a, const std::vector<double>& ref, std::int64_t* nonfinite) {
  double m = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double x = a[i].to_float();
    if (!std::isfinite(x)) {
      if (nonfinite) ++*nonfinite;
      continue;
    }
    m = std::max(m, std::fabs(x - ref[i]));
  }
  return m;
}

double max_abs(const std::vector<double>& x) {
  double m = 0.0;
  for (double e : x)
    if (std::isfinite(e)) m = std::max(m, std::fabs(e));
  return m;
}

Bounds fused_bounds(const Inputs& in, const AttentionOptions& options, bool backward) {
  AttentionOptions opt = options;
  opt.device = Device::cpu;
  const AttentionShape& s = in.shape;
  const auto nq = std::size_t(s.q_elements()), nk = std::size_t(s.k_elements());
  ForwardArgs fa;
  fa.shape = s, fa.layout = in.layout, fa.q = in.q.data(), fa.k = in.k.data(), fa.v = in.v.data();
  ReferenceForward ref = reference_forward(fa, opt);
  std::vector<bf16> naive_o(nq);
  fa.o = naive_o.data();
  naive_bf16_forward(fa, opt);
  Bounds b{};
  b.o = error_bound(max_err(naive_o, ref.o), max_abs(ref.o), kOutputBoundFactor);
  b.ref_o = std::move(ref.o), b.ref_lse = std::move(ref.lse);
  if (!backward) return b;
  std::vector<bf16> dq(nq), dk(nk), dv(nk);
  BackwardArgs ba;
  ba.shape = s, ba.layout = in.layout, ba.q = in.q.data(), ba.k = in.k.data(), ba.v = in.v.data();
  ba.o = naive_o.data(), ba.d_o = in.d_o.data(), ba.dq = dq.data(), ba.dk = dk.data(), ba.dv = dv.data();
  naive_bf16_backward(ba, opt);
  ReferenceBackward rb = reference_backward(ba, opt);
  b.dq = error_bound(max_err(dq, rb.dq), max_abs(rb.dq), kGradientBoundFactor);
  b.dk = error_bound(max_err(dk, rb.dk), max_abs(rb.dk), kGradientBoundFactor);
  b.dv = error_bound(max_err(dv, rb.dv), max_abs(rb.dv), kGradientBoundFactor);
  b.ref_dq = std::move(rb.dq), b.ref_dk = std::move(rb.dk), b.ref_dv = std::move(rb.dv), b.ref_delta = std::move(rb.delta);
  return b;
}

std::string Agreement::str() const {
  return std::to_string(differing) + " of " + std::to_string(elements) + " elements differ (max " + std::to_string(max_ulps) +
         " ulp of max|ref|), " + std::to_string(nonfinite) + " non-finite mismatches";
}

template <class T>
Agreement agreement(const std::vector<T>& a, const std::vector<T>& b) {
  Agreement r;
  r.elements = std::int64_t(a.size());
  double scale = 0.0;
  for (const T& x : b)
    if (std::isfinite(double(static_cast<float>(x)))) scale = std::max(scale, std::fabs(double(static_cast<float>(x))));
  const double ulp = bf16_ulp(scale);
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double x = static_cast<float>(a[i]), y = static_cast<float>(b[i]);
    if (x == y || (std::isnan(x) && std::isnan(y))) continue;
    ++r.differing;
    if (!std::isfinite(x) || !std::isfinite(y)) {
      ++r.nonfinite;
      continue;
    }
    r.max_ulps = std::max(r.max_ulps, std::fabs(x - y) / ulp);
  }
  return r;
}
template Agreement agreement(const std::vector<bf16>&, const std::vector<bf16>&);
template Agreement agreement(const std::vector<float>&, const std::vector<float>&);

}  // namespace stableflash::attention::gpu_test
