// gemm_lab: cuBLASLt's algorithms for GPT-2's MLP products, called exactly as model/cuda/blas.cu
// calls them for model/cuda/gpt2_cuda.cpp, timed on the GPU with and without the GELU epilogues,
// each algorithm's result checked. Bench only: not part of any library (docs/cuda-kernels.md,
// "GEMM lab"). Links the CUDA runtime and cuBLASLt, nothing of the project; the kernels (input
// fills, the check's gathers, the two-pass alternative's element-wise passes) are in gemm_lab_kernels.cu.
//
//   gemm_lab [--tokens 16384] [--embd 768] [--hidden 3072] [--reps 30] [--warmup 5] [--requested 32]
//            [--only SUBSTRING] [--brief] [--no-search]
//
// The two products (row-major terms of blas.hpp, N tokens, C = n_embd, F = 4C):
//   backward dX of the MLP projection: dfch [N, F] = d_res16 [N, C] W_fcproj[F, C]^T, epilogue DGELU
//     reading fch (the forward's GELU input) as aux; blas.cu's column-major problem: m = F, n = N,
//     k = C, A = W_fcproj seen as [C, F] ld C with op T, B = dY seen as [C, N] ld C with op N,
//     D = [F, N] ld F, aux ld F, aux type unset (= D's, BF16).
//   forward fc: gelu [N, F] = GELU(ln2 [N, C] W_fc [C, F] + b_fc), epilogue GELU_AUX_BIAS writing
//     fch as aux; column-major m = F, n = N, k = C, A = W_fc seen as [F, C] ld F op N, B = ln2 seen
//     as [C, N] ld C op N, D [F, N] ld F, bias BF16 (BIAS_DATA_TYPE set to D's type), aux ld F.
// Both: CUBLAS_COMPUTE_32F, scale type CUDA_R_32F, alpha 1, beta 0 with C = D, 256-byte minimum
// alignments, a 32 MiB workspace (blas.cu's kWorkspaceBytes). blas.cu runs the heuristic's first
// answer (rank 0) in deterministic runs and, tuned, the fastest of ranks 0-7 timed 3 times.
//
// Timing: CUDA events around each call, calls back to back on one stream, median (and minimum) of
// --reps after --warmup calls; L2 is NOT flushed between calls (the operands, 30 MB, would fit in
// the H200's 50 MB L2, but each call's 100 MB output, and aux, evict most of them); clocks are
// left as they are. TFLOP/s = 2 m n k / time for every row, the two-pass alternatives included.
// Each algorithm's kernels (names, grid, block, shared memory) come from a stream capture of one
// call: "sm90_xmma_..." is a Hopper (wgmma) kernel, "sm80_xmma_..." and the like an older one.
//
// Check: every algorithm's output (and GELU_AUX's aux, DGELU_BGRAD's bias gradient) is compared at
// sampled points with an FP64 reference from the same inputs (exact BF16 values made by a hash,
// identical on host and device). Bound per point: 2 BF16 ulps of the value + the FP32
// accumulation bound k 2^-24 sum|a b| (times |GELU'|) + the FP32 evaluation of GELU or GELU' at
// 2^-16 of its terms (a fast-tanh approximation, ~5e-4, would fail) + half a BF16 ulp of the
// intermediate for the two-pass alternatives; the bias gradient against the FP64 row sums of the
// BF16 D (2^-8 of the absolute sum for D's rounding). A mismatch prints the points; the program
// then exits 1 after the summary.
#include <cublasLt.h>
#include <cuda.h>  // driver types only: the entry points come through cudaGetDriverEntryPointByVersion
#include <cuda_runtime.h>
#include <cxxabi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gemm_lab.hpp"

namespace {
using gemm_lab::Gen;
using gemm_lab::gen_value;
using gemm_lab::mix;
float gen_value(const Gen& g, std::uint64_t offset) { return gen_value(g.seed, g.half, g.scale, offset); }

// ---------------------------------------------------------------------------------------------
// Errors

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "gemm_lab: %s\n", what.c_str());
  std::exit(2);
}
void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) die(std::string(what) + ": " + cudaGetErrorString(e));
}
void ck(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) die(std::string(what) + ": " + cublasLtGetStatusString(s));
}

// ---------------------------------------------------------------------------------------------
// Names of cuBLASLt's tile, stages and cluster-shape ids, read from cublasLt.h at configure time
// (CMake writes gemm_lab_names.inc: {"MATMUL_TILE", 20, "128x128"}, ...).

struct EnumName {
  const char* kind;
  unsigned value;
  const char* name;
};
constexpr EnumName kEnumNames[] = {
#include "gemm_lab_names.inc"
    {"", 0, ""},
};
std::string enum_name(const char* kind, unsigned value) {
  for (const EnumName& e : kEnumNames)
    if (e.value == value && std::strcmp(e.kind, kind) == 0) return e.name;
  return "#" + std::to_string(value);
}

// ---------------------------------------------------------------------------------------------
// Host reference

