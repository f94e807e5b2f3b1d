// The GPU-vs-oracle comparison of docs/numerics-contract.md (cuda.hpp: check_against_oracle), used by
// `stableflash bench attention` before timing and by the GPU tests.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "stableflash/attention/cuda.hpp"
#include "stableflash/attention/error_bound.hpp"
#include "stableflash/numerics/exact_ops.hpp"
#include "stableflash/numerics/random.hpp"

namespace stableflash::attention::cuda {
namespace {

std::vector<bf16> random_bf16(std::size_t n, std::uint64_t seed, std::uint64_t stream, double scale) {
  SplitMix64 rng(seed, stream);
  std::vector<bf16> out(n);
  for (auto& x : out) x = bf16_from_double(rng.normal() * scale);
  return out;
}

template <class A, class B>
double max_abs_diff(const std::vector<A>& a, const std::vector<B>& b, std::int64_t* nonfinite) {
  double m = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double x = double(static_cast<float>(a[i])), y = double(static_cast<double>(b[i]));
    if (!std::isfinite(x)) {
      if (nonfinite && !(std::isinf(x) && x == y)) ++*nonfinite;
      continue;
    }
    m = std::max(m, std::fabs(x - y));
  }
  return m;
}

double max_abs(const std::vector<double>& a) {
  double m = 0.0;
  for (double x : a)
    if (std::isfinite(x)) m = std::max(m, std::fabs(x));
  return m;
}

OracleTensorCheck fused_check(const char* name, const std::vector<bf16>& gpu, const std::vector<bf16>& naive,
                              const std::vector<double>& ref, double factor) {
  OracleTensorCheck c;
  c.name = name;
  c.elements = std::int64_t(gpu.size());
  c.err = max_abs_diff(gpu, ref, &c.nonfinite);
  c.bound = error_bound(max_abs_diff(naive, ref, nullptr), max_abs(ref), factor);
  for (std::size_t i = 0; i < gpu.size(); ++i) c.differing += gpu[i].bits != bf16_from_double(ref[i]).bits;
  return c;
}

template <class T>
OracleTensorCheck paper_check(const char* name, const std::vector<T>& gpu, const std::vector<T>& cpu, double ulps) {
  OracleTensorCheck c;
  c.name = name;
  c.elements = std::int64_t(gpu.size());
  double scale = 0.0;
  for (const T& x : cpu)
    if (std::isfinite(double(static_cast<float>(x)))) scale = std::max(scale, std::fabs(double(static_cast<float>(x))));
  for (std::size_t i = 0; i < gpu.size(); ++i) {
    const double x = double(static_cast<float>(gpu[i])), y = double(static_cast<float>(cpu[i]));
    if (x == y || (std::isnan(x) && std::isnan(y))) continue;
    ++c.differing;
    if (!std::isfinite(x) || !std::isfinite(y)) {
      ++c.nonfinite;
      continue;
    }
    c.err = std::max(c.err, std::fabs(x - y));
  }
  c.bound = ulps * bf16_ulp(scale);
  return c;
}

}  // namespace

bool OracleCheck::pass() const {
  return std::all_of(tensors.begin(), tensors.end(), [](const OracleTensorCheck& t) { return t.pass(); });
}

std::string OracleCheck::describe() const {
  std::string out;
  char line[256];
  for (const auto& t : tensors) {
    std::snprintf(line, sizeof line, "%-4s %s  max err %.3g (bound %.3g)  differing %lld / %lld  non-finite %lld\n",
                  t.name.c_str(), t.pass() ? "ok  " : "FAIL", t.err, t.bound, static_cast<long long>(t.differing),
                  static_cast<long long>(t.elements), static_cast<long long>(t.nonfinite));
    out += line;
  }
  return out;
}

OracleCheck check_against_oracle(const AttentionShape& s, Layout layout, const AttentionOptions& options,
                                 std::uint64_t seed, double logit_scale, double paper_ulps, const Kernels& kernels) {
  AttentionOptions cpu = options, gpu = options;
  cpu.device = Device::cpu, gpu.device = Device::cuda;
  const auto nq = std::size_t(s.q_elements()), nk = std::size_t(s.k_elements()), rows = std::size_t(s.rows());
  // logits scale with |q| |k|: scale q alone
  const std::vector<bf16> q = random_bf16(nq, seed, 1, logit_scale), k = random_bf16(nk, seed, 2, 1.0);
  const std::vector<bf16> v = random_bf16(nk, seed, 3, 1.0), d_o = random_bf16(nq, seed, 4, 1.0);
  const bool residual = options.needs_residual(s);

  struct Run {
    std::vector<bf16> o, r, dq, dk, dv;
    std::vector<float> lse;
  };
  auto run = [&](const AttentionOptions& opt, bool on_gpu) {
    Run out{std::vector<bf16>(nq), std::vector<bf16>(residual ? nq : 0), std::vector<bf16>(nq), std::vector<bf16>(nk),
            std::vector<bf16>(nk), std::vector<float>(rows)};
    ForwardArgs fa;
    fa.shape = s, fa.layout = layout, fa.q = q.data(), fa.k = k.data(), fa.v = v.data();
    fa.o = out.o.data(), fa.lse = out.lse.data(), fa.o_residual = residual ? out.r.data() : nullptr;
    on_gpu ? forward_from_host(fa, opt, kernels) : attention_forward(fa, opt);
    BackwardArgs ba;
    ba.shape = s, ba.layout = layout, ba.q = q.data(), ba.k = k.data(), ba.v = v.data(), ba.o = out.o.data();
    ba.lse = out.lse.data(), ba.o_residual = fa.o_residual, ba.d_o = d_o.data();
    ba.dq = out.dq.data(), ba.dk = out.dk.data(), ba.dv = out.dv.data();
    on_gpu ? backward_from_host(ba, opt, kernels) : attention_backward(ba, opt);
    return out;
  };
  const Run g = run(gpu, true);
  OracleCheck check;
  if (options.numerics == Numerics::paper) {
    const Run c = run(cpu, false);
    check.tensors = {paper_check("o", g.o, c.o, paper_ulps), paper_check("lse", g.lse, c.lse, paper_ulps),
                     paper_check("dq", g.dq, c.dq, paper_ulps), paper_check("dk", g.dk, c.dk, paper_ulps),
                     paper_check("dv", g.dv, c.dv, paper_ulps)};
    return check;
  }
  ForwardArgs fa;
  fa.shape = s, fa.layout = layout, fa.q = q.data(), fa.k = k.data(), fa.v = v.data();
  const ReferenceForward ref = reference_forward(fa, cpu);
  std::vector<bf16> naive_o(nq), ndq(nq), ndk(nk), ndv(nk);
  fa.o = naive_o.data();
  naive_bf16_forward(fa, cpu);
  BackwardArgs ba;
  ba.shape = s, ba.layout = layout, ba.q = q.data(), ba.k = k.data(), ba.v = v.data(), ba.o = naive_o.data();
  ba.d_o = d_o.data(), ba.dq = ndq.data(), ba.dk = ndk.data(), ba.dv = ndv.data();
  naive_bf16_backward(ba, cpu);
  const ReferenceBackward rb = reference_backward(ba, cpu);
  check.tensors = {fused_check("o", g.o, naive_o, ref.o, kOutputBoundFactor),
                   fused_check("dq", g.dq, ndq, rb.dq, kGradientBoundFactor),
                   fused_check("dk", g.dk, ndk, rb.dk, kGradientBoundFactor),
                   fused_check("dv", g.dv, ndv, rb.dv, kGradientBoundFactor)};
  return check;
}

}  // namespace stableflash::attention::cuda
