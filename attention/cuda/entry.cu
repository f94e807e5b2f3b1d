// The CUDA entry points (stableflash/attention/cuda.hpp): validation, kernel parameters from the
// public args and options, workspace, and dispatch to the compiled (head dim, numerics) kernels.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "group_sum.hpp"
#include "launch.hpp"
#include "stableflash/attention/cuda.hpp"
#include "stableflash/attention/rounding_points.hpp"

namespace stableflash::attention::cuda {
namespace {

bool head_dim_compiled(int d) {
#if SF_CUDA_HD64
  if (d == 64) return true;
#endif
#if SF_CUDA_HD128
  if (d == 128) return true;
#endif
  return false;
}

TensorStrides device_strides(const HeadStrides& hs) { return {hs.b, hs.h, hs.t}; }

// What the kernels need of one tensor's memory: every row (b, h, t) starts `align` bytes aligned,
// i.e. the base address and the three strides (in bytes) are multiples of `align`. Strides are
// non-negative (bulk tensor copies take unsigned ones). The one place these rules are decided:
// forward_tensors / backward_tensors list every tensor with its need, check_tensor applies it.
struct TensorNeed {
  const char* field;         // the args' pointer (messages): q, k, v, o, o_residual, do, dq, dk, dv
  const char* stride_field;  // its entry in args.strides (o_residual follows o)
  const void* ptr;           // null: not passed (optional tensors; delta has no gradients)
  HeadStrides strides;
  int align;                 // bytes
  const char* why;
};

constexpr const char* kBulkReads = "read by bulk tensor copies (TMA) and 16-byte loads";
constexpr const char* kPairStores = "written two values at a time; 16-byte aligned rows also allow bulk stores";
constexpr const char* kGradientStores = "written up to four values (8 bytes) at a time";

bool rows_aligned(const void* ptr, const HeadStrides& st, int align) {
  const auto multiple = [&](std::int64_t elements) { return elements >= 0 && (elements * 2) % align == 0; };
  return reinterpret_cast<std::uintptr_t>(ptr) % align == 0 && multiple(st.b) && multiple(st.h) && multiple(st.t);
}

void check_tensor(const TensorNeed& n) {
  if (!n.ptr) return;
  const std::string need = " (" + std::string(n.why) + ")";
  if (reinterpret_cast<std::uintptr_t>(n.ptr) % n.align != 0)
    throw std::invalid_argument(std::string("CUDA attention: ") + n.field + " must be " + std::to_string(n.align) +
                                "-byte aligned" + need);
  const std::pair<const char*, std::int64_t> strides[] = {{"b", n.strides.b}, {"h", n.strides.h}, {"t", n.strides.t}};
  for (const auto& [dim, elements] : strides) {
    const std::string name = std::string("CUDA attention: strides.") + n.stride_field + "." + dim + " = " + std::to_string(elements);
    if (elements < 0) throw std::invalid_argument(name + " is negative; the kernels need non-negative strides");
    if ((elements * 2) % n.align != 0)
      throw std::invalid_argument(name + " must be a multiple of " + std::to_string(n.align / 2) + " elements (" +
                                  std::to_string(n.align) + " bytes)" + need);
  }
}

std::vector<TensorNeed> forward_tensors(const ForwardArgs& a) {
  return {{"q", "q", a.q, a.q_strides(), 16, kBulkReads},
          {"k", "k", a.k, a.k_strides(), 16, kBulkReads},
          {"v", "v", a.v, a.v_strides(), 16, kBulkReads},
          {"o", "o", a.o, a.o_strides(), 4, kPairStores},
          {"o_residual", "o", a.o_residual, a.o_strides(), 4, kPairStores}};
}

std::vector<TensorNeed> backward_tensors(const BackwardArgs& a) {
  return {{"q", "q", a.q, a.q_strides(), 16, kBulkReads},
          {"k", "k", a.k, a.k_strides(), 16, kBulkReads},
          {"v", "v", a.v, a.v_strides(), 16, kBulkReads},
          {"o", "o", a.o, a.o_strides(), 16, kBulkReads},
          {"o_residual", "o", a.o_residual, a.o_strides(), 16, kBulkReads},
          {"do", "d_o", a.d_o, a.d_o_strides(), 16, kBulkReads},
          {"dq", "dq", a.dq, a.dq_strides(), 8, kGradientStores},
          {"dk", "dk", a.dk, a.dk_strides(), 8, kGradientStores},
          {"dv", "dv", a.dv, a.dv_strides(), 8, kGradientStores}};
}

cudaStream_t stream_of(const AttentionOptions& opt) { return static_cast<cudaStream_t>(opt.cuda_stream); }

// Stream-ordered workspace from the default pool, kept cached between calls (no cudaMalloc cost
// inside timed loops).
void* workspace_alloc(std::size_t bytes, cudaStream_t stream) {
  static const bool pool_configured = [] {
    int dev = 0;
    check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
    cudaMemPool_t pool;
    check_cuda(cudaDeviceGetDefaultMemPool(&pool, dev), "cudaDeviceGetDefaultMemPool");
    std::uint64_t keep = UINT64_MAX;
    check_cuda(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep), "cudaMemPoolSetAttribute");
    return true;
  }();
  (void)pool_configured;
  void* p = nullptr;
  check_cuda(cudaMallocAsync(&p, bytes == 0 ? 1 : bytes, stream), "cudaMallocAsync");
  return p;
}
void workspace_free(void* p, cudaStream_t stream) { check_cuda(cudaFreeAsync(p, stream), "cudaFreeAsync"); }

// A bulk-tensor-copy map of a BF16 [B, heads, len, D] tensor with any strides (check_tensor's
// 16-byte rule) as the 4-d tensor (D, T, H, B) in boxes of 64 x 64, 128-byte swizzled (tma.cuh);
// rows past T read as zeros.
CUtensorMap tensor_map(const char* field, const void* base, const AttentionShape& s, int heads, int len, const TensorStrides& st) {
  using Encode = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*, const cuuint64_t*,
                              const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                              CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  static const Encode encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    check_cuda(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found),
               "cudaGetDriverEntryPointByVersion(cuTensorMapEncodeTiled)");
    if (found != cudaDriverEntryPointSuccess || !fn) throw std::runtime_error("CUDA driver lacks cuTensorMapEncodeTiled");
    return reinterpret_cast<Encode>(fn);
  }();
  CUtensorMap map{};
  const cuuint64_t dims[4] = {cuuint64_t(s.head_dim), cuuint64_t(len), cuuint64_t(heads), cuuint64_t(s.batch)};
  const cuuint64_t strides[3] = {cuuint64_t(st.t) * 2, cuuint64_t(st.h) * 2, cuuint64_t(st.b) * 2};  // bytes
  const cuuint32_t box[4] = {64, 64, 1, 1}, element_strides[4] = {1, 1, 1, 1};
  const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<void*>(base), dims, strides, box,
                            element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw std::invalid_argument(std::string("CUDA attention: ") + field + ": cuTensorMapEncodeTiled refused its strides (" +
                                std::to_string(int(r)) + ")");
  return map;
}

