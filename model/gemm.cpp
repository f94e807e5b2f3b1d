// Blocked, packed GEMM (see gemm.hpp for why not a BLAS). Output tiles of kTileM x kTileN are
// independent work items for OpenMP; each thread packs its own panels, so no output element is
// ever summed by two threads and the summation order is fixed: for each K block in ascending
// order, a register tile sums k ascending from zero, then adds into C.
#include "stableflash/model/gemm.hpp"

#include <algorithm>
#include <stdexcept>
#include <vector>

namespace stableflash::model {
namespace {

constexpr int kMR = 6;      // rows of the register tile
constexpr int kTileM = 96;  // rows of an output tile (one OpenMP work item), a multiple of kMR
constexpr int kTileN = 256;
constexpr int kTileK = 256;

// 32-byte vectors through GCC's vector extensions: element-wise IEEE operations, so the AVX2
// build and the baseline build (two 16-byte halves) compute bit-identical results.
template <class T>
struct VecOf;
template <>
struct VecOf<float> {
  typedef float type __attribute__((vector_size(32)));
};
template <>
struct VecOf<double> {
  typedef double type __attribute__((vector_size(32)));
};
template <class T>
using Vec = typename VecOf<T>::type;
template <class T>
constexpr int kLanes = int(32 / sizeof(T));
template <class T>
constexpr int kNR = 2 * kLanes<T>;  // columns of the register tile: two vectors

// acc[MR][NR] = sum_k a[k][r] * b[k][c] over a packed A panel (k-major, MR wide) and a packed B
// panel (k-major, NR wide): 2 * MR vector accumulators stay in registers; each element sums its
// products with separate multiplies and adds in ascending k.
template <class T>
__attribute__((always_inline)) inline void micro_tile(int kc, const T* __restrict a, const T* __restrict b, T* __restrict acc) {
  using V = Vec<T>;
  constexpr int L = kLanes<T>, NR = kNR<T>;
  V c[kMR][2] = {};
  for (int k = 0; k < kc; ++k) {
    V b0, b1;
    __builtin_memcpy(&b0, b + k * NR, sizeof(V));
    __builtin_memcpy(&b1, b + k * NR + L, sizeof(V));
    for (int r = 0; r < kMR; ++r) {
      const V ar = V{} + a[k * kMR + r];  // broadcast
      c[r][0] += ar * b0;
      c[r][1] += ar * b1;
    }
  }
  for (int r = 0; r < kMR; ++r) {
    __builtin_memcpy(acc + r * NR, &c[r][0], sizeof(V));
    __builtin_memcpy(acc + r * NR + L, &c[r][1], sizeof(V));
  }
}

// One block: all register tiles of packed panels pa [mc/MR][kc][MR] and pb [nc/NR][kc][NR], added
// into C. Cloned for AVX2 and baseline: both perform the same IEEE operations in the same order.
template <class T>
__attribute__((always_inline)) inline void block_kernel_impl(int mc, int nc, int kc, const T* pa, const T* pb, T* C, std::int64_t ldc) {
  constexpr int kNR_ = kNR<T>;
  alignas(64) T acc[kMR * kNR_];
  for (int i0 = 0; i0 < mc; i0 += kMR)
    for (int j0 = 0; j0 < nc; j0 += kNR_) {
      micro_tile<T>(kc, pa + std::int64_t(i0) * kc, pb + std::int64_t(j0) * kc, acc);
      const int rows = std::min(kMR, mc - i0), cols = std::min(kNR_, nc - j0);
      for (int r = 0; r < rows; ++r)
        for (int j = 0; j < cols; ++j) C[(i0 + r) * ldc + j0 + j] += acc[r * kNR_ + j];
    }
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void block_kernel(int mc, int nc, int kc, const float* pa, const float* pb,
                                                                       float* C, std::int64_t ldc) {
  block_kernel_impl(mc, nc, kc, pa, pb, C, ldc);
}
__attribute__((target_clones("avx512f", "avx2", "default"))) void block_kernel(int mc, int nc, int kc, const double* pa, const double* pb,
                                                                       double* C, std::int64_t ldc) {
  block_kernel_impl(mc, nc, kc, pa, pb, C, ldc);
}

// Packs the [m, kc] block M[i0 : i0+m, k0 : k0+kc] of a matrix stored row-major (element (i, k) at
// M[i * ld + k]) or, `transposed`, column-major (at M[k * ld + i]) into [ceil(m/W)][kc][W] panels,
// zero-padding the last panel's rows: the layout the micro-kernel streams for either operand.
template <int W, class T>
void pack_panels(bool transposed, const T* M, std::int64_t ld, int i0, int m, int k0, int kc, T* out) {
  for (int ib = 0; ib < m; ib += W)
    for (int k = 0; k < kc; ++k)
      for (int r = 0; r < W; ++r) {
        const int i = ib + r;
        T v = 0;
        if (i < m) v = transposed ? M[std::int64_t(k0 + k) * ld + i0 + i] : M[std::int64_t(i0 + i) * ld + k0 + k];
        *out++ = v;
      }
}

// op(A)[i0 : i0+mc, k0 : k0+kc] as [ceil(mc/MR)][kc][MR].
template <class T>
void pack_a(Trans ta, const T* A, std::int64_t lda, int i0, int mc, int k0, int kc, T* out) {
  pack_panels<kMR>(ta != Trans::no, A, lda, i0, mc, k0, kc, out);
}

// op(B)[k0 : k0+kc, j0 : j0+nc] as [ceil(nc/NR)][kc][NR]: the panels of op(B)^T, which is B^T
// (stored transposed) unless B itself is.
template <class T>
void pack_b(Trans tb, const T* B, std::int64_t ldb, int k0, int kc, int j0, int nc, T* out) {
  pack_panels<kNR<T>>(tb == Trans::no, B, ldb, j0, nc, k0, kc, out);
}

int round_up(int x, int m) { return (x + m - 1) / m * m; }

}  // namespace

template <class T>
void gemm(Trans ta, Trans tb, int M, int N, int K, const T* A, std::int64_t lda, const T* B, std::int64_t ldb, T* C,
          std::int64_t ldc, bool accumulate) {
  if (M < 0 || N < 0 || K < 0) throw std::invalid_argument("gemm: negative size");
  if (M == 0 || N == 0) return;
  const int tiles_m = (M + kTileM - 1) / kTileM, tiles_n = (N + kTileN - 1) / kTileN;
#pragma omp parallel
  {
    std::vector<T> pa(std::size_t(round_up(kTileM, kMR)) * kTileK), pb(std::size_t(round_up(kTileN, kNR<T>)) * kTileK);
#pragma omp for collapse(2) schedule(static)
    for (int tm = 0; tm < tiles_m; ++tm)
      for (int tn = 0; tn < tiles_n; ++tn) {
        const int i0 = tm * kTileM, j0 = tn * kTileN;
        const int mc = std::min(kTileM, M - i0), nc = std::min(kTileN, N - j0);
        T* c = C + std::int64_t(i0) * ldc + j0;
        if (!accumulate)
          for (int r = 0; r < mc; ++r) std::fill_n(c + std::int64_t(r) * ldc, nc, T(0));
        for (int k0 = 0; k0 < K; k0 += kTileK) {
          const int kc = std::min(kTileK, K - k0);
          pack_a(ta, A, lda, i0, mc, k0, kc, pa.data());
          pack_b(tb, B, ldb, k0, kc, j0, nc, pb.data());
          block_kernel(mc, nc, kc, pa.data(), pb.data(), c, ldc);
        }
      }
  }
}

template void gemm<float>(Trans, Trans, int, int, int, const float*, std::int64_t, const float*, std::int64_t, float*,
                          std::int64_t, bool);
template void gemm<double>(Trans, Trans, int, int, int, const double*, std::int64_t, const double*, std::int64_t, double*,
                           std::int64_t, bool);

}  // namespace stableflash::model
