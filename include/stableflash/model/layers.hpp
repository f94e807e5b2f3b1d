// The layers of the CPU GPT-2, forward and backward, as templates on the scalar: the model runs
// them in FP32, the finite-difference checks in FP64 (tests/model/layers_gradcheck_test.cpp).
// N = B * T rows. Backward functions ACCUMULATE into every gradient they write (callers zero
// them), which is what residual streams and gradient accumulation need. Every reduction over rows
// runs in a fixed order inside one thread (OpenMP splits rows or channels, never a sum), so the
// results do not depend on the thread count.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "stableflash/model/gemm.hpp"

namespace stableflash::model::layers {

using Index = std::int64_t;

// out[n] = wte[token[n]] + wpe[n % T]; out [N, C], wte [V, C], wpe [>= T, C].
template <class T>
void embedding_forward(T* out, const int* tokens, const T* wte, const T* wpe, int B, int len, int C) {
#pragma omp parallel for schedule(static)
  for (Index n = 0; n < Index(B) * len; ++n) {
    const T* e = wte + Index(tokens[n]) * C;  // ids checked by the caller (no throwing in OpenMP)
    const T* p = wpe + (n % len) * C;
    for (int c = 0; c < C; ++c) out[n * C + c] = e[c] + p[c];
  }
}

template <class T>
void embedding_backward(T* dwte, T* dwpe, const T* dout, const int* tokens, int B, int len, int C) {
  // Parallel over channel blocks so each gradient element is summed over rows n in order.
  constexpr int kBlock = 32;
#pragma omp parallel for schedule(static)
  for (int c0 = 0; c0 < C; c0 += kBlock) {
    const int c1 = std::min(C, c0 + kBlock);
    for (Index n = 0; n < Index(B) * len; ++n) {
      T* e = dwte + Index(tokens[n]) * C;
      T* p = dwpe + (n % len) * C;
      for (int c = c0; c < c1; ++c) {
        e[c] += dout[n * C + c];
        p[c] += dout[n * C + c];
      }
    }
  }
}

// out = (x - mean) * rstd * weight + bias over C features; mean, rstd [N] saved for the backward.
template <class T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* x, const T* weight, const T* bias, Index N, int C, T eps) {
#pragma omp parallel for schedule(static)
  for (Index n = 0; n < N; ++n) {
    const T* xr = x + n * C;
    T m = 0;
    for (int c = 0; c < C; ++c) m += xr[c];
    m /= T(C);
    T var = 0;
    for (int c = 0; c < C; ++c) var += (xr[c] - m) * (xr[c] - m);
    var /= T(C);
    const T s = T(1) / std::sqrt(var + eps);
    for (int c = 0; c < C; ++c) {
      const T y = (xr[c] - m) * s * weight[c];
      out[n * C + c] = bias ? y + bias[c] : y;
    }
    mean[n] = m, rstd[n] = s;
  }
}

template <class T>
void layernorm_backward(T* dx, T* dweight, T* dbias, const T* dout, const T* x, const T* weight, const T* mean, const T* rstd,
                        Index N, int C) {
#pragma omp parallel for schedule(static)
  for (Index n = 0; n < N; ++n) {
    const T* g = dout + n * C;
    const T* xr = x + n * C;
    T mean_dnorm = 0, mean_dnorm_norm = 0;
    for (int c = 0; c < C; ++c) {
      const T dnorm = weight[c] * g[c];
      mean_dnorm += dnorm;
      mean_dnorm_norm += dnorm * (xr[c] - mean[n]) * rstd[n];
    }
    mean_dnorm /= T(C), mean_dnorm_norm /= T(C);
    for (int c = 0; c < C; ++c) {
      const T norm = (xr[c] - mean[n]) * rstd[n];
      dx[n * C + c] += (weight[c] * g[c] - mean_dnorm - norm * mean_dnorm_norm) * rstd[n];
    }
  }
#pragma omp parallel for schedule(static)
  for (int c = 0; c < C; ++c) {
    T dw = 0, db = 0;
    for (Index n = 0; n < N; ++n) {
      dw += (x[n * C + c] - mean[n]) * rstd[n] * dout[n * C + c];
      db += dout[n * C + c];
    }
    dweight[c] += dw;
    if (dbias) dbias[c] += db;
  }
}

