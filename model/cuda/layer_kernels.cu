// Element-wise and row-wise layers of the CUDA GPT-2: embeddings, LayerNorm, GELU, casts and bias
// gradients (softmax cross-entropy and sum_scaled live in classifier_kernels.cu). The math follows
// the CPU twins in stableflash/model/layers.hpp; precision and determinism rules are in
// stableflash/model/cuda/layer_kernels.hpp.
//
// Row kernels take a warp per row and walk the row in chunks of kVec elements with 16-byte
// accesses when C % kVec == 0 and every pointer is 16-byte aligned, else one element at a time.
// Sums over rows go through per-partition partial sums (fixed 64-row partitions: written by
// column_partials_kernel, or by layernorm_backward_kernel as a by-product of its rows) and
// column_finish_kernel (partitions summed in a fixed order): no floating-point atomics.
#include "stableflash/model/cuda/layer_kernels.hpp"

#include <algorithm>
#include <initializer_list>

#include "reduce.cuh"
#include "stableflash/model/cuda/device_array.hpp"

namespace stableflash::model::cuda {
namespace {

using detail::aligned16;
using detail::kVec;
using detail::load;
using detail::store;
using detail::warp_sum;

constexpr int kThreads = 256;      // element-wise kernels
constexpr int kRowsPerBlock = 4;   // row kernels: blockDim (32, kRowsPerBlock), a warp per row
constexpr int kPartRows = 64;      // rows per deterministic partial sum; fixed, so bits do not depend on the device
constexpr int kColTile = 32;       // columns per column_partials block (one coalesced warp-wide row segment)
constexpr int kColRowLanes = 8;    // row lanes per column_partials / column_finish block
constexpr int kLnWarps = 4;        // layernorm_backward_kernel: warps per block (one block per 64-row partition)
constexpr int kLnMaxVecChunks = 4; // ... register-resident rows up to C = 4 * 32 * kVec (vector path)
constexpr int kLnMaxScalarChunks = 24;  // ... and up to C = 24 * 32 (scalar path); wider rows take the two-kernel path

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }
int reduction_parts(int N) { return int(ceil_div(N, kPartRows)); }

// True when every non-null pointer allows 16-byte accesses and rows of C elements keep them aligned.
bool vector_ok(int C, std::initializer_list<const void*> ptrs) {
  if (C % kVec != 0) return false;
  for (const void* p : ptrs)
    if (p && !aligned16(p)) return false;
  return true;
}

unsigned row_blocks(int N) { return unsigned(ceil_div(N, kRowsPerBlock)); }

// ---------------------------------------------------------------------------------------------
// Embeddings

template <int W>
__global__ void encoder_forward_kernel(float* x, const int* tokens, const float* wte, const float* wpe, int T, int C,
                                       std::int64_t chunks) {
  const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= chunks) return;
  const int per_row = C / W;
  const std::int64_t n = i / per_row;
  const int c = int(i % per_row) * W;
  float e[W], p[W];
  load<W>(e, wte + std::int64_t(tokens[n]) * C + c);  // [Vp, C]; ids checked by the caller
  load<W>(p, wpe + (n % T) * C + c);                  // [>= T, C]
#pragma unroll
  for (int k = 0; k < W; ++k) e[k] += p[k];
  store<W>(x + n * C + c, e);  // [N, C]
}

// dwpe[t, c] += sum over b ascending of dx[b * T + t, c]; a thread per (t, c), coalesced over c.
__global__ void encoder_backward_wpe_kernel(float* dwpe, const float* dx, int B, int T, int C) {
  const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= std::int64_t(T) * C) return;
  float s = 0.0f;
  for (int b = 0; b < B; ++b) s += dx[std::int64_t(b) * T * C + i];  // row b * T + t, column c: offset i
  dwpe[i] += s;
}

// The sum of dx[row, c] over the rows of token group u, in the group's order: the one loop both
// the dense wte update and the split embedding's rows run, so the two give the same bits.
__device__ __forceinline__ float token_group_sum(const float* dx, const int* token_offsets, const int* token_rows, int u, int c,
                                                 int C) {
  float s = 0.0f;
  for (int k = token_offsets[u]; k < token_offsets[u + 1]; ++k) s += dx[std::int64_t(token_rows[k]) * C + c];
  return s;
}

