// GPT-2's two MLP products with the GELU in the epilogue, as CUTLASS sm90 kernels (TMA, wgmma,
// warp-specialized): Blas::gemm's alternative to cuBLASLt's GELU_AUX(_BIAS) and DGELU epilogues,
// which on the H200 run 25-40% slower than the same products without them (docs/benchmarks.md).
//
// Row-major terms of blas.hpp; BF16 operands and outputs, FP32 accumulation and epilogue math:
//   forward:  D [m, n] = GELU(alpha A [m, k] B [k, n] + bias [n]),  aux [m, n] = the GELU's input
//             (the trainer's fc: A = ln2, B = W_fc stored [in, out]);
//   backward: D [m, n] = (alpha A [m, k] B^T [k, n]) * GELU'(aux [m, n])
//             (the trainer's dX of the MLP projection: A = d_res16, B = W_fcproj stored [n, k]).
// GELU is GPT-2's tanh approximation, evaluated without the tanh's cancellation in the negative
// tail (cutlass_gelu_gemm.cuh says how and how exactly). beta is 0: D is not read.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace stableflash::model::cuda {

enum class GeluGemm : std::uint8_t {
  forward,   // GELU and its input (aux) written; B is [k, n] row-major (N-major)
  backward,  // times GELU'(aux), aux read; B is [n, k] row-major (K-major), used transposed
};

struct GeluGemmArgs {
  int m = 0, n = 0, k = 0;
  const void* a = nullptr;  // [m, k] row-major, ld lda
  std::int64_t lda = 0;
  const void* b = nullptr;  // forward: [k, n] row-major; backward: [n, k] row-major; ld ldb
  std::int64_t ldb = 0;
  void* d = nullptr;  // [m, n] row-major, ld ldd
  std::int64_t ldd = 0;
  void* aux = nullptr;  // [m, n] row-major with D's leading dimension: forward writes it, backward reads it
  const void* bias = nullptr;  // forward only: [n] BF16, or null for none
  float alpha = 1.0f;
};

// Whether the kernel runs these arguments: 16-byte aligned pointers and rows (k and n multiples of
// 8 elements, leading dimensions too), no bias for the backward, sizes CUTLASS accepts. Host only,
// no device needed; where it is false the caller uses cuBLASLt.
bool cutlass_gelu_gemm_supported(GeluGemm which, const GeluGemmArgs& args);

// Launches the product on `stream` (the current device). Throws std::invalid_argument where
// cutlass_gelu_gemm_supported is false and std::runtime_error where CUTLASS or the launch fails.
void cutlass_gelu_gemm(GeluGemm which, const GeluGemmArgs& args, cudaStream_t stream);

}  // namespace stableflash::model::cuda
