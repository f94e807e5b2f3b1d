// A naive BF16 attention (materialized softmax), as an unfused framework computes it under BF16:
// the honest low-precision baseline. Tests bound the flash modes' error by twice this
// implementation's error plus one BF16 rounding step (docs/architecture.md, FlashAttention's habit).
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "cpu_kernels_common.hpp"
#include "stableflash/attention/attention.hpp"

namespace stableflash::attention {
namespace {

using detail::HeadMajor;

// P = BF16(softmax_fp32(BF16(FP32-dot(q, k) * scale))) for row i over keys [0, last].
void naive_probs(const float* qi, const float* k, int last, int dim, float scale, std::vector<float>& p) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int j = 0; j <= last; ++j) {
    p[j] = round_bf16(detail::dot_fp32(qi, k + std::int64_t(j) * dim, dim) * scale);
    mx = std::max(mx, p[j]);
  }
  detail::Fp32Accumulator sum;
  for (int j = 0; j <= last; ++j) sum.add(p[j] = std::exp(p[j] - mx));
  const float total = sum.value();
  for (int j = 0; j <= last; ++j) p[j] = round_bf16(p[j] / total);
}

}  // namespace

void naive_bf16_forward(const ForwardArgs& a, const AttentionOptions& opt) {
  opt.validate(a.shape);
  const AttentionShape& s = a.shape;
  const int dim = s.head_dim;
  const float scale = opt.resolved_scale(dim);
  const HeadMajor q(a.q, a.q_strides(), s.batch, s.heads, s.q_len, dim);
  const HeadMajor k(a.k, a.k_strides(), s.batch, s.resolved_kv_heads(), s.k_len, dim);
  const HeadMajor v(a.v, a.v_strides(), s.batch, s.resolved_kv_heads(), s.k_len, dim);
  const HeadStrides os = a.o_strides();
  const std::int64_t rows = s.rows();
#pragma omp parallel
  {
    std::vector<float> p(s.k_len);
    std::vector<double> acc(dim);
#pragma omp for schedule(dynamic, 16)
    for (std::int64_t row = 0; row < rows; ++row) {
      const int b = int(row / (std::int64_t(s.heads) * s.q_len)), h = int(row / s.q_len % s.heads), i = int(row % s.q_len);
      const int last = last_visible_key(i, s.q_len, s.k_len, opt.causal);
      std::fill(acc.begin(), acc.end(), 0.0);
      if (last >= 0) {
        const int kh = s.kv_head_of(h);
        naive_probs(q.row(b, h, i), k.head(b, kh), last, dim, scale, p);
        for (int j = 0; j <= last; ++j)
          for (int d = 0; d < dim; ++d) acc[d] += double(p[j]) * v.row(b, kh, j)[d];
      }
      for (int d = 0; d < dim; ++d) a.o[os.at(b, h, i) + d] = bf16::from_float(static_cast<float>(acc[d]));
    }
  }
}

void naive_bf16_backward(const BackwardArgs& a, const AttentionOptions& opt) {
  opt.validate(a.shape);
  const AttentionShape& s = a.shape;
  const int dim = s.head_dim, tq = s.q_len, tk = s.k_len;
  const float scale = opt.resolved_scale(dim);
  const HeadMajor q(a.q, a.q_strides(), s.batch, s.heads, tq, dim);
  const int kv_heads = s.resolved_kv_heads(), group = s.group_size();
  const HeadMajor k(a.k, a.k_strides(), s.batch, kv_heads, tk, dim);
  const HeadMajor v(a.v, a.v_strides(), s.batch, kv_heads, tk, dim);
  const HeadMajor d_o(a.d_o, a.d_o_strides(), s.batch, s.heads, tq, dim);
  const HeadStrides dqs = a.dq_strides(), dks = a.dk_strides(), dvs = a.dv_strides();
  std::vector<float> p_all(std::size_t(tq) * tk), ds_all(std::size_t(tq) * tk);
  detail::GroupGradientSum dk_sum(std::size_t(tk) * dim), dv_sum(std::size_t(tk) * dim);
  for (int b = 0; b < s.batch; ++b) {
    for (int kh = 0; kh < kv_heads; ++kh) {
      for (int g = 0; g < group; ++g) {  // ascending query heads of the group
        const int h = kh * group + g;
        std::fill(p_all.begin(), p_all.end(), 0.0f);
        std::fill(ds_all.begin(), ds_all.end(), 0.0f);
#pragma omp parallel
        {
          std::vector<float> p(tk), dp(tk);
#pragma omp for schedule(dynamic, 8)
          for (int i = 0; i < tq; ++i) {
            const int last = last_visible_key(i, tq, tk, opt.causal);
            if (last < 0) continue;
            naive_probs(q.row(b, h, i), k.head(b, kh), last, dim, scale, p);
            // softmax backward from the stored BF16 P and a BF16 dP, as autograd does
            detail::Fp32Accumulator dot;
            for (int j = 0; j <= last; ++j) {
              dp[j] = round_bf16(detail::dot_fp32(d_o.row(b, h, i), v.row(b, kh, j), dim));
              dot.add(double(dp[j]) * p[j]);
            }
            const float sum_dp_p = dot.value();
            for (int j = 0; j <= last; ++j) {
              p_all[std::size_t(i) * tk + j] = p[j];
              ds_all[std::size_t(i) * tk + j] = round_bf16(p[j] * (dp[j] - sum_dp_p) * scale);
            }
          }
        }
#pragma omp parallel for schedule(static)
        for (int i = 0; i < tq; ++i)
          for (int d = 0; d < dim; ++d) {
            double acc = 0.0;
            for (int j = 0; j < tk; ++j) acc += double(ds_all[std::size_t(i) * tk + j]) * k.row(b, kh, j)[d];
            a.dq[dqs.at(b, h, i) + d] = bf16::from_float(static_cast<float>(acc));
          }
#pragma omp parallel for schedule(static)
        for (int j = 0; j < tk; ++j)
          for (int d = 0; d < dim; ++d) {
            double acc_k = 0.0, acc_v = 0.0;
            for (int i = 0; i < tq; ++i) {
              acc_k += double(ds_all[std::size_t(i) * tk + j]) * q.row(b, h, i)[d];
              acc_v += double(p_all[std::size_t(i) * tk + j]) * d_o.row(b, h, i)[d];
            }
            const std::size_t at = std::size_t(j) * dim + d;
            dk_sum.add(at, g == 0, bf16::from_float(static_cast<float>(acc_k)));
            dv_sum.add(at, g == 0, bf16::from_float(static_cast<float>(acc_v)));
          }
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