double gelu_d(double x) { return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
double gelu_grad_d(double x) {
  const double t = std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * 0.7978845608028654 * (1 + 3 * 0.044715 * x * x);
}
double ulp_bf16(double x) {
  x = std::fabs(x);
  if (x == 0) return 0;
  return std::ldexp(1.0, std::max(std::ilogb(x), -126) - 7);
}

// ---------------------------------------------------------------------------------------------
// The problems

enum class Epi { none, bias, gelu, gelu_bias, gelu_aux, gelu_aux_bias, dgelu, dgelu_bgrad };
cublasLtEpilogue_t lt_epilogue(Epi e) {
  switch (e) {
    case Epi::none: return CUBLASLT_EPILOGUE_DEFAULT;
    case Epi::bias: return CUBLASLT_EPILOGUE_BIAS;
    case Epi::gelu: return CUBLASLT_EPILOGUE_GELU;
    case Epi::gelu_bias: return CUBLASLT_EPILOGUE_GELU_BIAS;
    case Epi::gelu_aux: return CUBLASLT_EPILOGUE_GELU_AUX;
    case Epi::gelu_aux_bias: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case Epi::dgelu: return CUBLASLT_EPILOGUE_DGELU;
    case Epi::dgelu_bgrad: return CUBLASLT_EPILOGUE_DGELU_BGRAD;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}
bool has_bias(Epi e) { return e == Epi::bias || e == Epi::gelu_bias || e == Epi::gelu_aux_bias; }
bool is_gelu(Epi e) { return e == Epi::gelu || e == Epi::gelu_bias || e == Epi::gelu_aux || e == Epi::gelu_aux_bias; }
bool writes_aux(Epi e) { return e == Epi::gelu_aux || e == Epi::gelu_aux_bias; }
bool reads_aux(Epi e) { return e == Epi::dgelu || e == Epi::dgelu_bgrad; }
bool uses_aux(Epi e) { return writes_aux(e) || reads_aux(e); }

struct Operand {  // a column-major stored matrix and its op
  const void* data = nullptr;
  cublasOperation_t op = CUBLAS_OP_N;
  std::int64_t rows = 0, cols = 0, ld = 0;  // stored shape
  Gen gen;
  // op(X)(r, c) as a storage offset
  std::int64_t offset(std::int64_t r, std::int64_t c) const { return op == CUBLAS_OP_N ? r + c * ld : c + r * ld; }
};

struct Variant {
  std::string family, name, note;
  int m = 0, n = 0, k = 0;
  Operand a, b;
  void* d = nullptr;
  std::int64_t ldd = 0;
  Epi epi = Epi::none;
  const void* bias = nullptr;  // BF16 [m]
  Gen bias_gen;
  void* aux = nullptr;
  std::int64_t aux_ld = 0;
  int aux_type = -1;  // -1: not set (D's type, as blas.cu); otherwise a cudaDataType_t
  Gen aux_gen;        // the values of an aux that is read
  void* bgrad = nullptr;
  int bias_type = CUDA_R_16BF;  // of the bias or the bias gradient; blas.cu sets D's type; -1: not set
  std::size_t workspace = std::size_t(32) << 20;
  bool search = false;  // also ask per algorithm id (CUBLASLT_SEARCH_LIMITED_BY_ALGO_ID)
  double flop() const { return 2.0 * m * n * double(k); }
};

const char* type_name(int t) {
  switch (t) {
    case -1: return "unset";
    case CUDA_R_16BF: return "bf16";
    case CUDA_R_16F: return "f16";
    case CUDA_R_32F: return "f32";
  }
  return "?";
}
std::size_t type_size(int t) { return t == CUDA_R_32F ? 4 : 2; }

// ---------------------------------------------------------------------------------------------
// Context

struct Options {
  int tokens = 16384, embd = 768, hidden = 0;
  int reps = 30, warmup = 5, requested = 32, samples = 2048;
  bool brief = false, search = true;
  std::string only;
};

struct Driver {  // kernel names of a captured call
  using GetParams = CUresult (*)(CUgraphNode, CUDA_KERNEL_NODE_PARAMS*);
  using FuncName = CUresult (*)(const char**, CUfunction);
  using KernelName = CUresult (*)(const char**, CUkernel);
  GetParams get_params = nullptr;
  FuncName func_name = nullptr;
  KernelName kernel_name = nullptr;
  template <class F>
  static void load(const char* symbol, F* fn) {
    cudaDriverEntryPointQueryResult q{};
    void* p = nullptr;
    if (cudaGetDriverEntryPointByVersion(symbol, &p, CUDART_VERSION, cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      *fn = reinterpret_cast<F>(p);
    cudaGetLastError();
  }
  Driver() {
    load("cuGraphKernelNodeGetParams", &get_params);
    load("cuFuncGetName", &func_name);
    load("cuKernelGetName", &kernel_name);
  }
};

std::string demangle(const char* name) {
  if (!name) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string s = status == 0 && d ? d : name;
  std::free(d);
  return s;
}

struct Sample {
  std::int64_t i, j;
};

struct Timing {
  double median_ms = 0, min_ms = 0;
};

struct Candidate {
  cublasLtMatmulHeuristicResult_t h{};
  int rank = -1;          // in the heuristic's list; -1: from the per-id search
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;  // of the first call
  Timing t;
  std::string config, kernels;
  int failures = -1;      // -1: not checked
  double worst = 0;       // largest error / bound
};

struct Summary {
  std::string family, name;
  double flop = 0;
  int algos = 0;
  double rank0 = -1, top8 = -1, best = -1, searched = -1;
  std::string best_desc, best_kernel, rank0_kernel, error;
  bool ok = true;
};

struct Lab {
  Options opt;
  cudaStream_t stream = nullptr;
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::size_t workspace_bytes = std::size_t(128) << 20;  // the largest any variant allows
  Driver driver;
  std::vector<Summary> summaries;
  int total_failures = 0;

  // scratch for the check
  std::int64_t* d_offsets = nullptr;
  float* d_gathered = nullptr;
  double *d_sum = nullptr, *d_sum_abs = nullptr;

  void sync() { ck(cudaStreamSynchronize(stream), "cudaStreamSynchronize"); }

  void fill(int type, void* p, std::int64_t rows, std::int64_t cols, std::int64_t ld, const Gen& g) {
    gemm_lab::fill(type, p, rows, cols, ld, g, stream);
    ck(cudaGetLastError(), "fill kernel");
  }

  std::vector<float> gather(const void* src, int type, const std::vector<std::int64_t>& offsets) {
    const int count = int(offsets.size());
    ck(cudaMemcpyAsync(d_offsets, offsets.data(), offsets.size() * sizeof(std::int64_t), cudaMemcpyHostToDevice, stream), "copy");
    gemm_lab::gather(type, src, d_offsets, count, d_gathered, stream);
    ck(cudaGetLastError(), "gather kernel");
    std::vector<float> out(offsets.size());
    ck(cudaMemcpyAsync(out.data(), d_gathered, out.size() * sizeof(float), cudaMemcpyDeviceToHost, stream), "copy");
    sync();
    return out;
  }

  Timing time(const std::function<void()>& call) {
    for (int w = 0; w < opt.warmup; ++w) call();
    std::vector<cudaEvent_t> ev(std::size_t(opt.reps) + 1);
    for (auto& e : ev) ck(cudaEventCreate(&e), "cudaEventCreate");
    ck(cudaEventRecord(ev[0], stream), "cudaEventRecord");
    for (int r = 0; r < opt.reps; ++r) {
      call();
      ck(cudaEventRecord(ev[std::size_t(r) + 1], stream), "cudaEventRecord");
    }
    ck(cudaEventSynchronize(ev.back()), "cudaEventSynchronize");
    std::vector<float> ms(std::size_t(opt.reps));
    for (int r = 0; r < opt.reps; ++r) ck(cudaEventElapsedTime(&ms[std::size_t(r)], ev[std::size_t(r)], ev[std::size_t(r) + 1]), "cudaEventElapsedTime");
    for (auto& e : ev) cudaEventDestroy(e);
    std::sort(ms.begin(), ms.end());
    Timing t;
    t.min_ms = ms.front();
    t.median_ms = opt.reps % 2 ? ms[ms.size() / 2] : 0.5 * (ms[ms.size() / 2 - 1] + ms[ms.size() / 2]);
    return t;
  }

  // Kernels (and other nodes) one call launches, from a stream capture.
  std::string captured_kernels(const std::function<cublasStatus_t()>& call) {
    cudaGraph_t graph = nullptr;
    if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
      cudaGetLastError();
      return "(no capture)";
    }
    const cublasStatus_t st = call();
    const cudaError_t e = cudaStreamEndCapture(stream, &graph);
    cudaGetLastError();
    if (st != CUBLAS_STATUS_SUCCESS || e != cudaSuccess || !graph) {
      if (graph) cudaGraphDestroy(graph);
      return std::string("(capture failed: ") + cublasLtGetStatusString(st) + ", " + cudaGetErrorString(e) + ")";
    }
    std::size_t count = 0;
    cudaGraphGetNodes(graph, nullptr, &count);
    std::vector<cudaGraphNode_t> nodes(count);
    cudaGraphGetNodes(graph, nodes.data(), &count);
    std::string out;
    for (cudaGraphNode_t node : nodes) {
      cudaGraphNodeType type{};
      cudaGraphNodeGetType(node, &type);
      if (!out.empty()) out += " + ";
      if (type == cudaGraphNodeTypeKernel && driver.get_params) {
        CUDA_KERNEL_NODE_PARAMS p{};
        const char* name = nullptr;
        if (driver.get_params(reinterpret_cast<CUgraphNode>(node), &p) == CUDA_SUCCESS) {
          if (p.func && driver.func_name) driver.func_name(&name, p.func);
          if (!name && p.kern && driver.kernel_name) driver.kernel_name(&name, p.kern);
          out += demangle(name) + " <<<" + std::to_string(p.gridDimX) + "x" + std::to_string(p.gridDimY) + "x" +
                 std::to_string(p.gridDimZ) + ", " + std::to_string(p.blockDimX * p.blockDimY * p.blockDimZ) + ", smem " +
                 std::to_string(p.sharedMemBytes) + ">>>";
        } else {
          out += "kernel(?)";
        }
      } else if (type == cudaGraphNodeTypeMemset) {
        out += "memset";
      } else if (type == cudaGraphNodeTypeMemcpy) {
        out += "memcpy";
      } else {
        out += "node type " + std::to_string(int(type));
      }
    }
    cudaGraphDestroy(graph);
    return out.empty() ? "(nothing launched)" : out;
  }

  // -------------------------------------------------------------------------------------------
  // cuBLASLt descriptors, as blas.cu builds them

  struct Descs {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    ~Descs() {
      if (desc) cublasLtMatmulDescDestroy(desc);
      if (a) cublasLtMatrixLayoutDestroy(a);
      if (b) cublasLtMatrixLayoutDestroy(b);
      if (d) cublasLtMatrixLayoutDestroy(d);
    }
  };
  template <class V>
  static cublasStatus_t set(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const V& v) {
    return cublasLtMatmulDescSetAttribute(d, a, &v, sizeof(V));
  }
  // An attribute the library refuses (an aux type it does not know) is a result, not a crash.
  cublasStatus_t make(const Variant& v, Descs& s) {
    ck(cublasLtMatmulDescCreate(&s.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    ck(set(s.desc, CUBLASLT_MATMUL_DESC_TRANSA, v.a.op), "TRANSA");
    ck(set(s.desc, CUBLASLT_MATMUL_DESC_TRANSB, v.b.op), "TRANSB");
    ck(set(s.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, lt_epilogue(v.epi)), "EPILOGUE");
    if (has_bias(v.epi) || v.epi == Epi::dgelu_bgrad) {
      const void* p = v.epi == Epi::dgelu_bgrad ? v.bgrad : v.bias;
      ck(set(s.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, p), "BIAS_POINTER");
      if (v.bias_type != -1) {  // blas.cu: the bias has C's type
        const std::int32_t t = v.bias_type;
        ck(set(s.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, t), "BIAS_DATA_TYPE");
      }
    }
    if (uses_aux(v.epi)) {
      ck(set(s.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<const void*>(v.aux)), "AUX_POINTER");
      ck(set(s.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, v.aux_ld), "AUX_LD");
      if (v.aux_type != -1) {
        const std::int32_t t = v.aux_type;
        const cublasStatus_t st = set(s.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, t);
        if (st != CUBLAS_STATUS_SUCCESS) return st;
      }
    }
    ck(cublasLtMatrixLayoutCreate(&s.a, CUDA_R_16BF, std::uint64_t(v.a.rows), std::uint64_t(v.a.cols), v.a.ld), "layout A");
    ck(cublasLtMatrixLayoutCreate(&s.b, CUDA_R_16BF, std::uint64_t(v.b.rows), std::uint64_t(v.b.cols), v.b.ld), "layout B");
    ck(cublasLtMatrixLayoutCreate(&s.d, CUDA_R_16BF, std::uint64_t(v.m), std::uint64_t(v.n), v.ldd), "layout D");
    return CUBLAS_STATUS_SUCCESS;
  }
  cublasLtMatmulPreference_t preference(std::size_t max_workspace) {
    cublasLtMatmulPreference_t pref = nullptr;
    ck(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    const std::uint64_t ws = max_workspace;
    ck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws), "pref ws");
    const std::uint32_t align = 256;  // blas.cu: the operands' alignment (cudaMalloc'd, 256)
    for (auto a : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                   CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      ck(cublasLtMatmulPreferenceSetAttribute(pref, a, &align, sizeof align), "pref alignment");
    return pref;
  }
  cublasStatus_t matmul(const Variant& v, const Descs& s, const cublasLtMatmulAlgo_t& algo) {
    const float alpha = 1.0f, beta = 0.0f;
    return cublasLtMatmul(handle, s.desc, &alpha, v.a.data, s.a, v.b.data, s.b, &beta, v.d, s.d, v.d, s.d, &algo, workspace,
                          v.workspace, stream);
  }

  static std::string config_string(const cublasLtMatmulHeuristicResult_t& h, bool compact = false) {
    auto get = [&](cublasLtMatmulAlgoConfigAttributes_t a, auto zero) {
      auto value = zero;
      std::size_t written = 0;
      cublasLtMatmulAlgoConfigGetAttribute(&h.algo, a, &value, sizeof value, &written);
      return value;
    };
    const std::int32_t id = get(CUBLASLT_ALGO_CONFIG_ID, std::int32_t(0));
    const std::uint32_t tile = get(CUBLASLT_ALGO_CONFIG_TILE_ID, std::uint32_t(0));
    const std::int32_t splitk = get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM, std::int32_t(0));
    const std::uint32_t red = get(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, std::uint32_t(0));
    const std::uint32_t swz = get(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, std::uint32_t(0));
    const std::uint32_t custom = get(CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, std::uint32_t(0));
    const std::uint32_t stages = get(CUBLASLT_ALGO_CONFIG_STAGES_ID, std::uint32_t(0));
    const std::uint16_t inner = get(CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, std::uint16_t(0));
    const std::uint16_t cluster = get(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, std::uint16_t(0));
    char buf[320];
    if (compact) {
      std::snprintf(buf, sizeof buf, "id %d %s st %s sk %d swz %u cl %s", id, enum_name("MATMUL_TILE", tile).c_str(),
                    enum_name("MATMUL_STAGES", stages).c_str(), splitk, swz, enum_name("CLUSTER_SHAPE", cluster).c_str());
      return buf;
    }
    std::snprintf(buf, sizeof buf, "id %3d tile %-9s stages %-8s splitK %2d red %u swz %u custom %u inner %u cluster %-7s ws %5.1f MiB waves %.2f",
                  id, enum_name("MATMUL_TILE", tile).c_str(), enum_name("MATMUL_STAGES", stages).c_str(), splitk, red, swz, custom,
                  unsigned(inner), enum_name("CLUSTER_SHAPE", cluster).c_str(), double(h.workspaceSize) / (1 << 20),
                  double(h.wavesCount));
    return buf;
  }

  // -------------------------------------------------------------------------------------------
  // The check

  std::vector<Sample> samples(const Variant& v) {
    std::vector<Sample> s = {{0, 0}, {v.m - 1, 0}, {0, v.n - 1}, {v.m - 1, v.n - 1}, {v.m / 2, v.n / 2}};
    for (int q = 0; int(s.size()) < opt.samples; ++q) {
      const std::uint64_t h = mix(0x5eedull * 1000003 + std::uint64_t(q));
      s.push_back({std::int64_t(h % std::uint64_t(v.m)), std::int64_t((h >> 32) % std::uint64_t(v.n))});
    }
    return s;
  }

  struct Expect {
    double d = 0, d_tol = 0;      // D
    double aux = 0, aux_tol = 0;  // the aux a GELU_AUX epilogue writes (the GELU input)
  };
  // two_pass: the product went through BF16 before the element-wise pass (the alternatives).
  Expect expect(const Variant& v, const Sample& s, bool two_pass) {
    double p = 0, sum_abs = 0;
    for (std::int64_t kk = 0; kk < v.k; ++kk) {
      const double x = gen_value(v.a.gen, std::uint64_t(v.a.offset(s.i, kk)));
      const double y = gen_value(v.b.gen, std::uint64_t(v.b.offset(kk, s.j)));
      p += x * y;
      sum_abs += std::fabs(x * y);
    }
    const double acc = double(v.k) * std::ldexp(1.0, -24) * sum_abs;  // FP32 accumulation, any order
    Expect e;
    const double bias = has_bias(v.epi) ? double(gen_value(v.bias_gen, std::uint64_t(s.i))) : 0.0;
    const double x = p + bias;
    // The GELU (or its derivative) evaluated in FP32: 2^-16 relative to its terms, far above FP32's
    // rounding and far below a fast-tanh approximation's error (~5e-4).
    const double act = std::ldexp(1.0, -16);
    if (is_gelu(v.epi)) {  // an error dx in x moves GELU(x) by about GELU'(x) dx (|GELU''| <= 0.8, dx < 1e-2)
      const double g = gelu_d(x), f = std::fabs(gelu_grad_d(x)) + 0.01;
      e.d = g;
      e.d_tol = 2 * ulp_bf16(g) + f * acc + act * (1 + std::fabs(x)) + (two_pass ? 0.5 * f * ulp_bf16(x) : 0.0);
      e.aux = x;
      e.aux_tol = 2 * ulp_bf16(x) + acc;
    } else if (reads_aux(v.epi)) {  // D = p GELU'(a): errors in p scale by |GELU'(a)|
      const double a = gen_value(v.aux_gen, std::uint64_t(s.i + s.j * v.aux_ld));
      const double g = gelu_grad_d(a), f = std::fabs(g);
      e.d = p * g;
      e.d_tol = 2 * ulp_bf16(e.d) + f * acc + act * (1 + a * a) * std::fabs(p) + (two_pass ? 0.5 * f * ulp_bf16(p) : 0.0);
    } else {
      e.d = x;
      e.d_tol = 2 * ulp_bf16(x) + acc;
    }
    return e;
  }

  // Compares D (and the aux or bias gradient the epilogue writes) with the reference; prints the
  // first mismatches. Returns the number of mismatching points and the worst error / bound.
  std::pair<int, double> check(const Variant& v, const std::vector<Sample>& pts, const std::vector<Expect>& want,
                               const void* d_out, const char* label) {
    std::vector<std::int64_t> off;
    for (const Sample& s : pts) off.push_back(s.i + s.j * v.ldd);
    const std::vector<float> got = gather(d_out, CUDA_R_16BF, off);
    std::vector<float> got_aux;
    if (writes_aux(v.epi) && d_out == v.d) {
      std::vector<std::int64_t> aoff;
      for (const Sample& s : pts) aoff.push_back(s.i + s.j * v.aux_ld);
      got_aux = gather(v.aux, v.aux_type == -1 ? CUDA_R_16BF : v.aux_type, aoff);
    }
    int bad = 0;
    double worst = 0;
    auto compare = [&](const char* what, const Sample& s, double g, double w, double tol) {
      const double err = std::fabs(g - w);
      const double ratio = tol > 0 ? err / tol : (err == 0 ? 0 : INFINITY);
      if (!(ratio <= 1.0)) {
        if (bad < 5)
          std::printf("    MISMATCH %s %s at (%lld, %lld): got %.8g, want %.8g, |error| %.3g > bound %.3g\n", label, what,
                      (long long)s.i, (long long)s.j, g, w, err, tol);
        ++bad;
      }
      if (std::isnan(ratio)) worst = INFINITY;
      else worst = std::max(worst, ratio);
    };
    for (std::size_t q = 0; q < pts.size(); ++q) {
      compare("D", pts[q], got[q], want[q].d, want[q].d_tol);
      if (!got_aux.empty()) compare("aux", pts[q], got_aux[q], want[q].aux, want[q].aux_tol);
    }
    if (v.epi == Epi::dgelu_bgrad && d_out == v.d) {  // bgrad[i] = sum_j of the unrounded D(i, j)
      gemm_lab::row_sums(v.d, v.m, v.n, v.ldd, d_sum, d_sum_abs, stream);
      ck(cudaGetLastError(), "row sums kernel");
      std::vector<double> sum(std::size_t(v.m)), sum_abs(std::size_t(v.m));
      ck(cudaMemcpyAsync(sum.data(), d_sum, sum.size() * sizeof(double), cudaMemcpyDeviceToHost, stream), "copy");
      ck(cudaMemcpyAsync(sum_abs.data(), d_sum_abs, sum_abs.size() * sizeof(double), cudaMemcpyDeviceToHost, stream), "copy");
      std::vector<std::int64_t> rows(std::size_t(v.m));
      for (int i = 0; i < v.m; ++i) rows[std::size_t(i)] = i;
      const std::vector<float> bgrad = gather(v.bgrad, CUDA_R_16BF, rows);
      for (int i = 0; i < v.m; ++i) {
        // D's rounding is at most half an ulp of each term (2^-8 relative), the sum's FP32 error
        // n 2^-24 of the absolute sum, the bias gradient's own rounding 2 ulps.
        const double tol = 2 * ulp_bf16(sum[std::size_t(i)]) + (std::ldexp(1.0, -8) + v.n * std::ldexp(1.0, -24)) * sum_abs[std::size_t(i)];
        compare("bias gradient", {i, 0}, bgrad[std::size_t(i)], sum[std::size_t(i)], tol);
      }
      if (bad) {  // which sum is it then? That of the product before GELU' (exact: sum_j p = A (B 1))
        std::vector<double> b_sum(std::size_t(v.k), 0.0);
        for (std::int64_t kk = 0; kk < v.k; ++kk)
          for (std::int64_t j = 0; j < v.n; ++j) b_sum[std::size_t(kk)] += gen_value(v.b.gen, std::uint64_t(v.b.offset(kk, j)));
        std::vector<double> rel_post, rel_pre;
        for (int i = 0; i < v.m; ++i) {
          double pre = 0;
          for (std::int64_t kk = 0; kk < v.k; ++kk) pre += gen_value(v.a.gen, std::uint64_t(v.a.offset(i, kk))) * b_sum[std::size_t(kk)];
          const double g = bgrad[std::size_t(i)], post = sum[std::size_t(i)];
          rel_post.push_back(std::fabs(g - post) / std::max(std::fabs(post), 1e-30));
          rel_pre.push_back(std::fabs(g - pre) / std::max(std::fabs(pre), 1e-30));
        }
        std::sort(rel_post.begin(), rel_post.end());
        std::sort(rel_pre.begin(), rel_pre.end());
        std::printf("    bias gradient, median relative difference to the row sums of D (after GELU'): %.3g; to those of the product "
                    "before GELU': %.3g\n",
                    rel_post[rel_post.size() / 2], rel_pre[rel_pre.size() / 2]);
      }
    }
    return {bad, worst};
  }

  // -------------------------------------------------------------------------------------------
  // One variant: the heuristic's list (and optionally the per-id search), each timed and checked.

  void prepare_inputs(const Variant& v) {
    if (reads_aux(v.epi)) {  // the GELU input the forward kept
      const int t = v.aux_type == -1 ? CUDA_R_16BF : v.aux_type;
      fill(t, v.aux, v.m, v.n, v.aux_ld, v.aux_gen);
    }
    sync();
  }
  void poison_outputs(const Variant& v) {  // NaN (0xFFFF) in whatever the call must write
    ck(cudaMemsetAsync(v.d, 0xFF, std::size_t(v.ldd) * std::size_t(v.n) * 2, stream), "memset D");
    if (writes_aux(v.epi))
      ck(cudaMemsetAsync(v.aux, 0xFF, std::size_t(v.aux_ld) * std::size_t(v.n) * type_size(v.aux_type), stream), "memset aux");
    if (v.epi == Epi::dgelu_bgrad) ck(cudaMemsetAsync(v.bgrad, 0xFF, std::size_t(v.m) * 2, stream), "memset bgrad");
  }

  void evaluate(Candidate& c, const Variant& v, const Descs& s, const std::vector<Sample>& pts, const std::vector<Expect>& want) {
    c.config = config_string(c.h);
    if (c.h.workspaceSize > v.workspace) {
      c.status = CUBLAS_STATUS_NOT_SUPPORTED;
      return;
    }
    poison_outputs(v);
    c.status = matmul(v, s, c.h.algo);
    if (c.status != CUBLAS_STATUS_SUCCESS) {
      cudaGetLastError();
      return;
    }
    sync();
    cublasStatus_t failed = CUBLAS_STATUS_SUCCESS;
    c.t = time([&] {
      const cublasStatus_t st = matmul(v, s, c.h.algo);
      if (st != CUBLAS_STATUS_SUCCESS) failed = st;
    });
    ck(cudaGetLastError(), "after timing");
    if (failed != CUBLAS_STATUS_SUCCESS) {
      c.status = failed;
      return;
    }
    const auto r = check(v, pts, want, v.d, "");
    c.failures = r.first;
    c.worst = r.second;
    c.kernels = captured_kernels([&] { return matmul(v, s, c.h.algo); });
  }

  void print_candidate(const Candidate& c, const Variant& v) {
    char rank[16];
    if (c.rank >= 0) std::snprintf(rank, sizeof rank, "%2d", c.rank);
    else std::snprintf(rank, sizeof rank, " +");
    if (c.status != CUBLAS_STATUS_SUCCESS) {
      std::printf("  %s  %s  does not run: %s\n", rank, c.config.c_str(), cublasLtGetStatusString(c.status));
      return;
    }
    std::printf("  %s  %8.1f us %6.1f TFLOP/s (min %7.1f us)  %s  check %s (worst %.2f of bound)\n", rank, 1e3 * c.t.median_ms,
                v.flop() / (c.t.median_ms * 1e-3) / 1e12, 1e3 * c.t.min_ms, c.config.c_str(), c.failures == 0 ? "ok" : "FAILED",
                c.worst);
    std::printf("        kernels: %s\n", c.kernels.c_str());
  }

  // Algorithm ids that can run these types, with whether each supports the variant's epilogue;
  // those that do are asked for their own best configurations.
  std::vector<Candidate> search(const Variant& v, const Descs& s, const std::vector<Candidate>& listed) {
    std::vector<int> ids(512);
    int count = 0;
    ck(cublasLtMatmulAlgoGetIds(handle, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF,
                                int(ids.size()), ids.data(), &count),
       "cublasLtMatmulAlgoGetIds");
    const std::uint32_t epi = std::uint32_t(lt_epilogue(v.epi));
    std::printf("  algorithm ids for BF16 x BF16 -> BF16 (FP32 compute): %d; supporting this epilogue (cap EPILOGUE_MASK):", count);
    std::vector<Candidate> found;
    std::vector<int> supporting;
    std::string masks;
    auto hex = [](std::uint32_t x) {
      char b[16];
      std::snprintf(b, sizeof b, "%x", x);
      return std::string(b);
    };
    for (int q = 0; q < count; ++q) {
      cublasLtMatmulAlgo_t algo;
      if (cublasLtMatmulAlgoInit(handle, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, ids[std::size_t(q)],
                                 &algo) != CUBLAS_STATUS_SUCCESS)
        continue;
      std::uint32_t mask = 0;
      std::size_t written = 0;
      cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_EPILOGUE_MASK, &mask, sizeof mask, &written);
      if ((mask & epi) == epi) supporting.push_back(ids[std::size_t(q)]);
      masks += " " + std::to_string(ids[std::size_t(q)]) + ":" + hex(mask);
    }
    for (int id : supporting) std::printf(" %d", id);
    std::printf("\n    (id:EPILOGUE_MASK of each id:%s; this epilogue is %s)\n", masks.c_str(), hex(epi).c_str());
    for (int id : supporting) {
      cublasLtMatmulPreference_t pref = preference(v.workspace);
      const std::uint32_t mode = CUBLASLT_SEARCH_LIMITED_BY_ALGO_ID;
      ck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_SEARCH_MODE, &mode, sizeof mode), "pref search mode");
      std::vector<cublasLtMatmulHeuristicResult_t> res(8);
      ck(cublasLtMatmulAlgoInit(handle, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, id, &res[0].algo),
         "cublasLtMatmulAlgoInit");
      int n = 0;
      const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle, s.desc, s.a, s.b, s.d, s.d, pref, int(res.size()), res.data(), &n);
      cublasLtMatmulPreferenceDestroy(pref);
      if (st != CUBLAS_STATUS_SUCCESS || n == 0) {
        // the id's default configuration, if the library accepts it for this problem
        cublasLtMatmulHeuristicResult_t h{};
        ck(cublasLtMatmulAlgoInit(handle, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, id, &h.algo),
           "cublasLtMatmulAlgoInit");
        const cublasStatus_t chk = cublasLtMatmulAlgoCheck(handle, s.desc, s.a, s.b, s.d, s.d, &h.algo, &h);
        std::printf("  id %d: heuristic limited to it: %s (%d); its default configuration: %s\n", id, cublasLtGetStatusString(st), n,
                    cublasLtGetStatusString(chk));
        if (chk != CUBLAS_STATUS_SUCCESS) continue;
        res[0] = h;
        res[0].state = CUBLAS_STATUS_SUCCESS;
        n = 1;
      }
      for (int q = 0; q < n; ++q) {
        if (res[std::size_t(q)].state != CUBLAS_STATUS_SUCCESS) continue;
        bool seen = false;
        for (const Candidate& c : listed) seen |= std::memcmp(&c.h.algo, &res[std::size_t(q)].algo, sizeof(cublasLtMatmulAlgo_t)) == 0;
        for (const Candidate& c : found) seen |= std::memcmp(&c.h.algo, &res[std::size_t(q)].algo, sizeof(cublasLtMatmulAlgo_t)) == 0;
        if (seen) continue;
        Candidate c;
        c.h = res[std::size_t(q)];
        found.push_back(c);
      }
    }
    return found;
  }

  void run_variant(const Variant& v) {
    Summary sum;
    sum.family = v.family, sum.name = v.name, sum.flop = v.flop();
    std::printf("\n=== %s: %s\n", v.family.c_str(), v.name.c_str());
    std::printf("    m %d n %d k %d, A %s [%lld x %lld] ld %lld, B %s [%lld x %lld] ld %lld, D bf16 ld %lld, epilogue %d, aux ld %lld type %s, "
                "workspace %zu MiB%s%s\n",
                v.m, v.n, v.k, v.a.op == CUBLAS_OP_T ? "T" : "N", (long long)v.a.rows, (long long)v.a.cols, (long long)v.a.ld,
                v.b.op == CUBLAS_OP_T ? "T" : "N", (long long)v.b.rows, (long long)v.b.cols, (long long)v.b.ld, (long long)v.ldd,
                int(lt_epilogue(v.epi)), (long long)(uses_aux(v.epi) ? v.aux_ld : 0), uses_aux(v.epi) ? type_name(v.aux_type) : "-",
                v.workspace >> 20, v.note.empty() ? "" : "; ", v.note.c_str());
    Descs s;
    const cublasStatus_t made = make(v, s);
    if (made != CUBLAS_STATUS_SUCCESS) {
      sum.error = std::string("descriptor refused: ") + cublasLtGetStatusString(made);
      std::printf("  %s\n", sum.error.c_str());
      summaries.push_back(sum);
      return;
    }
    prepare_inputs(v);
    const std::vector<Sample> pts = samples(v);
    std::vector<Expect> want;
    for (const Sample& p : pts) want.push_back(expect(v, p, false));

    cublasLtMatmulPreference_t pref = preference(v.workspace);
    std::vector<cublasLtMatmulHeuristicResult_t> res(std::size_t(opt.requested));
    int n = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle, s.desc, s.a, s.b, s.d, s.d, pref, opt.requested, res.data(), &n);
    cublasLtMatmulPreferenceDestroy(pref);
    std::vector<Candidate> cands;
    if (st != CUBLAS_STATUS_SUCCESS || n == 0) {
      sum.error = std::string("no algorithm from the heuristic: ") + cublasLtGetStatusString(st);
      std::printf("  %s\n", sum.error.c_str());
    }
    for (int q = 0; q < n; ++q) {
      if (res[std::size_t(q)].state != CUBLAS_STATUS_SUCCESS) continue;
      Candidate c;
      c.h = res[std::size_t(q)];
      c.rank = q;
      evaluate(c, v, s, pts, want);
      if (!opt.brief) print_candidate(c, v);
      cands.push_back(c);
    }
    std::printf("  heuristic: %d algorithms (requested %d)\n", n, opt.requested);
    std::vector<Candidate> extra;
    if (v.search && opt.search) {
      extra = search(v, s, cands);
      std::printf("  per-id search: %zu configurations not in the heuristic's list\n", extra.size());
      for (Candidate& c : extra) {
        evaluate(c, v, s, pts, want);
        if (!opt.brief) print_candidate(c, v);
      }
    }
    auto consider = [&](const Candidate& c) {
      if (c.status != CUBLAS_STATUS_SUCCESS) return;
      if (c.failures != 0) {
        sum.ok = false;
        total_failures += c.failures;
        return;
      }
      const double t = c.t.median_ms;
      if (c.rank == 0) sum.rank0 = t, sum.rank0_kernel = c.kernels;
      if (c.rank >= 0 && c.rank < 8 && (sum.top8 < 0 || t < sum.top8)) sum.top8 = t;
      if (c.rank < 0 && (sum.searched < 0 || t < sum.searched)) sum.searched = t;
      if (sum.best < 0 || t < sum.best) {
        sum.best = t;
        sum.best_desc = (c.rank >= 0 ? "rank " + std::to_string(c.rank) : std::string("search")) + ": " + config_string(c.h, true);
        sum.best_kernel = c.kernels;
      }
      ++sum.algos;
    };
    for (const Candidate& c : cands) consider(c);
    for (const Candidate& c : extra) consider(c);
    if (!sum.ok) std::printf("  FAILED: an algorithm's result does not match the reference (above)\n");
    summaries.push_back(sum);
    for (const std::vector<Candidate>* list : {&cands, &extra})
      for (const Candidate& c : *list)
        if (c.status == CUBLAS_STATUS_SUCCESS && c.failures == 0 && c.t.median_ms == sum.best) best_algo[key(v)] = c.h.algo;
    for (const Candidate& c : cands)
      if (c.rank == 0 && c.status == CUBLAS_STATUS_SUCCESS && c.failures == 0) rank0_algo[key(v)] = c.h.algo;
  }
  static std::string key(const Variant& v) { return v.family + " | " + v.name; }
  // per variant: its fastest correct algorithm and the heuristic's first, for the two-pass runs
  std::map<std::string, cublasLtMatmulAlgo_t> best_algo, rank0_algo;

  // -------------------------------------------------------------------------------------------
  // Two passes: the plain product (the variant `plain`, with its fastest or its rank-0 algorithm)
  // into D, then the element-wise kernel; timed together and the kernel alone.
  //   backward: D = dY W^T (no epilogue), then dfch = D * GELU'(fch) in place.
  //   forward: fch = X W_fc + b (BIAS epilogue, into the aux buffer), then gelu = GELU(fch) into D.
  void run_two_pass(const Variant& plain, const Variant& fused, bool forward, const char* which) {
    Summary sum;
    sum.family = fused.family;
    sum.name = std::string(forward ? "BIAS product + GELU kernel" : "plain product + DGELU kernel") + " (" + which + ")";
    sum.flop = fused.flop();
    std::printf("\n=== %s: %s\n", sum.family.c_str(), sum.name.c_str());
    auto& algos = std::string(which) == "rank 0" ? rank0_algo : best_algo;
    if (!algos.count(key(plain))) {
      sum.error = "no algorithm for " + plain.name;
      std::printf("  %s\n", sum.error.c_str());
      summaries.push_back(sum);
      return;
    }
    const cublasLtMatmulAlgo_t algo = algos[key(plain)];
    Variant p = plain;
    if (forward) p.d = fused.aux, p.ldd = fused.aux_ld;  // the product writes fch
    Descs s;
    ck(make(p, s), "descriptors");
    prepare_inputs(fused);  // backward: fch
    poison_outputs(fused);
    const std::int64_t count8 = std::int64_t(fused.m) * fused.n / 8;
    const int blocks = sm_count * 16;
    auto kernel = [&](void* out) {
      if (forward)
        gemm_lab::gelu(out, fused.aux, count8, blocks, stream);
      else
        gemm_lab::dgelu(out, plain.d, fused.aux, count8, blocks, stream);
    };
    const Timing both = time([&] {
      ck(matmul(p, s, algo), "cublasLtMatmul");
      kernel(fused.d);  // backward: in place (plain.d == fused.d)
    });
    ck(cudaGetLastError(), "two-pass");
    const std::vector<Sample> pts = samples(fused);
    std::vector<Expect> want;
    for (const Sample& q : pts) want.push_back(expect(fused, q, true));
    // (forward: the check also reads the pre-activation the product wrote, as GELU_AUX's aux)
    const auto r = check(fused, pts, want, fused.d, "two-pass");
    if (r.first) sum.ok = false, total_failures += r.first;
    // the kernel alone, into a separate buffer (the product's output stays as it is)
    const Timing alone = time([&] { kernel(scratch_out); });
    ck(cudaGetLastError(), "element-wise kernel");
    const double bytes = double(fused.m) * fused.n * 2 * (forward ? 2 : 3);
    std::printf("  product + kernel %8.1f us %6.1f TFLOP/s (min %.1f us); kernel alone %.1f us (%.2f TB/s); check %s (worst %.2f of bound)\n",
                1e3 * both.median_ms, fused.flop() / (both.median_ms * 1e-3) / 1e12, 1e3 * both.min_ms, 1e3 * alone.median_ms,
                bytes / (alone.median_ms * 1e-3) / 1e12, r.first ? "FAILED" : "ok", r.second);
    sum.best = both.median_ms;
    sum.algos = 1;
    sum.best_desc = "product " + config_string(
                                     [&] {
                                       cublasLtMatmulHeuristicResult_t h{};
                                       h.algo = algo;
                                       return h;
                                     }(),
                                     true);
    summaries.push_back(sum);
  }
  void* scratch_out = nullptr;
  int sm_count = 132;

  void print_summary() {
    // the first kernel's name only (the listing above has them all, with grids)
    auto first = [](const std::string& k) {
      std::string n = k.substr(0, k.find(" <<<"));
      return n.size() > 120 ? n.substr(0, 117) + "..." : n;
    };
    std::printf("\nkernels (first of each call) of rank 0 (blas.cu deterministic) and of the fastest:\n");
    for (const Summary& s : summaries) {
      if (s.rank0_kernel.empty() && s.best_kernel.empty()) continue;
      std::printf("  %s / %s:\n", s.family.c_str(), s.name.c_str());
      if (!s.rank0_kernel.empty()) std::printf("      rank 0:  %s\n", first(s.rank0_kernel).c_str());
      if (!s.best_kernel.empty() && s.best_kernel != s.rank0_kernel) std::printf("      fastest: %s\n", first(s.best_kernel).c_str());
    }
    std::printf("\n=== summary (median us, TFLOP/s = 2mnk / time; rank 0 = what blas.cu runs deterministic, top-8 = the best of what "
                "blas.cu's tuning times, best = over everything listed)\n");
    std::printf("| product | variant | algos | rank 0 us (TFLOP/s) | top-8 best us | searched best us | best us (TFLOP/s) | check | best algorithm |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|\n");
    auto cell = [](double ms, double flop) {
      if (ms < 0) return std::string("-");
      char b[64];
      std::snprintf(b, sizeof b, "%.1f (%.0f)", 1e3 * ms, flop / (ms * 1e-3) / 1e12);
      return std::string(b);
    };
    auto us = [](double ms) {
      if (ms < 0) return std::string("-");
      char b[32];
      std::snprintf(b, sizeof b, "%.1f", 1e3 * ms);
      return std::string(b);
    };
    for (const Summary& s : summaries) {
      std::printf("| %s | %s | %d | %s | %s | %s | %s | %s | %s |\n", s.family.c_str(), s.name.c_str(), s.algos, cell(s.rank0, s.flop).c_str(),
                  us(s.top8).c_str(), us(s.searched).c_str(), cell(s.best, s.flop).c_str(), s.ok ? "ok" : "FAILED",
                  s.error.empty() ? s.best_desc.c_str() : s.error.c_str());
    }
  }
};

