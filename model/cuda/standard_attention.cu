// Standard (materialized-softmax) causal attention on the GPU in FP32: the twin of
// attention/cpu_standard_fp32.cpp. The four products per direction are FP32 GEMMs through Blas;
// only the row-wise softmax and its backward are kernels here.
//
// Layout: q, k, v, o (and their gradients) are [B, T, H, D], so for one batch entry b the H heads
// are H matrices [T, D] with leading dimension H * D that start D elements apart: one strided
// batched GEMM per b covers every head. probs and d_probs are [B, H, T, T], contiguous per head.
// The GEMMs compute full T x T score matrices; the causal mask is applied by the row kernels,
// which write exact zeros above the diagonal, so the following products (P V, P^T dO, dS K,
// dS^T Q) see no contribution from masked keys.
//
// Determinism: one warp owns one row; each lane reduces a fixed, strided set of columns in order
// and the lanes combine through a fixed butterfly, so a row's max and sums never depend on
// scheduling. The GEMMs are reproducible by Blas's contract.
#include "stableflash/model/cuda/standard_attention.hpp"

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "stableflash/model/cuda/device_array.hpp"

namespace stableflash::model::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kRowsPerBlock = 4;  // warps per block, one row each

__device__ float warp_max(float x) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

// Butterfly sum: every lane ends with the same value, combined in the same order on every run.
__device__ float warp_sum(float x) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// probs: [rows, len] scores scaled by 1/sqrt(D), rows = B * H * T; row r is query i = r % len.
// In place: p[j] = exp(s[j] - max) / sum over j <= i, and p[j] = 0 for j > i.
__global__ void causal_softmax_kernel(float* probs, std::int64_t rows, int len) {
  const std::int64_t row = std::int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (row >= rows) return;  // whole warp leaves together: the shuffles below stay full-warp
  const int lane = threadIdx.x % kWarp;
  const int last = int(row % len);  // causal: keys 0..last
  float* p = probs + row * len;      // [T]

  float max = -INFINITY;
  for (int j = lane; j <= last; j += kWarp) max = fmaxf(max, p[j]);
  max = warp_max(max);  // finite: key j = i is always present

  float sum = 0.0f;
  for (int j = lane; j <= last; j += kWarp) {
    const float e = expf(p[j] - max);
    p[j] = e;  // each lane re-reads only its own columns below, so no barrier is needed
    sum += e;
  }
  const float inv = 1.0f / warp_sum(sum);  // sum >= 1 (the max term is exp(0))

  for (int j = lane; j < len; j += kWarp) p[j] = j <= last ? p[j] * inv : 0.0f;
}

// p: [rows, len] probabilities; dp: [rows, len] dP = dO V^T, overwritten in place with
// dS = P * (dP - sum_j P * dP) * scale for j <= i and 0 above the diagonal.
__global__ void causal_softmax_backward_kernel(const float* probs, float* dp, std::int64_t rows, int len, float scale) {
  const std::int64_t row = std::int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (row >= rows) return;
  const int lane = threadIdx.x % kWarp;
  const int last = int(row % len);
  const float* p = probs + row * len;  // [T]
  float* g = dp + row * len;           // [T]

  float dot = 0.0f;
  for (int j = lane; j <= last; j += kWarp) dot += p[j] * g[j];
  dot = warp_sum(dot);

  for (int j = lane; j < len; j += kWarp) g[j] = j <= last ? p[j] * (g[j] - dot) * scale : 0.0f;
}

void check_shape(const StandardAttentionShape& s) {
  if (s.batch < 1 || s.heads < 1 || s.len < 1 || s.head_dim < 1)
    throw std::invalid_argument("standard attention (cuda): batch, heads, len and head_dim must be >= 1");
  if (s.qkv_token_stride != 0 && s.qkv_token_stride < std::int64_t(s.heads) * s.head_dim)
    throw std::invalid_argument("standard attention (cuda): qkv_token_stride " + std::to_string(s.qkv_token_stride) +
                                " < heads * head_dim = " + std::to_string(std::int64_t(s.heads) * s.head_dim));
}

// The views of one batch entry b, every head at once (batch = H in the GEMM options).
struct HeadViews {
  const StandardAttentionShape& s;

