// CPU attention backward in `paper` and `fused` numerics (docs/numerics-contract.md), and the delta it uses.
// Per head: every query row recomputes its scores and P = exp(S - lse), takes delta from the
// configured source, and materializes BF16(P) and BF16(dS) (the operands of the gradient
// products); dQ is then summed per query row and dK, dV per key, each in an emulated FP32
// accumulator and rounded once. With grouped-query heads, the dK, dV of a KV head are its query
// heads' BF16 dK, dV summed in FP32 in ascending head order, then rounded to BF16 (the result of
// multi-head attention on repeated K/V, summed per group). Nothing depends on the thread count.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "cpu_kernels_common.hpp"
#include "stableflash/attention/attention.hpp"
#include "stableflash/attention/cuda.hpp"
#include "stableflash/attention/rounding_points.hpp"

namespace stableflash::attention {
namespace {

using detail::HeadMajor;

struct HeadTensors {
  const float *q, *k, *v, *o, *residual, *d_o;  // head-major [T, D] blocks; residual may be null
  const float* lse;                             // [Tq]
};

// Scores, probabilities and dP of one query row over its visible keys [0, last].
struct RowTerms {
  std::vector<float> p, dp;
  explicit RowTerms(int k_len) : p(k_len), dp(k_len) {}
};

void compute_row_terms(const AttentionOptions& opt, const HeadTensors& t, int i, int last, int dim, float scale,
                       RowTerms& r) {
  const bool paper_mode = opt.numerics == Numerics::paper;
  const float* qi = t.q + std::int64_t(i) * dim;
  const float* doi = t.d_o + std::int64_t(i) * dim;
  for (int j = 0; j <= last; ++j) {
    const float dot = detail::dot_fp32(qi, t.k + std::int64_t(j) * dim, dim);
    const float s = paper_mode ? paper::score(dot, scale) : fused::score(dot, scale);
    r.p[j] = paper_mode ? paper::prob(s, t.lse[i]) : fused::prob(s, t.lse[i]);
    const float dpv = detail::dot_fp32(doi, t.v + std::int64_t(j) * dim, dim);
    r.dp[j] = paper_mode ? paper::dprob(dpv) : dpv;
  }
}

// delta of row i per the configured source. `r` must hold the row's terms for `exact`.
float row_delta(const AttentionOptions& opt, const HeadTensors& t, int i, int last, int dim, const RowTerms& r) {
  const float* oi = t.o + std::int64_t(i) * dim;
  const float* doi = t.d_o + std::int64_t(i) * dim;
  detail::Fp32Accumulator acc;
  switch (opt.delta_source) {
    case DeltaSource::rounded:
      for (int d = 0; d < dim; ++d) acc.add(double(doi[d]) * oi[d]);
      return opt.numerics == Numerics::paper ? paper::delta(acc.value()) : acc.value();
    case DeltaSource::compensated: {
      const float* ri = t.residual + std::int64_t(i) * dim;
      for (int d = 0; d < dim; ++d) acc.add(double(doi[d]) * add_rn(oi[d], ri[d]));
      return acc.value();
    }
    case DeltaSource::exact:
      for (int j = 0; j <= last; ++j) acc.add(double(r.dp[j]) * r.p[j]);
      return acc.value();
    case DeltaSource::automatic:  // resolved on entry (AttentionOptions::for_shape)
      break;
  }
  return acc.value();
}

bool needs_terms_for_delta(const AttentionOptions& opt) { return opt.delta_source == DeltaSource::exact; }

struct Inputs {
  HeadMajor q, k, v, o, d_o;
  std::vector<float> residual;  // head-major, empty unless compensated
  Inputs(const BackwardArgs& a)
      : q(a.q, a.q_strides(), a.shape.batch, a.shape.heads, a.shape.q_len, a.shape.head_dim),
        k(a.k, a.k_strides(), a.shape.batch, a.shape.resolved_kv_heads(), a.shape.k_len, a.shape.head_dim),
        v(a.v, a.v_strides(), a.shape.batch, a.shape.resolved_kv_heads(), a.shape.k_len, a.shape.head_dim),
        o(a.o, a.o_strides(), a.shape.batch, a.shape.heads, a.shape.q_len, a.shape.head_dim),
        d_o(a.d_o, a.d_o_strides(), a.shape.batch, a.shape.heads, a.shape.q_len, a.shape.head_dim) {
    if (a.o_residual)  // o's strides
      residual = HeadMajor(a.o_residual, a.o_strides(), a.shape.batch, a.shape.heads, a.shape.q_len, a.shape.head_dim).values;
  }
  HeadTensors head(const BackwardArgs& a, int b, int h) const {
    const std::int64_t row0 = (std::int64_t(b) * a.shape.heads + h) * a.shape.q_len;
    const int kh = a.shape.kv_head_of(h);
    return {q.head(b, h), k.head(b, kh),   v.head(b, kh), o.head(b, h),
            residual.empty() ? nullptr : residual.data() + row0 * a.shape.head_dim,
            d_o.head(b, h), a.lse + row0};
  }
};

void check_backward_args(const BackwardArgs& a, const AttentionOptions& opt) {
  opt.validate(a.shape);
  if (opt.numerics == Numerics::reference)
    throw std::invalid_argument("numerics: 'reference' has FP64 outputs; call reference_backward()");
  if (!a.q || !a.k || !a.v || !a.o || !a.lse || !a.d_o)
    throw std::invalid_argument("attention_backward: q, k, v, o, lse and do are required");
  opt.require_residual(a.shape, a.o_residual != nullptr, "the forward's o_residual");
}

// Sums rows of `weights` [rows, cols] (only the first `count(r)` entries of row r are nonzero)
// against `values` [rows, D] into out[c] for each column c: out[c] = sum_r w[r][c] * values[r].
// Used for dK = dS^T Q and dV = P^T dO. FP64 sums emulate the FP32 accumulator.
template <class Store>
void column_products(const std::vector<float>& weights, int rows, int cols, const float* values, int dim, Store store) {
#pragma omp parallel for schedule(static)
  for (int c = 0; c < cols; ++c) {
    std::vector<double> acc(dim, 0.0);
    for (int r = 0; r < rows; ++r) {
      const double w = weights[std::size_t(r) * cols + c];
      if (w == 0.0) continue;
      const float* x = values + std::int64_t(r) * dim;
      for (int d = 0; d < dim; ++d) acc[d] += w * x[d];
    }
    store(c, acc);
  }
}

}  // namespace

void attention_delta(const BackwardArgs& a, const AttentionOptions& options, float* delta) {
  if (options.device == Device::cuda) return cuda::delta(a, options, delta);
  const AttentionOptions opt = options.for_shape(a.shape);
  check_backward_args(a, opt);
  const AttentionShape& s = a.shape;
  const int dim = s.head_dim;
  const float scale = opt.resolved_scale(dim);
  const Inputs in(a);
  const std::int64_t rows = s.rows();
#pragma omp parallel
  {
    RowTerms terms(s.k_len);
#pragma omp for schedule(dynamic, 16)
    for (std::int64_t row = 0; row < rows; ++row) {
      const int b = int(row / (std::int64_t(s.heads) * s.q_len)), h = int(row / s.q_len % s.heads), i = int(row % s.q_len);
      const int last = last_visible_key(i, s.q_len, s.k_len, opt.causal);
      if (last < 0) {
        delta[row] = 0.0f;
        continue;
      }
      const HeadTensors t = in.head(a, b, h);
      if (needs_terms_for_delta(opt)) compute_row_terms(opt, t, i, last, dim, scale, terms);
      delta[row] = row_delta(opt, t, i, last, dim, terms);
    }
  }
}

void attention_backward(const BackwardArgs& a, const AttentionOptions& options) {
  if (options.device == Device::cuda) return cuda::backward(a, options);
  const AttentionOptions opt = options.for_shape(a.shape);
  check_backward_args(a, opt);
  if (!a.dq || !a.dk || !a.dv) throw std::invalid_argument("attention_backward: dq, dk and dv outputs are required");
  const AttentionShape& s = a.shape;
  const int dim = s.head_dim, tq = s.q_len, tk = s.k_len;
  const float scale = opt.resolved_scale(dim);
  const bool paper_mode = opt.numerics == Numerics::paper;
  const Inputs in(a);
  const int kv_heads = s.resolved_kv_heads(), group = s.group_size();
  const HeadStrides dqs = a.dq_strides(), dks = a.dk_strides(), dvs = a.dv_strides();
  // BF16(P) and BF16(dS) of one head, [Tq, Tk]; masked entries stay 0.
  std::vector<float> p_op(std::size_t(tq) * tk), ds_op(std::size_t(tq) * tk);
  // paper: dS already carries the scale; fused: the scale multiplies the FP32 products.
  const double product_scale = paper_mode ? 1.0 : scale;
  auto round_grad = [&](double acc) { return bf16::from_float(mul_rn(static_cast<float>(acc), float(product_scale))); };
  // dK, dV of the current KV head: its query heads' BF16 gradients summed in ascending head order.
  detail::GroupGradientSum dk_sum(std::size_t(tk) * dim), dv_sum(std::size_t(tk) * dim);

  for (int b = 0; b < s.batch; ++b) {
    for (int kh = 0; kh < kv_heads; ++kh) {
      for (int g = 0; g < group; ++g) {
        const int h = kh * group + g;
        const HeadTensors t = in.head(a, b, h);
        std::fill(p_op.begin(), p_op.end(), 0.0f);
        std::fill(ds_op.begin(), ds_op.end(), 0.0f);
#pragma omp parallel
        {
          RowTerms terms(tk);
#pragma omp for schedule(dynamic, 8)
          for (int i = 0; i < tq; ++i) {
            const int last = last_visible_key(i, tq, tk, opt.causal);
            const std::int64_t row = (std::int64_t(b) * s.heads + h) * tq + i;
            if (last < 0) {
              if (a.delta) a.delta[row] = 0.0f;
              continue;
            }
            compute_row_terms(opt, t, i, last, dim, scale, terms);
            const float delta = row_delta(opt, t, i, last, dim, terms);
            if (a.delta) a.delta[row] = delta;
            float* p_row = p_op.data() + std::size_t(i) * tk;
            float* ds_row = ds_op.data() + std::size_t(i) * tk;
            for (int j = 0; j <= last; ++j) {
              const float ds = paper_mode ? paper::dscore(terms.p[j], terms.dp[j], delta, scale)
                                          : fused::dscore(terms.p[j], terms.dp[j], delta);
              p_row[j] = round_bf16(terms.p[j]);
              ds_row[j] = round_bf16(ds);
            }
          }
        }
        // dQ[i] = sum_j BF16(dS[i][j]) k[j]
#pragma omp parallel for schedule(static)
        for (int i = 0; i < tq; ++i) {
          std::vector<double> acc(dim, 0.0);
          const float* ds_row = ds_op.data() + std::size_t(i) * tk;
          for (int j = 0; j < tk; ++j) {
            if (ds_row[j] == 0.0f) continue;
            const float* kj = t.k + std::int64_t(j) * dim;
            for (int d = 0; d < dim; ++d) acc[d] += double(ds_row[j]) * kj[d];
          }
          for (int d = 0; d < dim; ++d) a.dq[dqs.at(b, h, i) + d] = round_grad(acc[d]);
        }
        column_products(ds_op, tq, tk, t.q, dim, [&](int j, const std::vector<double>& acc) {
          for (int d = 0; d < dim; ++d) dk_sum.add(std::size_t(j) * dim + d, g == 0, round_grad(acc[d]));
        });
        column_products(p_op, tq, tk, t.d_o, dim, [&](int j, const std::vector<double>& acc) {
          for (int d = 0; d < dim; ++d) dv_sum.add(std::size_t(j) * dim + d, g == 0, bf16::from_float(static_cast<float>(acc[d])));
        });
      }
      for (int j = 0; j < tk; ++j)
        for (int d = 0; d < dim; ++d) {
          a.dk[dks.at(b, kh, j) + d] = bf16::from_float(dk_sum.sum[std::size_t(j) * dim + d]);
          a.dv[dvs.at(b, kh, j) + d] = bf16::from_float(dv_sum.sum[std::size_t(j) * dim + d]);
        }
    }
  }
}

}  // namespace stableflash::attention
