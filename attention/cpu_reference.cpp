// The FP64 `reference` numerics (docs/numerics-contract.md): exact softmax attention from the input values,
// forward and backward. The oracle every error measurement compares against. The scale used is
// the FP32 value the other modes use, taken exactly.
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "cpu_kernels_common.hpp"
#include "stableflash/attention/attention.hpp"

namespace stableflash::attention {
namespace {

double dot(const double* a, const double* b, int n) {
  double s = 0.0;
  for (int d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
}

// Exact softmax of row i over keys [0, last] into p; returns lse.
double row_softmax(const double* qi, const double* k, int last, int dim, double scale, std::vector<double>& p) {
  double mx = -std::numeric_limits<double>::infinity();
  for (int j = 0; j <= last; ++j) mx = std::max(mx, p[j] = dot(qi, k + std::int64_t(j) * dim, dim) * scale);
  double sum = 0.0;
  for (int j = 0; j <= last; ++j) sum += (p[j] = std::exp(p[j] - mx));
  for (int j = 0; j <= last; ++j) p[j] /= sum;
  return mx + std::log(sum);
}

// Head-major FP64 copies of BF16 tensors with any strides.
std::vector<double> widen(const bf16* src, const HeadStrides& st, const AttentionShape& s, int heads, int len) {
  const detail::HeadMajor h(src, st, s.batch, heads, len, s.head_dim);
  return {h.values.begin(), h.values.end()};
}

// Scatters a head-major FP64 tensor into `layout`.
std::vector<double> to_layout(const std::vector<double>& hm, Layout layout, const AttentionShape& s, int heads, int len) {
  if (layout == Layout::bhtd) return hm;
  std::vector<double> out(hm.size());
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < heads; ++h)
      detail::scatter_head(out.data(), HeadStrides::of(layout, heads, len, s.head_dim), s, len, b, h,
                           hm.data() + (std::int64_t(b) * heads + h) * len * s.head_dim, [](double x) { return x; });
  return out;
}

}  // namespace

ReferenceForward reference_forward(const Fp64Inputs& in, const AttentionOptions& opt) {
  opt.validate(in.shape);
  const AttentionShape& s = in.shape;
  const int dim = s.head_dim, tq = s.q_len, tk = s.k_len;
  const double scale = opt.resolved_scale(dim);
  ReferenceForward out;
  out.o.assign(std::size_t(s.q_elements()), 0.0);
  out.lse.assign(std::size_t(s.rows()), std::numeric_limits<double>::infinity());
  const std::int64_t rows = s.rows();
#pragma omp parallel
  {
    std::vector<double> p(tk);
#pragma omp for schedule(dynamic, 16)
    for (std::int64_t row = 0; row < rows; ++row) {
      const std::int64_t head = row / tq;
      const std::int64_t kv_head = head / s.heads * s.resolved_kv_heads() + s.kv_head_of(int(head % s.heads));
      const int i = int(row % tq);
      const int last = last_visible_key(i, tq, tk, opt.causal);
      if (last < 0) continue;
      const double* k = in.k + kv_head * tk * dim;
      const double* v = in.v + kv_head * tk * dim;
      out.lse[row] = row_softmax(in.q + row * dim, k, last, dim, scale, p);
      double* oi = out.o.data() + row * dim;
      for (int j = 0; j <= last; ++j)
        for (int d = 0; d < dim; ++d) oi[d] += p[j] * v[std::int64_t(j) * dim + d];
    }
  }
  return out;
}

ReferenceBackward reference_backward(const Fp64Inputs& in, const AttentionOptions& opt) {
  opt.validate(in.shape);
  const AttentionShape& s = in.shape;
  const int dim = s.head_dim, tq = s.q_len, tk = s.k_len;
  const double scale = opt.resolved_scale(dim);
  ReferenceBackward out;
  out.dq.assign(std::size_t(s.q_elements()), 0.0);
  out.dk.assign(std::size_t(s.k_elements()), 0.0);
  out.dv.assign(std::size_t(s.k_elements()), 0.0);
  out.delta.assign(std::size_t(s.rows()), 0.0);
  std::vector<double> p_all(std::size_t(tq) * tk), ds_all(std::size_t(tq) * tk);
  // One query head's dK, dV; with grouped-query heads they are added into the KV head's in
  // ascending query-head order (the first taken as is).
  std::vector<double> dk_head(std::size_t(tk) * dim), dv_head(std::size_t(tk) * dim);
  const int group = s.group_size();
  for (std::int64_t head = 0; head < std::int64_t(s.batch) * s.heads; ++head) {
    const std::int64_t kv_head = head / group;  // (b * H + h) / group = b * H_kv + h / group
    const bool first_in_group = head % group == 0;
    const double* q = in.q + head * tq * dim;
    const double* k = in.k + kv_head * tk * dim;
    const double* v = in.v + kv_head * tk * dim;
    const double* d_o = in.d_o + head * tq * dim;
    std::fill(p_all.begin(), p_all.end(), 0.0);
    std::fill(ds_all.begin(), ds_all.end(), 0.0);
#pragma omp parallel
    {
      std::vector<double> p(tk), o_row(dim);
#pragma omp for schedule(dynamic, 8)
      for (int i = 0; i < tq; ++i) {
        const int last = last_visible_key(i, tq, tk, opt.causal);
        if (last < 0) continue;
        row_softmax(q + std::int64_t(i) * dim, k, last, dim, scale, p);
        std::fill(o_row.begin(), o_row.end(), 0.0);
        for (int j = 0; j <= last; ++j)
          for (int d = 0; d < dim; ++d) o_row[d] += p[j] * v[std::int64_t(j) * dim + d];
        const double* doi = d_o + std::int64_t(i) * dim;
        const double delta = dot(doi, o_row.data(), dim);
        out.delta[head * tq + i] = delta;
        for (int j = 0; j <= last; ++j) {
          p_all[std::size_t(i) * tk + j] = p[j];
          ds_all[std::size_t(i) * tk + j] = p[j] * (dot(doi, v + std::int64_t(j) * dim, dim) - delta);
        }
      }
    }
#pragma omp parallel for schedule(static)
    for (int i = 0; i < tq; ++i)
      for (int j = 0; j < tk; ++j) {
        const double ds = ds_all[std::size_t(i) * tk + j];
        for (int d = 0; ds != 0.0 && d < dim; ++d) out.dq[(head * tq + i) * dim + d] += scale * ds * k[std::int64_t(j) * dim + d];
      }
    std::fill(dk_head.begin(), dk_head.end(), 0.0);
    std::fill(dv_head.begin(), dv_head.end(), 0.0);
#pragma omp parallel for schedule(static)
    for (int j = 0; j < tk; ++j) {
      for (int i = 0; i < tq; ++i) {
        const double ds = ds_all[std::size_t(i) * tk + j], p = p_all[std::size_t(i) * tk + j];
        for (int d = 0; (p != 0.0 || ds != 0.0) && d < dim; ++d) {
          dk_head[std::size_t(j) * dim + d] += scale * ds * q[std::int64_t(i) * dim + d];
          dv_head[std::size_t(j) * dim + d] += p * d_o[std::int64_t(i) * dim + d];
        }
      }
      double* dk = out.dk.data() + (kv_head * tk + j) * dim;
      double* dv = out.dv.data() + (kv_head * tk + j) * dim;
      for (int d = 0; d < dim; ++d) {
        const double xk = dk_head[std::size_t(j) * dim + d], xv = dv_head[std::size_t(j) * dim + d];
        dk[d] = first_in_group ? xk : dk[d] + xk;
        dv[d] = first_in_group ? xv : dv[d] + xv;
      }
    }
  }
  return out;
}

ReferenceForward reference_forward(const ForwardArgs& a, const AttentionOptions& opt) {
  opt.validate(a.shape);
  if (!a.q || !a.k || !a.v) throw std::invalid_argument("reference_forward: q, k and v are required");
  const AttentionShape& s = a.shape;
  const int kvh = s.resolved_kv_heads();
  const std::vector<double> q = widen(a.q, a.q_strides(), s, s.heads, s.q_len), k = widen(a.k, a.k_strides(), s, kvh, s.k_len),
                            v = widen(a.v, a.v_strides(), s, kvh, s.k_len);
  ReferenceForward r = reference_forward(Fp64Inputs{s, q.data(), k.data(), v.data(), nullptr}, opt);
  r.o = to_layout(r.o, a.layout, s, s.heads, s.q_len);
  return r;
}

ReferenceBackward reference_backward(const BackwardArgs& a, const AttentionOptions& opt) {
  opt.validate(a.shape);
  if (!a.q || !a.k || !a.v || !a.d_o) throw std::invalid_argument("reference_backward: q, k, v and do are required");
  const AttentionShape& s = a.shape;
  const int kvh = s.resolved_kv_heads();
  const std::vector<double> q = widen(a.q, a.q_strides(), s, s.heads, s.q_len), k = widen(a.k, a.k_strides(), s, kvh, s.k_len),
                            v = widen(a.v, a.v_strides(), s, kvh, s.k_len),
                            d_o = widen(a.d_o, a.d_o_strides(), s, s.heads, s.q_len);
  ReferenceBackward r = reference_backward(Fp64Inputs{s, q.data(), k.data(), v.data(), d_o.data()}, opt);
  r.dq = to_layout(r.dq, a.layout, s, s.heads, s.q_len);
  r.dk = to_layout(r.dk, a.layout, s, kvh, s.k_len);
  r.dv = to_layout(r.dv, a.layout, s, kvh, s.k_len);
  return r;
}

}  // namespace stableflash::attention