// dwte[token_ids[u], c] += sum over the rows of group u in order; one (u, c) per thread and grid
// stride. Groups hold distinct tokens, so no two threads write the same element. The group count
// is read from device memory, not passed as a launch parameter: a step replayed from a CUDA graph
// keeps its launch parameters, while its batch (and so its count) changes every step.
__global__ void encoder_backward_wte_kernel(float* dwte, const float* dx, const int* token_ids, const int* token_offsets,
                                            const int* token_rows, const int* distinct, int C) {
  const std::int64_t n = std::int64_t(*distinct) * C;
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int u = int(i / C), c = int(i % C);
    dwte[std::int64_t(token_ids[u]) * C + c] += token_group_sum(dx, token_offsets, token_rows, u, c, C);
  }
}

// rows[u, c] = the sum encoder_backward_wte_kernel adds.
__global__ void embedding_rows_backward_kernel(float* rows, const float* dx, const int* token_offsets, const int* token_rows,
                                               int distinct, int C) {
  const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= std::int64_t(distinct) * C) return;
  const int u = int(i / C), c = int(i % C);
  rows[i] = token_group_sum(dx, token_offsets, token_rows, u, c, C);
}

// dwte[ids[u], c] += rows[u, c]; distinct ids, so no two threads write the same element.
__global__ void add_embedding_rows_kernel(float* dwte, const float* rows, const int* ids, int count, int C) {
  const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= std::int64_t(count) * C) return;
  const int u = int(i / C), c = int(i % C);
  dwte[std::int64_t(ids[u]) * C + c] += rows[i];
}

// ---------------------------------------------------------------------------------------------
// LayerNorm

// No __restrict__: residual_out may alias residual_in (an in-place residual update). Each lane
// reads back only elements it wrote itself, so the re-reads of residual_out need no barrier.
template <int W>
__global__ void layernorm_forward_kernel(bf16_t* ln_out, float* mean, float* rstd, float* residual_out,
                                         const float* residual_in, const bf16_t* branch, const float* weight,
                                         const float* bias, int N, int C, float eps) {
  const int lane = threadIdx.x;
  const std::int64_t n = std::int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  if (n >= N) return;  // whole warps exit together: warp_sum below sees full warps
  const std::int64_t row = n * C;
  const float* r_src = branch ? residual_out + row : residual_in + row;  // [C] the LayerNorm input r

  // Pass 1: r (with the fused residual add, written once) and its sum.
  float sum = 0.0f;
  for (int c = lane * W; c < C; c += 32 * W) {
    float r[W];
    load<W>(r, residual_in + row + c);
    if (branch) {
      float b[W];
      load<W>(b, branch + row + c);
#pragma unroll
      for (int k = 0; k < W; ++k) r[k] += b[k];
      store<W>(residual_out + row + c, r);
    }
#pragma unroll
    for (int k = 0; k < W; ++k) sum += r[k];
  }
  const float m = warp_sum(sum) / float(C);

  // Pass 2: variance about the mean (two passes avoid the cancellation of E[r^2] - mean^2).
  float sq = 0.0f;
  for (int c = lane * W; c < C; c += 32 * W) {
    float r[W];
    load<W>(r, r_src + c);
#pragma unroll
    for (int k = 0; k < W; ++k) sq += (r[k] - m) * (r[k] - m);
  }
  const float s = 1.0f / sqrtf(warp_sum(sq) / float(C) + eps);  // IEEE sqrt and division, not rsqrtf

  // Pass 3: normalize, scale, shift, round once to BF16.
  for (int c = lane * W; c < C; c += 32 * W) {
    float r[W], w[W], y[W];
    load<W>(r, r_src + c);
    load<W>(w, weight + c);
#pragma unroll
    for (int k = 0; k < W; ++k) y[k] = (r[k] - m) * s * w[k];
    if (bias) {
      float b[W];
      load<W>(b, bias + c);
#pragma unroll
      for (int k = 0; k < W; ++k) y[k] += b[k];
    }
    store<W>(ln_out + row + c, y);
  }
  if (lane == 0) mean[n] = m, rstd[n] = s;
}

