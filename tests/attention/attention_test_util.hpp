// Inputs and error measures shared by the attention tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "stableflash/attention/attention.hpp"
#include "stableflash/attention/error_bound.hpp"
#include "stableflash/numerics/exact_ops.hpp"
#include "stableflash/numerics/random.hpp"

namespace stableflash::attention::testing {

// Whether two tensors hold the same bits, element for element (and the same size).
template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Random BF16 tensors ~ N(0, sigma^2) (FlashAttention's test inputs).
inline std::vector<bf16> random_bf16(std::size_t n, std::uint64_t seed, double sigma = 1.0) {
  SplitMix64 rng(seed);
  std::vector<bf16> x(n);
  for (auto& v : x) v = bf16::from_float(static_cast<float>(sigma * rng.normal()));
  return x;
}

struct Problem {
  AttentionShape shape;
  Layout layout = Layout::bhtd;
  std::vector<bf16> q, k, v, d_o;

  Problem(AttentionShape s, std::uint64_t seed, double q_sigma = 1.0, Layout l = Layout::bhtd) : shape(s), layout(l) {
    q = random_bf16(std::size_t(s.q_elements()), seed * 4 + 0, q_sigma);
    k = random_bf16(std::size_t(s.k_elements()), seed * 4 + 1);
    v = random_bf16(std::size_t(s.k_elements()), seed * 4 + 2);
    d_o = random_bf16(std::size_t(s.q_elements()), seed * 4 + 3);
  }
  ForwardArgs forward_args() const {
    ForwardArgs a;
    a.shape = shape, a.layout = layout, a.q = q.data(), a.k = k.data(), a.v = v.data();
    return a;
  }
  BackwardArgs backward_args() const {
    BackwardArgs a;
    a.shape = shape, a.layout = layout, a.q = q.data(), a.k = k.data(), a.v = v.data(), a.d_o = d_o.data();
    return a;
  }
};

// Outputs of a BF16 forward + backward run.
struct FlashRun {
  std::vector<bf16> o, residual, dq, dk, dv;
  std::vector<float> lse, delta;
  TieCounts ties;
};

inline FlashRun run_flash(const Problem& p, const AttentionOptions& opt, bool backward = true) {
  FlashRun r;
  r.o.resize(p.q.size()), r.residual.resize(p.q.size()), r.lse.resize(std::size_t(p.shape.rows()));
  ForwardArgs fa = p.forward_args();
  fa.o = r.o.data(), fa.lse = r.lse.data(), fa.o_residual = r.residual.data(), fa.ties = &r.ties;
  attention_forward(fa, opt);
  if (backward) {
    r.dq.resize(p.q.size()), r.dk.resize(p.k.size()), r.dv.resize(p.k.size()), r.delta.resize(r.lse.size());
    BackwardArgs ba = p.backward_args();
    ba.o = r.o.data(), ba.lse = r.lse.data(), ba.o_residual = r.residual.data();
    ba.dq = r.dq.data(), ba.dk = r.dk.data(), ba.dv = r.dv.data(), ba.delta = r.delta.data();
    attention_backward(ba, opt);
  }
  return r;
}

// The naive BF16 implementation (the error bound's yardstick) on the same problem: o, dq, dk, dv.
inline FlashRun run_naive_bf16(const Problem& p, const AttentionOptions& opt) {
  FlashRun r;
  r.o.resize(p.q.size()), r.dq.resize(p.q.size()), r.dk.resize(p.k.size()), r.dv.resize(p.k.size());
  ForwardArgs fa = p.forward_args();
  fa.o = r.o.data();
  naive_bf16_forward(fa, opt);
  BackwardArgs ba = p.backward_args();
  ba.dq = r.dq.data(), ba.dk = r.dk.data(), ba.dv = r.dv.data();
  naive_bf16_backward(ba, opt);
  return r;
}

inline double max_abs(const std::vector<double>& x) {
  double m = 0.0;
  for (double v : x) m = std::max(m, std::fabs(v));
  return m;
}

// max |x - ref|; NaN anywhere makes it +inf so any bound fails loudly.
template <class T>
double max_abs_error(const std::vector<T>& x, const std::vector<double>& ref) {
  double m = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double xv = [&] {
      if constexpr (std::is_same_v<T, bf16>) return double(x[i].to_float());
      else return double(x[i]);
    }();
    if (!std::isfinite(xv)) return INFINITY;
    m = std::max(m, std::fabs(xv - ref[i]));
  }
  return m;
}

// stableflash/attention/error_bound.hpp's bound against a reference vector.
inline double error_bound(double naive_error, const std::vector<double>& ref, double factor) {
  return attention::error_bound(naive_error, max_abs(ref), factor);
}

inline bool bitwise_equal(const std::vector<bf16>& a, const std::vector<bf16>& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](bf16 x, bf16 y) { return x.bits == y.bits; });
}

}  // namespace stableflash::attention::testing