int parse_int(const char* s, const char* flag) {
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  if (!end || *end || v <= 0 || v > (1l << 30)) die(std::string(flag) + ": not a positive integer: " + s);
  return int(v);
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // piped through tee: keep what was printed if it dies
  Lab lab;
  Options& o = lab.opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--tokens") o.tokens = parse_int(next(), "--tokens");
    else if (a == "--embd") o.embd = parse_int(next(), "--embd");
    else if (a == "--hidden") o.hidden = parse_int(next(), "--hidden");
    else if (a == "--reps") o.reps = parse_int(next(), "--reps");
    else if (a == "--warmup") o.warmup = parse_int(next(), "--warmup");
    else if (a == "--requested") o.requested = parse_int(next(), "--requested");
    else if (a == "--samples") o.samples = parse_int(next(), "--samples");
    else if (a == "--only") o.only = next();
    else if (a == "--brief") o.brief = true;
    else if (a == "--no-search") o.search = false;
    else if (a == "-h" || a == "--help") {
      std::printf("usage: gemm_lab [--tokens N] [--embd C] [--hidden F] [--reps R] [--warmup W] [--requested K] [--samples S] "
                  "[--only SUBSTRING] [--brief] [--no-search]\n");
      return 0;
    } else {
      die("unknown argument " + a + " (--help)");
    }
  }
  if (o.hidden == 0) o.hidden = 4 * o.embd;
  if (o.reps < 20) std::printf("note: --reps %d (< 20)\n", o.reps);
  const int N = o.tokens, C = o.embd, F = o.hidden;
  if (N % 8 || C % 8 || F % 8) die("tokens, embd and hidden must be multiples of 8");

  int dev = 0;
  ck(cudaGetDevice(&dev), "cudaGetDevice");
  cudaDeviceProp prop{};
  ck(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
  lab.sm_count = prop.multiProcessorCount;
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  std::printf("device: %s, %d SMs, L2 %d MiB; CUDA runtime %d, driver %d; cuBLASLt %zu\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20, runtime, driver, cublasLtGetVersion());
  std::printf("GPT-2 MLP: N %d tokens, C %d, F %d; %d warm-up + %d timed calls per algorithm (median), L2 not flushed, clocks as they are\n",
              N, C, F, o.warmup, o.reps);
  ck(cudaStreamCreateWithFlags(&lab.stream, cudaStreamNonBlocking), "cudaStreamCreate");
  ck(cublasLtCreate(&lab.handle), "cublasLtCreate");
  ck(cudaMalloc(&lab.workspace, lab.workspace_bytes), "cudaMalloc workspace");

  // Buffers (cudaMalloc: 256-byte aligned, as blas.cu's alignment preferences assume).
  auto alloc = [](std::size_t bytes) {
    void* p = nullptr;
    ck(cudaMalloc(&p, bytes), "cudaMalloc");
    ck(cudaMemset(p, 0, bytes), "cudaMemset");
    return p;
  };
  const std::size_t NF = std::size_t(N) * F;
  const std::int64_t pad = 64;
  void* w_proj = alloc(std::size_t(F) * C * 2);  // W_fcproj row-major [F, C]
  void* dy = alloc(std::size_t(N) * C * 2);      // d_res16 row-major [N, C]
  void* w_fc = alloc(std::size_t(C) * F * 2);    // W_fc row-major [C, F]
  void* x = alloc(std::size_t(N) * C * 2);       // ln2 row-major [N, C]
  void* bias = alloc(std::size_t(std::max(N, F)) * 2);
  void* d = alloc(NF * 2);
  void* aux = alloc(std::size_t(N + pad) * std::size_t(F + pad) * 4);  // room for a padded ld and FP32
  void* bgrad = alloc(std::size_t(std::max(N, F)) * 4);
  lab.scratch_out = alloc(NF * 2);
  lab.d_offsets = static_cast<std::int64_t*>(alloc(std::size_t(std::max(o.samples, std::max(N, F))) * 8));
  lab.d_gathered = static_cast<float*>(alloc(std::size_t(std::max(o.samples, std::max(N, F))) * 4));
  lab.d_sum = static_cast<double*>(alloc(std::size_t(std::max(N, F)) * 8));
  lab.d_sum_abs = static_cast<double*>(alloc(std::size_t(std::max(N, F)) * 8));

  // Values: operands in (-1, 1) and (-1/8, 1/8) so that the products have a spread of about 1.1
  // (the GELU's interesting range), the GELU input in [-5, 5], the bias in [-1/2, 1/2] (not
  // zero: the check then sees that it is added).
  const Gen g_w_proj{1, 127, 1.0f / 1024}, g_dy{2, 127, 1.0f / 128}, g_w_fc{3, 127, 1.0f / 1024}, g_x{4, 127, 1.0f / 128};
  const Gen g_bias{5, 127, 1.0f / 256}, g_fch{6, 160, 1.0f / 32};
  // Column-major views (blas.cu): row-major [R, Cc] is column-major [Cc, R] with the same ld.
  lab.fill(CUDA_R_16BF, w_proj, C, F, C, g_w_proj);
  lab.fill(CUDA_R_16BF, dy, C, N, C, g_dy);
  lab.fill(CUDA_R_16BF, w_fc, F, C, F, g_w_fc);
  lab.fill(CUDA_R_16BF, x, C, N, C, g_x);
  lab.fill(CUDA_R_16BF, bias, std::max(N, F), 1, std::max(N, F), g_bias);
  lab.sync();

  std::vector<Variant> variants;
  // Backward dX of the MLP projection, as linear_backward calls blas.cu.
  Variant bwd;
  bwd.family = "bwd dX";  // d_res16 [N, C] W_fcproj^T
  bwd.m = F, bwd.n = N, bwd.k = C;
  bwd.a = {w_proj, CUBLAS_OP_T, C, F, C, g_w_proj};
  bwd.b = {dy, CUBLAS_OP_N, C, N, C, g_dy};
  bwd.d = d, bwd.ldd = F;
  bwd.aux = aux, bwd.aux_ld = F, bwd.aux_gen = g_fch, bwd.bgrad = bgrad;
  auto add = [&](Variant v, const std::string& name, auto&& change) {
    v.name = name;
    change(v);
    variants.push_back(v);
  };
  add(bwd, "no epilogue", [](Variant&) {});
  add(bwd, "DGELU (the trainer's)", [](Variant& v) { v.epi = Epi::dgelu, v.search = true; });
  add(bwd, "DGELU_BGRAD (bias gradient too)", [](Variant& v) { v.epi = Epi::dgelu_bgrad, v.search = true; });
  add(bwd, "DGELU_BGRAD, bias type unset", [](Variant& v) { v.epi = Epi::dgelu_bgrad, v.bias_type = -1; });
  add(bwd, "DGELU, aux type set to BF16 explicitly", [](Variant& v) { v.epi = Epi::dgelu, v.aux_type = CUDA_R_16BF; });
  add(bwd, "DGELU, aux FP16", [](Variant& v) { v.epi = Epi::dgelu, v.aux_type = CUDA_R_16F; });
  add(bwd, "DGELU, aux FP32", [](Variant& v) { v.epi = Epi::dgelu, v.aux_type = CUDA_R_32F; });
  add(bwd, "DGELU, aux ld F + 64", [&](Variant& v) { v.epi = Epi::dgelu, v.aux_ld = F + pad; });
  add(bwd, "DGELU, workspace 0", [](Variant& v) { v.epi = Epi::dgelu, v.workspace = 0; });
  add(bwd, "DGELU, workspace 4 MiB", [](Variant& v) { v.epi = Epi::dgelu, v.workspace = std::size_t(4) << 20; });
  add(bwd, "DGELU, workspace 128 MiB", [](Variant& v) { v.epi = Epi::dgelu, v.workspace = std::size_t(128) << 20; });
  // The same product with D transposed (column-major [N, F]: m = N, n = F), aux likewise: not what
  // the trainer stores, but another kernel family may serve the epilogue at that shape.
  Variant bwd_t = bwd;
  bwd_t.m = N, bwd_t.n = F;
  bwd_t.a = {dy, CUBLAS_OP_T, C, N, C, g_dy};
  bwd_t.b = {w_proj, CUBLAS_OP_N, C, F, C, g_w_proj};
  bwd_t.ldd = N, bwd_t.aux_ld = N;
  bwd_t.note = "D and aux transposed (column-major [N, F])";
  add(bwd_t, "no epilogue, D transposed", [](Variant&) {});
  add(bwd_t, "DGELU, D and aux transposed", [](Variant& v) { v.epi = Epi::dgelu, v.search = true; });

  // Forward fc with the GELU epilogue, as forward() calls blas.cu.
  Variant fwd;
  fwd.family = "fwd fc";  // ln2 [N, C] W_fc
  fwd.m = F, fwd.n = N, fwd.k = C;
  fwd.a = {w_fc, CUBLAS_OP_N, F, C, F, g_w_fc};
  fwd.b = {x, CUBLAS_OP_N, C, N, C, g_x};
  fwd.d = d, fwd.ldd = F;
  fwd.bias = bias, fwd.bias_gen = g_bias;
  fwd.aux = aux, fwd.aux_ld = F;
  add(fwd, "no epilogue", [](Variant&) {});
  add(fwd, "BIAS", [](Variant& v) { v.epi = Epi::bias; });
  add(fwd, "GELU", [](Variant& v) { v.epi = Epi::gelu; });
  add(fwd, "GELU_BIAS (no aux)", [](Variant& v) { v.epi = Epi::gelu_bias; });
  add(fwd, "GELU_AUX", [](Variant& v) { v.epi = Epi::gelu_aux, v.search = true; });
  add(fwd, "GELU_AUX_BIAS (the trainer's)", [](Variant& v) { v.epi = Epi::gelu_aux_bias, v.search = true; });
  add(fwd, "GELU_AUX_BIAS, workspace 0", [](Variant& v) { v.epi = Epi::gelu_aux_bias, v.workspace = 0; });
  // Transposed D: the bias would run along tokens there, so none.
  Variant fwd_t = fwd;
  fwd_t.m = N, fwd_t.n = F;
  fwd_t.a = {x, CUBLAS_OP_T, C, N, C, g_x};
  fwd_t.b = {w_fc, CUBLAS_OP_T, F, C, F, g_w_fc};
  fwd_t.ldd = N, fwd_t.aux_ld = N;
  fwd_t.note = "D and aux transposed (column-major [N, F])";
  add(fwd_t, "no epilogue, D transposed", [](Variant&) {});
  add(fwd_t, "GELU_AUX, D and aux transposed", [](Variant& v) { v.epi = Epi::gelu_aux; });

  for (const Variant& v : variants)
    if (o.only.empty() || (v.family + " " + v.name).find(o.only) != std::string::npos) lab.run_variant(v);

  // Two passes, compared with the fused epilogues.
  auto find = [&](const std::string& family, const std::string& name) -> const Variant* {
    for (const Variant& v : variants)
      if (v.family == family && v.name == name) return &v;
    return nullptr;
  };
  const Variant* bwd_plain = find(bwd.family, "no epilogue");
  const Variant* bwd_fused = find(bwd.family, "DGELU (the trainer's)");
  const Variant* fwd_bias = find(fwd.family, "BIAS");
  const Variant* fwd_fused = find(fwd.family, "GELU_AUX_BIAS (the trainer's)");
  // (with --only, where the plain variant ran)
  for (const char* which : {"fastest", "rank 0"})
    if (lab.best_algo.count(Lab::key(*bwd_plain))) lab.run_two_pass(*bwd_plain, *bwd_fused, false, which);
  for (const char* which : {"fastest", "rank 0"})
    if (lab.best_algo.count(Lab::key(*fwd_bias))) lab.run_two_pass(*fwd_bias, *fwd_fused, true, which);

  lab.print_summary();
  ck(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  if (lab.total_failures) {
    std::printf("\nFAILED: %d mismatching points (see MISMATCH lines)\n", lab.total_failures);
    return 1;
  }
  std::printf("\nall results within their bounds\n");
  return 0;
}