template <class F>
void with_kernels(int head_dim, Numerics numerics, F&& f) {
  const bool paper = numerics == Numerics::paper;
#if SF_CUDA_HD64
  if (head_dim == 64) return paper ? f.template operator()<64, true>() : f.template operator()<64, false>();
#endif
#if SF_CUDA_HD128
  if (head_dim == 128) return paper ? f.template operator()<128, true>() : f.template operator()<128, false>();
#endif
  throw std::invalid_argument("CUDA attention: no kernels compiled for head_dim " + std::to_string(head_dim));
}

BackwardParams backward_params(const BackwardArgs& a, const AttentionOptions& opt) {
  const AttentionShape& s = a.shape;
  BackwardParams p{};
  p.q = reinterpret_cast<const std::uint16_t*>(a.q), p.k = reinterpret_cast<const std::uint16_t*>(a.k);
  p.v = reinterpret_cast<const std::uint16_t*>(a.v), p.o = reinterpret_cast<const std::uint16_t*>(a.o);
  p.o_residual = reinterpret_cast<const std::uint16_t*>(a.o_residual);
  p.d_o = reinterpret_cast<const std::uint16_t*>(a.d_o);
  p.lse = a.lse;
  p.dq = reinterpret_cast<std::uint16_t*>(a.dq), p.dk = reinterpret_cast<std::uint16_t*>(a.dk);
  p.dv = reinterpret_cast<std::uint16_t*>(a.dv);
  p.q_strides = device_strides(a.q_strides()), p.k_strides = device_strides(a.k_strides());
  p.v_strides = device_strides(a.v_strides()), p.o_strides = device_strides(a.o_strides());
  p.d_o_strides = device_strides(a.d_o_strides()), p.dq_strides = device_strides(a.dq_strides());
  p.dk_strides = device_strides(a.dk_strides()), p.dv_strides = device_strides(a.dv_strides());
  p.batch = s.batch, p.heads = s.heads, p.q_len = s.q_len, p.k_len = s.k_len;
  p.kv_group = s.group_size();
  p.scale = opt.resolved_scale(s.head_dim);
  p.causal = opt.causal, p.deterministic = opt.deterministic;
  p.delta_source = static_cast<int>(opt.delta_source);
  return p;
}

}  // namespace