// The dx part of the LayerNorm backward for rows too wide for layernorm_backward_kernel's registers
// (C > 1024): a warp per row, the two row means first, then the update; the weight and bias sums
// then take a second pass (column_partials_kernel with LayerNormParamTerms).
template <int W>
__global__ void layernorm_backward_dx_kernel(float* dx, bf16_t* dx_bf16, const bf16_t* d_ln, const float* x,
                                             const float* weight, const float* mean, const float* rstd, int N, int C) {
  const int lane = threadIdx.x;
  const std::int64_t n = std::int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  if (n >= N) return;
  const std::int64_t row = n * C;
  const float m = mean[n], s = rstd[n];

  float sum_dnorm = 0.0f, sum_dnorm_norm = 0.0f;
  for (int c = lane * W; c < C; c += 32 * W) {
    float g[W], xr[W], w[W];
    load<W>(g, d_ln + row + c);
    load<W>(xr, x + row + c);
    load<W>(w, weight + c);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const float dnorm = w[k] * g[k];
      sum_dnorm += dnorm;
      sum_dnorm_norm += dnorm * ((xr[k] - m) * s);
    }
  }
  const float mean_dnorm = warp_sum(sum_dnorm) / float(C);
  const float mean_dnorm_norm = warp_sum(sum_dnorm_norm) / float(C);

  for (int c = lane * W; c < C; c += 32 * W) {
    float g[W], xr[W], w[W], d[W];
    load<W>(g, d_ln + row + c);
    load<W>(xr, x + row + c);
    load<W>(w, weight + c);
    load<W>(d, dx + row + c);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const float norm = (xr[k] - m) * s;
      d[k] += (w[k] * g[k] - mean_dnorm - norm * mean_dnorm_norm) * s;
    }
    store<W>(dx + row + c, d);
    if (dx_bf16) store<W>(dx_bf16 + row + c, d);
  }
}

