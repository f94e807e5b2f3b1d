// cuBLASLt behind Blas::gemm (stableflash/model/cuda/blas.hpp).
//
// Row-major to column-major: a row-major [R, C] matrix with leading dimension ld is the
// column-major [C, R] matrix with the same ld, i.e. its transpose. So row-major C = op(A) op(B) is
// column-major C^T = op(B)^T op(A)^T: cuBLASLt gets B as its first operand and A as its second,
// each with the caller's transpose flag, and m = C.cols, n = C.rows.
#include <cublasLt.h>

#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>

#include "stableflash/model/cuda/blas.hpp"
#include "stableflash/model/cuda/device_array.hpp"

namespace stableflash::model::cuda {
namespace {

constexpr std::size_t kWorkspaceBytes = std::size_t(32) << 20;  // what cuBLASLt's Hopper kernels ask for at most
constexpr int kTuningCandidates = 8;  // the heuristic's best guesses timed when tuning

void check_lt(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("cuBLASLt error in ") + what + ": " + cublasLtGetStatusString(status));
}

cudaDataType_t cuda_type(DType t) { return t == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F; }
const char* name(DType t) { return t == DType::bf16 ? "bf16" : "f32"; }

int alignment_bytes(const void* p) {
  const auto v = reinterpret_cast<std::uintptr_t>(p);
  int a = 256;
  while (a > 1 && v % a) a /= 2;
  return a;
}

// Everything that makes cuBLASLt choose differently; the cache key of the chosen algorithm.
struct Key {
  int ta, tb, m, n, k, batch, ta_type, tb_type, c_type, bias, epilogue;
  std::int64_t lda, ldb, ldc, sa, sb, sc;
  int align_a, align_b, align_c, align_aux;
  bool operator<(const Key& o) const { return std::memcmp(this, &o, sizeof(Key)) < 0; }
};

template <class V>
void set_attr(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const V& v) {
  check_lt(cublasLtMatmulDescSetAttribute(d, a, &v, sizeof(V)), "cublasLtMatmulDescSetAttribute");
}

struct Layout {
  cublasLtMatrixLayout_t layout = nullptr;
  // A column-major rows x cols matrix (ld elements between columns).
  Layout(DType t, std::uint64_t rows, std::uint64_t cols, std::int64_t ld, int batch, std::int64_t stride) {
    check_lt(cublasLtMatrixLayoutCreate(&layout, cuda_type(t), rows, cols, ld), "cublasLtMatrixLayoutCreate");
    if (batch > 1) {
      check_lt(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch), "batch count");
      check_lt(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride),
               "batch stride");
    }
  }
  ~Layout() { cublasLtMatrixLayoutDestroy(layout); }
  Layout(const Layout&) = delete;
  Layout& operator=(const Layout&) = delete;
};

}  // namespace

struct Blas::Impl {
  cudaStream_t stream;
  bool tune = false;
  cublasLtHandle_t handle = nullptr;
  DeviceArray<char> workspace{kWorkspaceBytes};
  std::map<Key, cublasLtMatmulAlgo_t> algos;

  // The product with one algorithm (the output and the epilogue's aux as the caller gave them).
  cublasStatus_t run(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulDesc_t desc, const Layout& first, const Layout& second,
                     const Layout& out, const MatrixView& a, const MatrixView& b, const MatrixView& c, const GemmOptions& opt) {
    const float alpha = opt.alpha, beta = opt.beta;
    return cublasLtMatmul(handle, desc, &alpha, b.data, first.layout, a.data, second.layout, &beta, c.data, out.layout, c.data,
                          out.layout, &algo, workspace.get(), kWorkspaceBytes, stream);
  }
  cublasLtMatmulAlgo_t fastest(const cublasLtMatmulHeuristicResult_t* candidates, int count, cublasLtMatmulDesc_t desc,
                               const Layout& first, const Layout& second, const Layout& out, const MatrixView& a,
                               const MatrixView& b, const MatrixView& c, const GemmOptions& opt);
};