ForwardKernel forward_kernel_kind() {
  static const ForwardKernel kind = [] {
    const char* env = std::getenv("STABLEFLASH_FORWARD_KERNEL");
    return env && std::string(env) == "mma" ? ForwardKernel::mma_sync : ForwardKernel::wgmma;
  }();
  return kind;
}

// STABLEFLASH_FORWARD_KERNEL=wgmma-serial: the wgmma forward without the softmax / P V overlap
// (for measuring what the overlap brings).
bool forward_serial_walk() {
  static const bool serial = [] {
    const char* env = std::getenv("STABLEFLASH_FORWARD_KERNEL");
    return env && std::string(env) == "wgmma-serial";
  }();
  return serial;
}

bool forward_warp_specialized() {
  static const bool ws = [] {
    const char* env = std::getenv("STABLEFLASH_FORWARD_KERNEL");
    return !(env && std::string(env) == "wgmma-1wg");
  }();
  return ws;
}

ForwardKernel backward_kernel_kind() {
  static const ForwardKernel kind = [] {
    const char* env = std::getenv("STABLEFLASH_BACKWARD_KERNEL");
    return env && std::string(env) == "mma" ? ForwardKernel::mma_sync : ForwardKernel::wgmma;
  }();
  return kind;
}

bool built() { return true; }

bool has_device() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

std::string device_name() {
  int dev = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) return "none";
  return prop.name;
}

void check_supported(const AttentionShape& s, const AttentionOptions& opt) {
  opt.validate(s);
  if (opt.numerics == Numerics::reference)
    throw std::invalid_argument("numerics: 'reference' runs on the CPU only (FP64 oracle)");
  if (!head_dim_compiled(s.head_dim))
    throw std::invalid_argument("CUDA attention: head_dim " + std::to_string(s.head_dim) +
                                " has no kernels in this build (64 and 128 exist; STABLEFLASH_CUDA_HEAD_DIMS)");
  if (opt.resolved_tile_k() % kSubTile != 0)
    throw std::invalid_argument("tile: the CUDA kernels need a key tile that is a multiple of " +
                                std::to_string(kSubTile) + ", got " + std::to_string(opt.resolved_tile_k()));
}

void check_supported_args(const ForwardArgs& a, const AttentionOptions& opt) {
  check_supported(a.shape, opt);
  if (!a.q || !a.k || !a.v || !a.o || !a.lse) throw std::invalid_argument("attention_forward: q, k, v, o and lse are required");
  if (opt.delta_source == DeltaSource::compensated && !a.o_residual)
    throw std::invalid_argument("delta_source: 'compensated' needs an o_residual output buffer");
  for (const TensorNeed& n : forward_tensors(a)) check_tensor(n);
}

void check_supported_args(const BackwardArgs& a, const AttentionOptions& opt) {
  check_supported(a.shape, opt);
  if (!a.q || !a.k || !a.v || !a.o || !a.lse || !a.d_o)
    throw std::invalid_argument("attention_backward: q, k, v, o, lse and do are required");
  if (opt.delta_source == DeltaSource::compensated && !a.o_residual)
    throw std::invalid_argument("delta_source: 'compensated' needs the forward's o_residual");
  for (const TensorNeed& n : backward_tensors(a)) check_tensor(n);
}