// The whole LayerNorm backward for one 64-row partition p (rows [p * kPartRows, (p + 1) * kPartRows)):
// block (32, kLnWarps), warp v takes rows p * kPartRows + v, + kLnWarps, ... in ascending order.
// Lane l owns the columns j * 32 * W + l * W + [0, W) for chunks j < kChunks (those < C), so a
// row's d_ln, x and dx sit in registers (E = W * kChunks floats each per lane): they are read from
// memory once. The per-row math is the one of layernorm_backward_dx_kernel, term for term. The
// weight and bias terms norm * d_ln and d_ln are summed per lane over the warp's rows (ascending),
// then over the warps (ascending, through shared memory) into partial[k][p][c], the layout of
// column_partials_kernel; column_finish_kernel adds the partitions. Every order is fixed.
template <int W, int kChunks>
__global__ void __launch_bounds__(32 * kLnWarps)
    layernorm_backward_kernel(float* dx, bf16_t* dx_bf16, float* partial, const bf16_t* d_ln, const float* x,
                              const float* weight, const float* mean, const float* rstd, int N, int C, int parts) {
  constexpr int E = W * kChunks;
  constexpr int kChunkCols = 32 * W;
  __shared__ float red[2][kLnWarps][kChunkCols];
  const int lane = threadIdx.x, warp = threadIdx.y;
  const int p = blockIdx.x;

  float w[E], acc_w[E], acc_b[E];
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int c = j * kChunkCols + lane * W;
    float t[W];
#pragma unroll
    for (int k = 0; k < W; ++k) t[k] = 0.0f;
    if (c < C) load<W>(t, weight + c);  // W == kVec: C % W == 0, so a chunk is wholly inside or outside
#pragma unroll
    for (int k = 0; k < W; ++k) w[j * W + k] = t[k], acc_w[j * W + k] = 0.0f, acc_b[j * W + k] = 0.0f;
  }

  const int n_end = min(N, (p + 1) * kPartRows);
  for (int n = p * kPartRows + warp; n < n_end; n += kLnWarps) {  // whole warps: warp_sum sees full warps
    const std::int64_t row = std::int64_t(n) * C;
    const float m = mean[n], s = rstd[n];
    float g[E], nrm[E], d[E];
    // All loads of the row first (d_ln, x, dx): one memory latency per row.
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const int c = j * kChunkCols + lane * W;
      float tg[W], tx[W], td[W];
#pragma unroll
      for (int k = 0; k < W; ++k) tg[k] = 0.0f, tx[k] = 0.0f, td[k] = 0.0f;
      if (c < C) {
        load<W>(tg, d_ln + row + c);
        load<W>(tx, x + row + c);
        load<W>(td, dx + row + c);
      }
#pragma unroll
      for (int k = 0; k < W; ++k) g[j * W + k] = tg[k], nrm[j * W + k] = tx[k], d[j * W + k] = td[k];
    }
    float sum_dnorm = 0.0f, sum_dnorm_norm = 0.0f;
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      if (j * kChunkCols + lane * W >= C) continue;
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const int e = j * W + k;
        nrm[e] = (nrm[e] - m) * s;  // x -> norm
        const float dnorm = w[e] * g[e];
        sum_dnorm += dnorm;
        sum_dnorm_norm += dnorm * nrm[e];
      }
    }
    const float mean_dnorm = warp_sum(sum_dnorm) / float(C);
    const float mean_dnorm_norm = warp_sum(sum_dnorm_norm) / float(C);
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const int c = j * kChunkCols + lane * W;
      if (c >= C) continue;
      float out[W];
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const int e = j * W + k;
        out[k] = d[e] + (w[e] * g[e] - mean_dnorm - nrm[e] * mean_dnorm_norm) * s;
        acc_w[e] += nrm[e] * g[e];
        acc_b[e] += g[e];
      }
      store<W>(dx + row + c, out);
      if (dx_bf16) store<W>(dx_bf16 + row + c, out);
    }
  }

  // Sum the warps' partition sums in ascending warp order, a chunk of columns at a time.
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
#pragma unroll
    for (int k = 0; k < W; ++k) {
      red[0][warp][lane * W + k] = acc_w[j * W + k];
      red[1][warp][lane * W + k] = acc_b[j * W + k];
    }
    __syncthreads();
    for (int t = warp * 32 + lane; t < kChunkCols; t += 32 * kLnWarps) {
      const int c = j * kChunkCols + t;
      if (c >= C) continue;
      float sw = 0.0f, sb = 0.0f;
#pragma unroll
      for (int v = 0; v < kLnWarps; ++v) sw += red[0][v][t], sb += red[1][v][t];
      partial[std::int64_t(p) * C + c] = sw;                        // [2, parts, C]: k = 0
      partial[(std::int64_t(parts) + p) * C + c] = sb;              // k = 1
    }
    __syncthreads();  // red is rewritten by the next chunk
  }
}

// ---------------------------------------------------------------------------------------------
// Deterministic sums over rows: partial[k][p][c] = sum of term_k(n, c) over the rows n of
// partition p (rows [p * kPartRows, (p + 1) * kPartRows)), then out_k[c] += sum over p ascending.

// d_ln * norm and d_ln: the LayerNorm weight and bias gradients (two-kernel path, C > 1024).
struct LayerNormParamTerms {
  const bf16_t* d_ln;
  const float* x;
  const float* mean;
  const float* rstd;
  int C;
  __device__ void operator()(std::int64_t n, int c, float (&t)[2]) const {
    const std::int64_t i = n * C + c;
    const float g = __bfloat162float(d_ln[i]);
    t[0] = (x[i] - mean[n]) * rstd[n] * g;
    t[1] = g;
  }
};

struct BiasTerm {
  const bf16_t* d_out;
  int C;
  __device__ void operator()(std::int64_t n, int c, float (&t)[1]) const { t[0] = __bfloat162float(d_out[n * C + c]); }
};

