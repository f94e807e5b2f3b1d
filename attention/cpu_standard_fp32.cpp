// Standard attention with a materialized softmax, in the scalar type it is instantiated for
// (FP32 in training, FP64 for finite-difference checks). Every reduction runs in a fixed order
// inside one (b, h) head, and heads are split across OpenMP threads, so results do not depend on
// the thread count (resume and replay are bit exact).
#include "stableflash/attention/standard_fp32.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

namespace stableflash::attention {
namespace {

template <class T>
void check(const StandardAttentionArgs<T>& a) {
  if (a.batch < 1 || a.heads < 1 || a.len < 1 || a.head_dim < 1)
    throw std::invalid_argument("standard attention: batch, heads, len and head_dim must be >= 1");
  if (a.row_stride < std::int64_t(a.heads) * a.head_dim)
    throw std::invalid_argument("standard attention: row_stride is smaller than heads * head_dim");
  if (!a.q || !a.k || !a.v || !a.o || !a.probs) throw std::invalid_argument("standard attention: a tensor pointer is null");
}

template <class T>
std::int64_t in_offset(const StandardAttentionArgs<T>& a, int b, int t, int h) {
  return (std::int64_t(b) * a.len + t) * a.row_stride + std::int64_t(h) * a.head_dim;
}

template <class T>
std::int64_t out_offset(const StandardAttentionArgs<T>& a, int b, int t, int h) {
  return ((std::int64_t(b) * a.len + t) * a.heads + h) * a.head_dim;
}

}  // namespace

template <class T>
void standard_attention_forward(const StandardAttentionArgs<T>& a) {
  check(a);
  const int L = a.len, D = a.head_dim;
  const T scale = T(1) / std::sqrt(T(D));
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < a.batch; ++b)
    for (int h = 0; h < a.heads; ++h) {
      T* probs = a.probs + (std::int64_t(b) * a.heads + h) * L * L;  // [T, T] of this head
      for (int i = 0; i < L; ++i) {
        const T* q = a.q + in_offset(a, b, i, h);
        T* p = probs + std::int64_t(i) * L;
        const int last = a.causal ? i : L - 1;
        T max = -std::numeric_limits<T>::infinity();
        for (int j = 0; j <= last; ++j) {
          const T* k = a.k + in_offset(a, b, j, h);
          T s = 0;
          for (int d = 0; d < D; ++d) s += q[d] * k[d];
          p[j] = s * scale;
          max = std::max(max, p[j]);
        }
        T sum = 0;
        for (int j = 0; j <= last; ++j) sum += (p[j] = std::exp(p[j] - max));
        const T inv = T(1) / sum;
        for (int j = 0; j <= last; ++j) p[j] *= inv;
        for (int j = last + 1; j < L; ++j) p[j] = 0;
        T* o = a.o + out_offset(a, b, i, h);  // [D]
        std::fill(o, o + D, T(0));
        for (int j = 0; j <= last; ++j) {
          const T* v = a.v + in_offset(a, b, j, h);
          for (int d = 0; d < D; ++d) o[d] += p[j] * v[d];
        }
      }
    }
}

template <class T>
void standard_attention_backward(const StandardAttentionArgs<T>& a, const T* d_o, T* dq, T* dk, T* dv) {
  check(a);
  const int L = a.len, D = a.head_dim;
  const T scale = T(1) / std::sqrt(T(D));
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < a.batch; ++b)
    for (int h = 0; h < a.heads; ++h) {
      const T* probs = a.probs + (std::int64_t(b) * a.heads + h) * L * L;
      for (int t = 0; t < L; ++t) {
        std::fill_n(dq + in_offset(a, b, t, h), D, T(0));
        std::fill_n(dk + in_offset(a, b, t, h), D, T(0));
        std::fill_n(dv + in_offset(a, b, t, h), D, T(0));
      }
      std::vector<T> dp(L);  // [T] dP of one query row
      for (int i = 0; i < L; ++i) {
        const T* p = probs + std::int64_t(i) * L;
        const T* g = d_o + out_offset(a, b, i, h);
        const int last = a.causal ? i : L - 1;
        // dP = dO v^T, dV += P^T dO, and the softmax backward dS = P * (dP - sum(P * dP)).
        T p_dot_dp = 0;
        for (int j = 0; j <= last; ++j) {
          const T* v = a.v + in_offset(a, b, j, h);
          T* dvj = dv + in_offset(a, b, j, h);
          T s = 0;
          for (int d = 0; d < D; ++d) {
            s += g[d] * v[d];
            dvj[d] += p[j] * g[d];
          }
          dp[j] = s;
          p_dot_dp += p[j] * s;
        }
        const T* q = a.q + in_offset(a, b, i, h);
        T* dqi = dq + in_offset(a, b, i, h);
        for (int j = 0; j <= last; ++j) {
          const T ds = p[j] * (dp[j] - p_dot_dp) * scale;
          const T* k = a.k + in_offset(a, b, j, h);
          T* dkj = dk + in_offset(a, b, j, h);
          for (int d = 0; d < D; ++d) {
            dqi[d] += ds * k[d];
            dkj[d] += ds * q[d];
          }
        }
      }
    }
}

template void standard_attention_forward<float>(const StandardAttentionArgs<float>&);
template void standard_attention_forward<double>(const StandardAttentionArgs<double>&);
template void standard_attention_backward<float>(const StandardAttentionArgs<float>&, const float*, float*, float*, float*);
template void standard_attention_backward<double>(const StandardAttentionArgs<double>&, const double*, double*, double*, double*);

}  // namespace stableflash::attention