void forward(const ForwardArgs& a, const AttentionOptions& opt) {
  check_supported_args(a, opt);
  const AttentionShape& s = a.shape;
  const cudaStream_t stream = stream_of(opt);
  ForwardParams p{};
  p.q = reinterpret_cast<const std::uint16_t*>(a.q), p.k = reinterpret_cast<const std::uint16_t*>(a.k);
  p.v = reinterpret_cast<const std::uint16_t*>(a.v);
  p.o = reinterpret_cast<std::uint16_t*>(a.o), p.o_residual = reinterpret_cast<std::uint16_t*>(a.o_residual);
  p.lse = a.lse;
  p.q_strides = device_strides(a.q_strides()), p.k_strides = device_strides(a.k_strides());
  p.v_strides = device_strides(a.v_strides()), p.o_strides = device_strides(a.o_strides());
  p.batch = s.batch, p.heads = s.heads, p.q_len = s.q_len, p.k_len = s.k_len;
  p.kv_group = s.group_size();
  p.scale = opt.resolved_scale(s.head_dim);
  p.causal = opt.causal;
  p.tile_k = opt.resolved_tile_k();
  p.round_bits = opt.round_bits;
  p.normalizer_bf16 = opt.normalizer == Normalizer::bf16;
  p.policy = opt.policy_params;
  p.serial_walk = forward_serial_walk();
  if (forward_kernel_kind() == ForwardKernel::wgmma) {
    const int kv_heads = s.resolved_kv_heads();
    p.tma_q = tensor_map("q", a.q, s, s.heads, s.q_len, p.q_strides);
    p.tma_k = tensor_map("k", a.k, s, kv_heads, s.k_len, p.k_strides);
    p.tma_v = tensor_map("v", a.v, s, kv_heads, s.k_len, p.v_strides);
    // the epilogue's bulk stores need 16-byte aligned output rows; others are stored element-wise
    p.store_by_tma = rows_aligned(a.o, a.o_strides(), 16) && (!a.o_residual || rows_aligned(a.o_residual, a.o_strides(), 16));
    if (p.store_by_tma) {
      p.tma_o = tensor_map("o", a.o, s, s.heads, s.q_len, p.o_strides);
      if (a.o_residual) p.tma_o_residual = tensor_map("o_residual", a.o_residual, s, s.heads, s.q_len, p.o_strides);
    }
  }
  const bool counting = a.ties || a.head_ties;
  const std::size_t counter_bytes = sizeof(DeviceTieCounters) * std::size_t(s.heads);
  if (counting) {
    p.counters = static_cast<DeviceTieCounters*>(workspace_alloc(counter_bytes, stream));
    check_cuda(cudaMemsetAsync(p.counters, 0, counter_bytes, stream), "cudaMemsetAsync");
  }
  with_kernels(s.head_dim, opt.numerics, [&]<int D, bool kPaper>() { launch_forward<D, kPaper>(p, opt.policy, stream); });
  if (counting) {
    std::vector<DeviceTieCounters> c(std::size_t(s.heads));
    check_cuda(cudaMemcpyAsync(c.data(), p.counters, counter_bytes, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
    workspace_free(p.counters, stream);
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    // Fully masked rows: causal with Tq > Tk leaves the first Tq - Tk rows without keys.
    const std::int64_t masked_per_head = opt.causal && s.q_len > s.k_len ? std::int64_t(s.q_len - s.k_len) * s.batch : 0;
    TieCounts total{s.rows(), 0, 0, 0, masked_per_head * s.heads};
    for (int h = 0; h < s.heads; ++h) {
      const DeviceTieCounters& d = c[std::size_t(h)];
      const TieCounts head{std::int64_t(s.batch) * s.q_len, std::int64_t(d.tie_event_rows), std::int64_t(d.repeated_max_rows),
                           std::int64_t(d.fallback_rows), masked_per_head};
      total.tie_event_rows += head.tie_event_rows, total.repeated_max_rows += head.repeated_max_rows;
      total.fallback_rows += head.fallback_rows;
      if (a.head_ties) a.head_ties[h] = head;
    }
    if (a.ties) *a.ties = total;
  }
}

void delta(const BackwardArgs& a, const AttentionOptions& opt, float* delta_out) {
  check_supported_args(a, opt);
  if (!delta_out) throw std::invalid_argument("attention_delta: the delta output is required");
  BackwardParams p = backward_params(a, opt);
  p.delta = delta_out;
  with_kernels(a.shape.head_dim, opt.numerics, [&]<int D, bool kPaper>() { launch_delta<D, kPaper>(p, stream_of(opt)); });
}

void backward(const BackwardArgs& a, const AttentionOptions& opt) {
  check_supported_args(a, opt);
  if (!a.dq || !a.dk || !a.dv) throw std::invalid_argument("attention_backward: dq, dk and dv outputs are required");
  const AttentionShape& s = a.shape;
  const cudaStream_t stream = stream_of(opt);
  BackwardParams p = backward_params(a, opt);
  if (backward_kernel_kind() == ForwardKernel::wgmma) {
    const int kv_heads = s.resolved_kv_heads();
    p.tma_q = tensor_map("q", a.q, s, s.heads, s.q_len, p.q_strides);
    p.tma_do = tensor_map("do", a.d_o, s, s.heads, s.q_len, p.d_o_strides);
    p.tma_k = tensor_map("k", a.k, s, kv_heads, s.k_len, p.k_strides);
    p.tma_v = tensor_map("v", a.v, s, kv_heads, s.k_len, p.v_strides);
  }
  constexpr int kBlockQ = 64;  // BackwardTraits<*>::kBlockQ (one dQ turn counter per query block)
  const std::size_t rows = std::size_t(s.rows());
  const std::size_t sems = opt.deterministic ? std::size_t(s.batch) * s.heads * ((s.q_len + kBlockQ - 1) / kBlockQ) : 0;
  const std::size_t delta_bytes = a.delta ? 0 : rows * sizeof(float);
  // the wgmma kernel's fragment order pads Tq to its query block (DqFragmentOrder)
  const std::size_t padded_rows = std::size_t(s.batch) * s.heads * DqFragmentOrder::blocks(s.q_len) * DqFragmentOrder::kBlockQ;
  const std::size_t dq_bytes = padded_rows * s.head_dim * sizeof(float);
  // Grouped-query heads: the main kernel runs as multi-head attention with K/V read by the group
  // (one CTA per key block and query head, the same grid and work as the MHA run on repeated K/V)
  // and writes each query head's BF16 dK, dV into a workspace [B, H, Tk, D]; launch_group_sum then
  // adds them per K/V head in ascending head order, in FP32, rounded once (numerics-contract.md). Walking
  // the group inside one CTA could not hold that contract's FP32 sum next to the FP32 accumulators
  // (registers or shared memory at D = 128), and would leave H_kv x Tk / 128 CTAs (MQA: a few).
  const int group = s.group_size();
  const std::size_t per_head_bytes = group > 1 ? std::size_t(s.batch) * s.heads * s.k_len * s.head_dim * sizeof(std::uint16_t) : 0;
  // one allocation: dQ accumulator | turn counters | delta | per-head dK | per-head dV (256-byte aligned parts)
  const auto aligned = [](std::size_t n) { return (n + 255) / 256 * 256; };
  const std::size_t at_sems = aligned(dq_bytes), at_delta = aligned(at_sems + sems * sizeof(int));
  const std::size_t at_dk = aligned(at_delta + delta_bytes), at_dv = at_dk + aligned(per_head_bytes);
  char* ws = static_cast<char*>(workspace_alloc(at_dv + per_head_bytes, stream));
  p.dq_accum = reinterpret_cast<float*>(ws);
  p.dq_semaphore = sems ? reinterpret_cast<int*>(ws + at_sems) : nullptr;
  p.delta = a.delta ? a.delta : reinterpret_cast<float*>(ws + at_delta);
  check_cuda(cudaMemsetAsync(ws, 0, at_sems + sems * sizeof(int), stream), "cudaMemsetAsync");
  if (group > 1) {
    const TensorStrides per_head = device_strides(HeadStrides::of(Layout::bhtd, s.heads, s.k_len, s.head_dim));
    p.dk = reinterpret_cast<std::uint16_t*>(ws + at_dk), p.dv = reinterpret_cast<std::uint16_t*>(ws + at_dv);
    p.dk_strides = p.dv_strides = per_head;
  }
  with_kernels(s.head_dim, opt.numerics, [&]<int D, bool kPaper>() {
    launch_delta<D, kPaper>(p, stream);
    launch_backward_main<D, kPaper>(p, stream);
  });
  if (group > 1) {
    GroupSumParams g{p.dk, reinterpret_cast<std::uint16_t*>(a.dk), device_strides(a.dk_strides()), s.batch,
                     s.resolved_kv_heads(), group, s.k_len, s.head_dim};
    launch_group_sum(g, stream);
    g.per_head = p.dv, g.out = reinterpret_cast<std::uint16_t*>(a.dv), g.out_strides = device_strides(a.dv_strides());
    launch_group_sum(g, stream);
  }
  workspace_free(ws, stream);
}

}  // namespace stableflash::attention::cuda
