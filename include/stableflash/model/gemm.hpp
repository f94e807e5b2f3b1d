// The matrix product behind every linear layer of the CPU model.
//
// Why not a BLAS: the trainer's contract is that a resumed or replayed run reproduces the loss
// bit for bit, and the golden/finite-difference tests run the same code in FP32 and FP64. A BLAS
// may change its summation order with the thread count, the CPU it dispatches to, or the library
// version (OpenBLAS splits K across threads for some shapes), and Debian's reference BLAS is slow.
// This blocked, packed GEMM sums every output element in one fixed order (k ascending) whatever
// the thread count, is compiled for AVX2 and for baseline x86-64 with identical results (no FMA
// contraction, no reassociation), and is templated on the scalar.
#pragma once

#include <cstdint>

namespace stableflash::model {

enum class Trans : std::uint8_t { no, yes };

// C[M, N] (+)= op(A)[M, K] * op(B)[K, N], row-major with leading dimensions lda, ldb, ldc.
// op(A) = A when ta == no (A is [M, K]), A^T when ta == yes (A is [K, M]); same for B.
// accumulate == false overwrites C. The sum over k always runs in ascending k.
template <class T>
void gemm(Trans ta, Trans tb, int M, int N, int K, const T* A, std::int64_t lda, const T* B, std::int64_t ldb, T* C,
          std::int64_t ldc, bool accumulate);

}  // namespace stableflash::model