// grid (parts, ceil(C / kColTile)), block (kColTile, kColRowLanes). Each thread sums its row lane's
// rows of the partition in ascending order; thread row 0 then adds the lanes in ascending order.
template <int K, class Term>
__global__ void column_partials_kernel(float* partial, Term term, int N, int C, int parts) {
  __shared__ float lanes[K][kColRowLanes][kColTile];
  const int p = blockIdx.x;
  const int c = blockIdx.y * kColTile + threadIdx.x;
  const int n_end = min(N, (p + 1) * kPartRows);
  float acc[K];
#pragma unroll
  for (int k = 0; k < K; ++k) acc[k] = 0.0f;
  if (c < C) {
    for (int n = p * kPartRows + threadIdx.y; n < n_end; n += kColRowLanes) {
      float t[K];
      term(n, c, t);
#pragma unroll
      for (int k = 0; k < K; ++k) acc[k] += t[k];
    }
  }
#pragma unroll
  for (int k = 0; k < K; ++k) lanes[k][threadIdx.y][threadIdx.x] = acc[k];
  __syncthreads();
  if (threadIdx.y != 0 || c >= C) return;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    float s = 0.0f;
    for (int j = 0; j < kColRowLanes; ++j) s += lanes[k][j][threadIdx.x];
    partial[(std::int64_t(k) * parts + p) * C + c] = s;  // [K, parts, C]
  }
}

// out_k[c] += sum over the partitions; a null out_k is skipped. grid ceil(C / kColTile), block
// (kColTile, kColRowLanes): row lane r sums partitions r, r + kColRowLanes, ... in ascending order
// (independent loads, so a few hundred partitions cost a few memory latencies, not one each),
// then thread row 0 adds the lanes in ascending order and the sum to out_k[c].
template <int K>
__global__ void column_finish_kernel(float* out0, float* out1, const float* partial, int parts, int C) {
  __shared__ float lanes[K][kColRowLanes][kColTile];
  const int c = blockIdx.x * kColTile + threadIdx.x;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    float s = 0.0f;
    if (c < C && (k == 0 ? out0 : out1)) {
#pragma unroll 8
      for (int p = threadIdx.y; p < parts; p += kColRowLanes) s += partial[(std::int64_t(k) * parts + p) * C + c];
    }
    lanes[k][threadIdx.y][threadIdx.x] = s;
  }
  __syncthreads();
  if (threadIdx.y != 0 || c >= C) return;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    float* out = k == 0 ? out0 : out1;
    if (!out) continue;
    float s = 0.0f;
    for (int j = 0; j < kColRowLanes; ++j) s += lanes[k][j][threadIdx.x];
    out[c] += s;
  }
}

template <int K, class Term>
void sum_over_rows(float* out0, float* out1, Term term, int N, int C, float* scratch, cudaStream_t stream,
                   const char* partials_name, const char* finish_name) {
  const int parts = reduction_parts(N);
  const dim3 grid(unsigned(parts), unsigned(ceil_div(C, kColTile)));
  column_partials_kernel<K><<<grid, dim3(kColTile, kColRowLanes), 0, stream>>>(scratch, term, N, C, parts);
  check_cuda(cudaGetLastError(), partials_name);
  column_finish_kernel<K><<<unsigned(ceil_div(C, kColTile)), dim3(kColTile, kColRowLanes), 0, stream>>>(out0, out1, scratch,
                                                                                                     parts, C);
  check_cuda(cudaGetLastError(), finish_name);
}

// layernorm_backward_kernel<W, kChunks> with the fewest chunks that cover C (kChunks from the
// instantiated list), then the partition sums; false when C is too wide for every instance.
template <int W, int kChunks, int... kMore>
bool launch_layernorm_backward(float* dx, bf16_t* dx_bf16, float* dweight, float* dbias, const bf16_t* d_ln,
                               const float* x, const float* weight, const float* mean, const float* rstd, int N, int C,
                               float* scratch, cudaStream_t stream) {
  if (C > kChunks * 32 * W) {
    if constexpr (sizeof...(kMore) > 0)
      return launch_layernorm_backward<W, kMore...>(dx, dx_bf16, dweight, dbias, d_ln, x, weight, mean, rstd, N, C, scratch,
                                                   stream);
    else
      return false;
  }
  const int parts = reduction_parts(N);
  layernorm_backward_kernel<W, kChunks><<<unsigned(parts), dim3(32, kLnWarps), 0, stream>>>(
      dx, dx_bf16, scratch, d_ln, x, weight, mean, rstd, N, C, parts);
  check_cuda(cudaGetLastError(), "layernorm_backward_kernel");
  column_finish_kernel<2><<<unsigned(ceil_div(C, kColTile)), dim3(kColTile, kColRowLanes), 0, stream>>>(dweight, dbias,
                                                                                                     scratch, parts, C);
  check_cuda(cudaGetLastError(), "column_finish_kernel (layernorm_backward)");
  return true;
}