// Times the heuristic's candidates on the caller's operands (first use of a shape only) and keeps
// the fastest: cuBLASLt's first guess is the library's model of the GPU, not a measurement, and on
// the H200 it leaves products of the GPT-2 step measurably slower than others it lists (profile in
// docs/benchmarks.md). An output accumulated into (beta != 0) is saved and restored around the
// trials, so the call's result is the chosen algorithm's alone; the aux output of a GELU epilogue
// and a beta = 0 output are simply rewritten by the real call.
cublasLtMatmulAlgo_t Blas::Impl::fastest(const cublasLtMatmulHeuristicResult_t* candidates, int count, cublasLtMatmulDesc_t desc,
                                        const Layout& first, const Layout& second, const Layout& out, const MatrixView& a,
                                        const MatrixView& b, const MatrixView& c, const GemmOptions& opt) {
  constexpr int kTimedRuns = 3;
  // Timing synchronizes: it cannot happen while the stream is recorded into a CUDA graph. The
  // recorder runs each shape once before recording it (stream_graph.hpp); a shape first seen
  // there is a caller's bug, named here rather than as a capture error.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing");
  if (capture != cudaStreamCaptureStatusNone)
    throw std::logic_error("gemm: first use of a product shape while its stream is captured into a CUDA graph (its algorithm is "
                           "chosen by timing, which synchronizes); run the work once before capturing it");
  const std::size_t c_bytes = std::size_t(opt.batch - 1) * std::size_t(c.batch_stride) * (c.type == DType::bf16 ? 2 : 4) +
                              std::size_t(c.rows - 1) * std::size_t(c.ld) * (c.type == DType::bf16 ? 2 : 4) +
                              std::size_t(c.cols) * (c.type == DType::bf16 ? 2 : 4);
  void* saved = nullptr;
  if (opt.beta != 0.0f) {
    check_cuda(cudaMallocAsync(&saved, c_bytes, stream), "cudaMallocAsync (gemm tuning)");
    check_cuda(cudaMemcpyAsync(saved, c.data, c_bytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync (gemm tuning)");
  }
  cudaEvent_t start = nullptr, stop = nullptr;
  check_cuda(cudaEventCreate(&start), "cudaEventCreate");
  check_cuda(cudaEventCreate(&stop), "cudaEventCreate");
  int best = -1;  // none ran yet
  float best_ms = 0.0f;
  for (int i = 0; i < count; ++i) {
    if (candidates[i].workspaceSize > kWorkspaceBytes) continue;
    if (run(candidates[i].algo, desc, first, second, out, a, b, c, opt) != CUBLAS_STATUS_SUCCESS) continue;  // warm-up
    check_cuda(cudaEventRecord(start, stream), "cudaEventRecord");
    for (int r = 0; r < kTimedRuns; ++r) check_lt(run(candidates[i].algo, desc, first, second, out, a, b, c, opt), "cublasLtMatmul (tuning)");
    check_cuda(cudaEventRecord(stop, stream), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(stop), "cudaEventSynchronize (gemm tuning)");
    float ms = 0.0f;
    check_cuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    if (best < 0 || ms < best_ms) best = i, best_ms = ms;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (saved) {
    check_cuda(cudaMemcpyAsync(c.data, saved, c_bytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync (gemm tuning)");
    check_cuda(cudaFreeAsync(saved, stream), "cudaFreeAsync (gemm tuning)");
  }
  return candidates[best < 0 ? 0 : best].algo;  // none ran: the heuristic's first, whose call reports the error
}

Blas::Blas(cudaStream_t stream, bool tune) : impl_(std::make_unique<Impl>()) {
  impl_->stream = stream;
  impl_->tune = tune;
  check_lt(cublasLtCreate(&impl_->handle), "cublasLtCreate");
}

Blas::~Blas() {
  if (impl_ && impl_->handle) cublasLtDestroy(impl_->handle);
}

cudaStream_t Blas::stream() const { return impl_->stream; }

void Blas::gemm(Trans ta, Trans tb, const MatrixView& a, const MatrixView& b, const MatrixView& c, const GemmOptions& opt) {
  // Row-major shapes: op(A) [M, K], op(B) [K, N], C [M, N].
  const int M = c.rows, N = c.cols;
  const int a_rows = ta == Trans::no ? a.rows : a.cols, a_cols = ta == Trans::no ? a.cols : a.rows;
  const int b_rows = tb == Trans::no ? b.rows : b.cols, b_cols = tb == Trans::no ? b.cols : b.rows;
  const int K = a_cols;
  auto shape = [](const MatrixView& x) { return "[" + std::to_string(x.rows) + ", " + std::to_string(x.cols) + "]"; };
  if (a_rows != M || b_cols != N || b_rows != K || M < 1 || N < 1 || K < 1)
    throw std::invalid_argument("gemm: op(A) " + shape(a) + (ta == Trans::yes ? "^T" : "") + " times op(B) " + shape(b) +
                                (tb == Trans::yes ? "^T" : "") + " does not give C " + shape(c));
  const bool mixed = a.type == DType::bf16 && b.type == DType::bf16;
  const bool fp32 = a.type == DType::f32 && b.type == DType::f32 && c.type == DType::f32;
  if (!mixed && !fp32)
    throw std::invalid_argument(std::string("gemm: unsupported types ") + name(a.type) + " x " + name(b.type) + " -> " + name(c.type));
  if (opt.batch < 1 || (opt.bias && opt.batch != 1)) throw std::invalid_argument("gemm: batch must be >= 1 (and 1 with a bias)");
  if (opt.epilogue != Epilogue::none && (!opt.aux || c.type != DType::bf16 || opt.batch != 1 || (opt.bias && opt.epilogue == Epilogue::dgelu)))
    throw std::invalid_argument("gemm: a GELU epilogue needs an aux buffer, a BF16 output, no batch (and no bias for dgelu)");
  for (const MatrixView* x : {&a, &b, &c})
    if (x->ld < x->cols) throw std::invalid_argument("gemm: leading dimension " + std::to_string(x->ld) + " < columns " + std::to_string(x->cols));

  // Column-major problem: C^T [N, M] = op(B)^T [N, K] * op(A)^T [K, M].
  const cublasOperation_t op_first = tb == Trans::yes ? CUBLAS_OP_T : CUBLAS_OP_N;   // applied to B^T (col-major view of B)
  const cublasOperation_t op_second = ta == Trans::yes ? CUBLAS_OP_T : CUBLAS_OP_N;  // applied to A^T
  Key key{};  // zeroed padding: compared bytewise
  key.ta = int(ta), key.tb = int(tb), key.m = M, key.n = N, key.k = K, key.batch = opt.batch;
  key.ta_type = int(a.type), key.tb_type = int(b.type), key.c_type = int(c.type), key.bias = opt.bias != nullptr;
  key.epilogue = int(opt.epilogue);
  key.lda = a.ld, key.ldb = b.ld, key.ldc = c.ld, key.sa = a.batch_stride, key.sb = b.batch_stride, key.sc = c.batch_stride;
  key.align_a = alignment_bytes(a.data), key.align_b = alignment_bytes(b.data), key.align_c = alignment_bytes(c.data);

  cublasLtMatmulDesc_t desc = nullptr;
  // FP32 products run in true FP32 (no TF32): the standard-attention baseline must be FP32.
  check_lt(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  struct DescGuard {
    cublasLtMatmulDesc_t d;
    ~DescGuard() { cublasLtMatmulDescDestroy(d); }
  } guard{desc};
  set_attr(desc, CUBLASLT_MATMUL_DESC_TRANSA, op_first);
  set_attr(desc, CUBLASLT_MATMUL_DESC_TRANSB, op_second);
  cublasLtEpilogue_t epilogue = opt.bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  if (opt.epilogue == Epilogue::gelu) epilogue = opt.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
  if (opt.epilogue == Epilogue::dgelu) epilogue = CUBLASLT_EPILOGUE_DGELU;
  set_attr(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);
  if (opt.bias) {
    set_attr(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, opt.bias);
    const cudaDataType_t bias_type = cuda_type(c.type);
    set_attr(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type);
  }
  if (opt.epilogue != Epilogue::none) {
    // The aux matrix has C's column-major shape and leading dimension.
    set_attr(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, opt.aux);
    const std::int64_t aux_ld = c.ld;
    set_attr(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, aux_ld);
    key.align_aux = alignment_bytes(opt.aux);  // algorithms are chosen for this alignment too
  }
  // Stored (col-major) shapes: B^T is [b.cols, b.rows] with ld b.ld, likewise A^T and C^T.
  Layout first(b.type, std::uint64_t(b.cols), std::uint64_t(b.rows), b.ld, opt.batch, b.batch_stride);
  Layout second(a.type, std::uint64_t(a.cols), std::uint64_t(a.rows), a.ld, opt.batch, a.batch_stride);
  Layout out(c.type, std::uint64_t(c.cols), std::uint64_t(c.rows), c.ld, opt.batch, c.batch_stride);

  auto found = impl_->algos.find(key);
  if (found == impl_->algos.end()) {
    cublasLtMatmulPreference_t pref = nullptr;
    check_lt(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    const std::uint64_t ws = kWorkspaceBytes;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    const std::uint32_t al_a = std::uint32_t(key.align_b), al_b = std::uint32_t(key.align_a), al_c = std::uint32_t(key.align_c);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof al_c);
    cublasLtMatmulHeuristicResult_t results[kTuningCandidates]{};
    int count = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(impl_->handle, desc, first.layout, second.layout, out.layout,
                                                             out.layout, pref, impl_->tune ? kTuningCandidates : 1, results, &count);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || count == 0)
      throw std::runtime_error("cuBLASLt has no algorithm for C " + shape(c) + " = op(A) " + shape(a) + " op(B) " + shape(b) +
                               " (" + name(a.type) + " -> " + name(c.type) + ", batch " + std::to_string(opt.batch) + ")");
    const cublasLtMatmulAlgo_t algo =
        count > 1 ? impl_->fastest(results, count, desc, first, second, out, a, b, c, opt) : results[0].algo;
    found = impl_->algos.emplace(key, algo).first;
  }
  check_lt(impl_->run(found->second, desc, first, second, out, a, b, c, opt), "cublasLtMatmul");
}

}  // namespace stableflash::model::cuda
