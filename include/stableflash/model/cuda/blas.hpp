// Matrix products on the GPU through cuBLASLt, written in the row-major terms the model uses.
//
// Every linear layer of the CUDA GPT-2 and Muon's Newton-Schulz iteration go through Blas::gemm:
// C[M, N] = alpha * op(A)[M, K] * op(B)[K, N] + beta * C, with op(X) = X or X^T, row-major views
// with leading dimensions, optional batching with per-operand strides (a stride of 0 broadcasts an
// operand), BF16 or FP32 operands and FP32 accumulation. cuBLASLt is column-major; a row-major
// product is the column-major product of the transposes with A and B swapped, done in one place.
//
// Decided once per shape: the first time a (types, transposes, sizes, strides, alignment)
// combination is seen, the algorithm is chosen and reused afterwards, so the same call always runs
// the same algorithm. Without tuning it is cuBLASLt's heuristic's first answer (the same on every
// run: what bitwise-reproducible training needs); with tuning, the fastest of the heuristic's first
// eight answers timed on the call's own operands (varies between runs with the timings).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

namespace stableflash::model::cuda {

enum class DType : std::uint8_t { bf16, f32 };

// A row-major matrix view [rows, cols] with leading dimension ld (elements between rows) and,
// for batched products, batch_stride elements between consecutive matrices (0: the same matrix
// for every batch entry).
struct MatrixView {
  void* data = nullptr;
  DType type = DType::bf16;
  int rows = 0, cols = 0;
  std::int64_t ld = 0;
  std::int64_t batch_stride = 0;
};

inline MatrixView bf16_matrix(const void* p, int rows, int cols, std::int64_t ld = 0, std::int64_t batch_stride = 0) {
  return {const_cast<void*>(p), DType::bf16, rows, cols, ld ? ld : cols, batch_stride};
}
inline MatrixView f32_matrix(const void* p, int rows, int cols, std::int64_t ld = 0, std::int64_t batch_stride = 0) {
  return {const_cast<void*>(p), DType::f32, rows, cols, ld ? ld : cols, batch_stride};
}

enum class Trans : std::uint8_t { no, yes };

// What cuBLASLt applies to the FP32 product before the output rounding (GELU is GPT-2's tanh
// approximation; tests/model_gpu/blas_gpu_test.cu checks which GELU the library computes).
enum class Epilogue : std::uint8_t {
  none,
  gelu,   // C = GELU(product [+ bias]); `aux` receives the GELU input, laid out like C (BF16 C only)
  dgelu,  // C = product * GELU'(aux): the GELU backward, aux = the forward's GELU input (BF16 C only)
};

struct GemmOptions {
  float alpha = 1.0f, beta = 0.0f;
  int batch = 1;
  // Adds bias[n] to every row of C before the output rounding (cuBLASLt's BIAS epilogue); the
  // bias has C's type for BF16 outputs and is FP32 for FP32 outputs. Non-batched only.
  const void* bias = nullptr;
  Epilogue epilogue = Epilogue::none;
  void* aux = nullptr;  // gelu: written, dgelu: read; [C.rows, C.cols] with C's leading dimension
};

class Blas {
 public:
  // Works on `stream`; owns a cuBLASLt handle and a 32 MiB workspace on the current device.
  // `tune`: time the candidate algorithms at a shape's first use (see above).
  explicit Blas(cudaStream_t stream, bool tune = false);
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  cudaStream_t stream() const;

  // C = alpha * op(A) op(B) + beta * C. Supported type combinations (A, B -> C): bf16, bf16 -> bf16
  // or f32 (FP32 accumulation); f32, f32 -> f32 (FP32 accumulation, no TF32). Shapes are checked:
  // op(A) is [C.rows, K], op(B) is [K, C.cols]; a mismatch throws std::invalid_argument naming it.
  void gemm(Trans ta, Trans tb, const MatrixView& a, const MatrixView& b, const MatrixView& c, const GemmOptions& options = {});

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace stableflash::model::cuda