  std::int64_t packed_stride() const { return std::int64_t(s.heads) * s.head_dim; }
  std::int64_t qkv_stride() const { return s.qkv_token_stride ? s.qkv_token_stride : packed_stride(); }
  // [T, D] per head of a [B, T, H, D] tensor whose tokens are `stride` elements apart.
  MatrixView tokens(const float* base, int b, std::int64_t stride) const {
    return f32_matrix(base + std::int64_t(b) * s.len * stride, s.len, s.head_dim, stride, /*batch_stride=*/s.head_dim);
  }
  MatrixView qkv(const float* base, int b) const { return tokens(base, b, qkv_stride()); }  // q, k, v, dq, dk, dv
  MatrixView out(const float* base, int b) const { return tokens(base, b, packed_stride()); }  // o, d_o
  // [T, T] per head of a [B, H, T, T] tensor.
  MatrixView scores(const float* base, int b) const {
    const std::int64_t square = std::int64_t(s.len) * s.len;
    return f32_matrix(base + std::int64_t(b) * s.heads * square, s.len, s.len, s.len, /*batch_stride=*/square);
  }
};

// Launches a row kernel over all B * H * T rows.
dim3 row_grid(const StandardAttentionShape& s) {
  const std::int64_t rows = std::int64_t(s.batch) * s.heads * s.len;
  return dim3(unsigned((rows + kRowsPerBlock - 1) / kRowsPerBlock));
}

// Computed as the FP32 CPU twin computes it (1 / sqrtf(D), two roundings), so both use the same scale.
float softmax_scale(const StandardAttentionShape& s) { return 1.0f / std::sqrt(float(s.head_dim)); }

}  // namespace

void standard_attention_forward(Blas& blas, const StandardAttentionShape& shape, const float* q, const float* k,
                                const float* v, float* probs, float* o) {
  check_shape(shape);
  const HeadViews views{shape};
  const GemmOptions scores_opts{.alpha = softmax_scale(shape), .beta = 0.0f, .batch = shape.heads};
  const GemmOptions plain{.alpha = 1.0f, .beta = 0.0f, .batch = shape.heads};

  // S = scale * Q K^T: [T, D] x [D, T] -> [T, T] per head.
  for (int b = 0; b < shape.batch; ++b)
    blas.gemm(Trans::no, Trans::yes, views.qkv(q, b), views.qkv(k, b), views.scores(probs, b), scores_opts);

  const std::int64_t rows = std::int64_t(shape.batch) * shape.heads * shape.len;
  causal_softmax_kernel<<<row_grid(shape), kRowsPerBlock * kWarp, 0, blas.stream()>>>(probs, rows, shape.len);
  check_cuda(cudaGetLastError(), "causal_softmax_kernel launch");

  // O = P V: [T, T] x [T, D] -> [T, D] per head.
  for (int b = 0; b < shape.batch; ++b)
    blas.gemm(Trans::no, Trans::no, views.scores(probs, b), views.qkv(v, b), views.out(o, b), plain);
}

void standard_attention_backward(Blas& blas, const StandardAttentionShape& shape, const float* q, const float* k,
                                 const float* v, const float* probs, const float* d_o, float* d_probs, float* dq,
                                 float* dk, float* dv) {
  check_shape(shape);
  const HeadViews views{shape};
  const GemmOptions plain{.alpha = 1.0f, .beta = 0.0f, .batch = shape.heads};

  for (int b = 0; b < shape.batch; ++b) {
    // dV = P^T dO: [T, T]^T x [T, D] -> [T, D].
    blas.gemm(Trans::yes, Trans::no, views.scores(probs, b), views.out(d_o, b), views.qkv(dv, b), plain);
    // dP = dO V^T: [T, D] x [D, T] -> [T, T].
    blas.gemm(Trans::no, Trans::yes, views.out(d_o, b), views.qkv(v, b), views.scores(d_probs, b), plain);
  }

  const std::int64_t rows = std::int64_t(shape.batch) * shape.heads * shape.len;
  causal_softmax_backward_kernel<<<row_grid(shape), kRowsPerBlock * kWarp, 0, blas.stream()>>>(probs, d_probs, rows, shape.len,
                                                                                              softmax_scale(shape));
  check_cuda(cudaGetLastError(), "causal_softmax_backward_kernel launch");

  for (int b = 0; b < shape.batch; ++b) {
    // dQ = dS K: [T, T] x [T, D] -> [T, D].
    blas.gemm(Trans::no, Trans::no, views.scores(d_probs, b), views.qkv(k, b), views.qkv(dq, b), plain);
    // dK = dS^T Q: [T, T]^T x [T, D] -> [T, D].
    blas.gemm(Trans::yes, Trans::no, views.scores(d_probs, b), views.qkv(q, b), views.qkv(dk, b), plain);
  }
}

}  // namespace stableflash::model::cuda