// out[N, OC] = x[N, C] * w[C, OC] + bias[OC]. Weights in [in, out] order: the layout of Hugging
// Face's GPT-2 Conv1D, so checkpoints are copies, and the GEMM streams w's rows.
template <class T>
void linear_forward(T* out, const T* x, const T* w, const T* bias, Index N, int C, int OC) {
  gemm<T>(Trans::no, Trans::no, int(N), OC, C, x, C, w, OC, out, OC, /*accumulate=*/false);
  if (!bias) return;
#pragma omp parallel for schedule(static)
  for (Index n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) out[n * OC + o] += bias[o];
}

template <class T>
void linear_backward(T* dx, T* dw, T* dbias, const T* dout, const T* x, const T* w, Index N, int C, int OC) {
  gemm<T>(Trans::no, Trans::yes, int(N), C, OC, dout, OC, w, OC, dx, C, /*accumulate=*/true);   // dx += dout w^T
  gemm<T>(Trans::yes, Trans::no, C, OC, int(N), x, C, dout, OC, dw, OC, /*accumulate=*/true);   // dw += x^T dout
  if (!dbias) return;
#pragma omp parallel for schedule(static)
  for (int o = 0; o < OC; ++o) {
    T s = 0;
    for (Index n = 0; n < N; ++n) s += dout[n * OC + o];
    dbias[o] += s;
  }
}

// GELU with the tanh approximation (GPT-2's "gelu_new").
template <class T>
constexpr T kGeluScale = T(0.7978845608028654);  // sqrt(2 / pi)

template <class T>
void gelu_forward(T* out, const T* x, Index n) {
#pragma omp parallel for schedule(static)
  for (Index i = 0; i < n; ++i) {
    const T v = x[i];
    out[i] = T(0.5) * v * (T(1) + std::tanh(kGeluScale<T> * (v + T(0.044715) * v * v * v)));
  }
}

template <class T>
void gelu_backward(T* dx, const T* x, const T* dout, Index n) {
#pragma omp parallel for schedule(static)
  for (Index i = 0; i < n; ++i) {
    const T v = x[i];
    const T u = kGeluScale<T> * (v + T(0.044715) * v * v * v);
    const T th = std::tanh(u);
    const T sech2 = T(1) - th * th;
    const T local = T(0.5) * (T(1) + th) + T(0.5) * v * sech2 * kGeluScale<T> * (T(1) + T(3 * 0.044715) * v * v);
    dx[i] += local * dout[i];
  }
}

// logits [N, V] are replaced by softmax probabilities; losses[n] = -log p[n][target[n]].
// Returns the mean loss (summed in row order).
template <class T>
T softmax_cross_entropy_forward(T* logits, T* losses, const int* targets, Index N, int V) {
#pragma omp parallel for schedule(static)
  for (Index n = 0; n < N; ++n) {
    T* row = logits + n * V;
    T max = row[0];
    for (int v = 1; v < V; ++v) max = std::max(max, row[v]);
    const T shifted_target = row[targets[n]] - max;  // ids checked by the caller
    T sum = 0;
    for (int v = 0; v < V; ++v) sum += (row[v] = std::exp(row[v] - max));
    const T inv = T(1) / sum;
    // -log p_t from the shifted logit: no log of an exp that may have underflowed.
    losses[n] = std::log(sum) - shifted_target;
    for (int v = 0; v < V; ++v) row[v] *= inv;
  }
  T total = 0;
  for (Index n = 0; n < N; ++n) total += losses[n];
  return total / T(N);
}

// probs [N, V] become d(scale * mean loss)/d logits = scale * (p - onehot) / N, in place.
template <class T>
void softmax_cross_entropy_backward(T* probs, const int* targets, Index N, int V, T scale) {
  const T s = scale / T(N);
#pragma omp parallel for schedule(static)
  for (Index n = 0; n < N; ++n) {
    T* row = probs + n * V;
    row[targets[n]] -= T(1);
    for (int v = 0; v < V; ++v) row[v] *= s;
  }
}

}  // namespace stableflash::model::layers