// ---------------------------------------------------------------------------------------------
// Casts: a thread per chunk of kVec elements; the last, partial chunk and unaligned buffers take
// the scalar path. (GELU and its derivative run in cuBLASLt's epilogues: blas.hpp.)

// Calls f(v) on the chunk's values in place: v holds float(in); f's results are stored to out.
template <class Out, class In, class F>
__device__ __forceinline__ void map_chunk(Out* out, const In* in, std::int64_t n, bool vec, F f) {
  const std::int64_t i0 = (std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * kVec;
  if (i0 >= n) return;
  if (vec && i0 + kVec <= n) {
    float v[kVec];
    load<kVec>(v, in + i0);
#pragma unroll
    for (int k = 0; k < kVec; ++k) v[k] = f(v[k], i0 + k);
    store<kVec>(out + i0, v);
  } else {
    for (std::int64_t i = i0; i < n && i < i0 + kVec; ++i) {
      float v[1];
      load<1>(v, in + i);
      v[0] = f(v[0], i);
      store<1>(out + i, v);
    }
  }
}

__global__ void cast_to_bf16_kernel(bf16_t* out, const float* in, std::int64_t n, bool vec) {
  map_chunk(out, in, n, vec, [](float v, std::int64_t) { return v; });
}

unsigned chunk_blocks(std::int64_t n) { return unsigned(ceil_div(ceil_div(n, kVec), kThreads)); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// Launchers

void encoder_forward(float* x, const int* tokens, const float* wte, const float* wpe, int B, int T, int C,
                     cudaStream_t stream) {
  const std::int64_t N = std::int64_t(B) * T;
  if (N == 0 || C == 0) return;
  if (vector_ok(C, {x, wte, wpe})) {
    const std::int64_t chunks = N * (C / kVec);
    encoder_forward_kernel<kVec><<<unsigned(ceil_div(chunks, kThreads)), kThreads, 0, stream>>>(x, tokens, wte, wpe, T, C, chunks);
  } else {
    const std::int64_t chunks = N * C;
    encoder_forward_kernel<1><<<unsigned(ceil_div(chunks, kThreads)), kThreads, 0, stream>>>(x, tokens, wte, wpe, T, C, chunks);
  }
  check_cuda(cudaGetLastError(), "encoder_forward_kernel");
}

void encoder_backward(float* dwte, float* dwpe, const float* dx, const int* token_ids, const int* token_offsets,
                      const int* token_rows, const int* distinct, int B, int T, int C, cudaStream_t stream) {
  if (C == 0 || B == 0 || T == 0) return;
  encoder_backward_wpe_kernel<<<unsigned(ceil_div(std::int64_t(T) * C, kThreads)), kThreads, 0, stream>>>(dwpe, dx, B, T, C);
  check_cuda(cudaGetLastError(), "encoder_backward_wpe_kernel");
  if (dwte == nullptr) return;  // data parallel's token embedding split: wte's rows go apart (embedding_rows_backward)
  // Sized for the most groups there can be (every row its own token, B * T), capped: the threads
  // loop over the (u, c) pairs of the groups there are, the same sums whatever the grid.
  constexpr std::int64_t kMaxWteBlocks = 8192;
  const auto blocks = unsigned(std::min(ceil_div(std::int64_t(B) * T * C, kThreads), kMaxWteBlocks));
  encoder_backward_wte_kernel<<<blocks, kThreads, 0, stream>>>(dwte, dx, token_ids, token_offsets, token_rows, distinct, C);
  check_cuda(cudaGetLastError(), "encoder_backward_wte_kernel");
}

void embedding_rows_backward(float* rows, const float* dx, const int* token_offsets, const int* token_rows, int distinct, int C,
                             cudaStream_t stream) {
  if (distinct <= 0 || C == 0) return;
  embedding_rows_backward_kernel<<<unsigned(ceil_div(std::int64_t(distinct) * C, kThreads)), kThreads, 0, stream>>>(
      rows, dx, token_offsets, token_rows, distinct, C);
  check_cuda(cudaGetLastError(), "embedding_rows_backward_kernel");
}

void add_embedding_rows(float* dwte, const float* rows, const int* ids, int count, int C, cudaStream_t stream) {
  if (count <= 0 || C == 0) return;
  add_embedding_rows_kernel<<<unsigned(ceil_div(std::int64_t(count) * C, kThreads)), kThreads, 0, stream>>>(dwte, rows, ids, count, C);
  check_cuda(cudaGetLastError(), "add_embedding_rows_kernel");
}

void layernorm_forward(bf16_t* ln_out, float* mean, float* rstd, float* residual_out, const float* residual_in,
                       const bf16_t* branch, const float* weight, const float* bias, int N, int C, float eps,
                       cudaStream_t stream) {
  if (N == 0 || C == 0) return;
  const dim3 block(32, kRowsPerBlock);
  if (vector_ok(C, {ln_out, branch ? residual_out : nullptr, residual_in, branch, weight, bias}))
    layernorm_forward_kernel<kVec><<<row_blocks(N), block, 0, stream>>>(ln_out, mean, rstd, residual_out, residual_in,
                                                                        branch, weight, bias, N, C, eps);
  else
    layernorm_forward_kernel<1><<<row_blocks(N), block, 0, stream>>>(ln_out, mean, rstd, residual_out, residual_in, branch,
                                                                     weight, bias, N, C, eps);
  check_cuda(cudaGetLastError(), "layernorm_forward_kernel");
}

std::int64_t reduction_scratch_floats(int N, int C) {
  // layernorm_backward keeps two [parts, C] partial arrays, bias_backward one; pass the widest C
  // (the largest bias width) the scratch must serve.
  return 2 * std::int64_t(reduction_parts(std::max(N, 1))) * std::max(C, 1);
}

void layernorm_backward(float* dx, bf16_t* dx_bf16, float* dweight, float* dbias, const bf16_t* d_ln, const float* x,
                        const float* weight, const float* mean, const float* rstd, int N, int C, float* scratch,
                        cudaStream_t stream) {
  if (N == 0 || C == 0) return;
  // One pass over the rows, the row in registers (the usual case: C <= 1024).
  const bool vec = vector_ok(C, {dx, dx_bf16, d_ln, x, weight});
  if (vec ? launch_layernorm_backward<kVec, 1, 2, 3, kLnMaxVecChunks>(dx, dx_bf16, dweight, dbias, d_ln, x, weight, mean,
                                                                      rstd, N, C, scratch, stream)
          : launch_layernorm_backward<1, 1, 8, kLnMaxScalarChunks>(dx, dx_bf16, dweight, dbias, d_ln, x, weight, mean,
                                                                   rstd, N, C, scratch, stream))
    return;
  // Wider rows: dx a warp per row, then the weight and bias sums in a second pass over d_ln and x.
  const dim3 block(32, kRowsPerBlock);
  if (vec)
    layernorm_backward_dx_kernel<kVec><<<row_blocks(N), block, 0, stream>>>(dx, dx_bf16, d_ln, x, weight, mean, rstd, N, C);
  else
    layernorm_backward_dx_kernel<1><<<row_blocks(N), block, 0, stream>>>(dx, dx_bf16, d_ln, x, weight, mean, rstd, N, C);
  check_cuda(cudaGetLastError(), "layernorm_backward_dx_kernel");
  sum_over_rows<2>(dweight, dbias, LayerNormParamTerms{d_ln, x, mean, rstd, C}, N, C, scratch, stream,
                   "column_partials_kernel (layernorm_backward)", "column_finish_kernel (layernorm_backward)");
}

void cast_to_bf16(bf16_t* out, const float* in, std::int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  cast_to_bf16_kernel<<<chunk_blocks(n), kThreads, 0, stream>>>(out, in, n, aligned16(out) && aligned16(in));
  check_cuda(cudaGetLastError(), "cast_to_bf16_kernel");
}

void bias_backward(float* dbias, const bf16_t* d_out, int N, int C, float* scratch, cudaStream_t stream) {
  if (N == 0 || C == 0) return;
  sum_over_rows<1>(dbias, nullptr, BiasTerm{d_out, C}, N, C, scratch, stream, "column_partials_kernel (bias_backward)",
                   "column_finish_kernel (bias_backward)");
}

}  // namespace stableflash::model::cuda
