// The CUDA entry points (stableflash/attention/cuda.hpp): validation (plan.cpp's checks), one
// plan per call (plan.hpp), and its execution: kernel parameters from the public args and options,
// tensor maps, workspace, and the launch of the planned (head dim, numerics) kernels.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "execute.hpp"
#include "group_sum.hpp"
#include "launch.hpp"
#include "plan.hpp"
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

// The driver call of tensor_map needs a current context, and the runtime makes its primary
// context current on a thread only at that thread's first runtime call. A thread that has made
// none (PyTorch's autograd worker threads, which run the backward) would get
// CUDA_ERROR_INVALID_CONTEXT: cudaSetDevice on the thread's own device binds it, once per thread.
void bind_context_to_this_thread() {
  thread_local bool bound = false;
  if (bound) return;
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  bound = true;
}

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
  bind_context_to_this_thread();
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

// The bulk-tensor-copy maps of q, dO, k, v: the wgmma backward's and the exact delta pass's.
void set_tensor_maps(BackwardParams& p, const BackwardArgs& a) {
  const AttentionShape& s = a.shape;
  p.tma_q = tensor_map("q", a.q, s, s.heads, s.q_len, p.q_strides);
  p.tma_do = tensor_map("do", a.d_o, s, s.heads, s.q_len, p.d_o_strides);
  p.tma_k = tensor_map("k", a.k, s, s.resolved_kv_heads(), s.k_len, p.k_strides);
  p.tma_v = tensor_map("v", a.v, s, s.resolved_kv_heads(), s.k_len, p.v_strides);
}

}  // namespace

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

namespace {

// The checks on options whose delta_source is resolved (AttentionOptions::for_shape): the entry
// points below resolve once and call these; the public checks resolve first.
template <class Args>
void check_resolved_args(const Args& a, const AttentionOptions& resolved) {
  check_shape_options(a.shape, resolved, head_dim_compiled(a.shape.head_dim));
  check_tensors(a, resolved);
}

}  // namespace

void check_supported(const AttentionShape& s, const AttentionOptions& options) {
  check_shape_options(s, options.for_shape(s), head_dim_compiled(s.head_dim));
}

void check_supported_args(const ForwardArgs& a, const AttentionOptions& options) { check_resolved_args(a, options.for_shape(a.shape)); }

void check_supported_args(const BackwardArgs& a, const AttentionOptions& options) { check_resolved_args(a, options.for_shape(a.shape)); }

void execute_forward(const ForwardArgs& a, const AttentionOptions& opt, const ForwardPlan& plan, const ForwardLauncher& launch) {
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
  p.walk = static_cast<int>(plan.walk);
  if (plan.kernel == ForwardKernel::warp_specialized && plan.schedule == TileSchedule::dynamic) p.tile_counters = next_tile_counters(stream);
  p.tail_tiles = plan.ws_tail.tiles, p.tail_group = plan.ws_tail.group;
  p.lone_pairs = plan.ws_lone_pairs;
  if (plan.tensor_maps) {
    const int kv_heads = s.resolved_kv_heads();
    p.tma_q = tensor_map("q", a.q, s, s.heads, s.q_len, p.q_strides);
    p.tma_k = tensor_map("k", a.k, s, kv_heads, s.k_len, p.k_strides);
    p.tma_v = tensor_map("v", a.v, s, kv_heads, s.k_len, p.v_strides);
    p.store_by_tma = plan.store_by_tma;
    if (p.store_by_tma) {
      p.tma_o = tensor_map("o", a.o, s, s.heads, s.q_len, p.o_strides);
      if (a.o_residual) p.tma_o_residual = tensor_map("o_residual", a.o_residual, s, s.heads, s.q_len, p.o_strides);
    }
  }
  const std::size_t counter_bytes = sizeof(DeviceTieCounters) * std::size_t(s.heads);  // one record per query head
  if (plan.count_events) {
    p.counters = static_cast<DeviceTieCounters*>(workspace_alloc(counter_bytes, stream));
    check_cuda(cudaMemsetAsync(p.counters, 0, counter_bytes, stream), "cudaMemsetAsync");
  }
  launch(p, stream);
  if (plan.count_events) {
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

void execute_backward(const BackwardArgs& a, const AttentionOptions& opt, const BackwardPlan& plan,
                      const BackwardLauncher& launch_main) {
  const AttentionShape& s = a.shape;
  const cudaStream_t stream = stream_of(opt);
  BackwardParams p = backward_params(a, opt);
  set_tensor_maps(p, a);
  const BackwardWorkspace& w = plan.workspace;
  if (a.workspace && a.workspace_bytes < w.total)
    throw std::invalid_argument("attention_backward: the workspace holds " + std::to_string(a.workspace_bytes) + " bytes, this call needs " +
                                std::to_string(w.total) + " (cuda::backward_workspace_bytes)");
  if (a.workspace && reinterpret_cast<std::uintptr_t>(a.workspace) % 256 != 0)
    throw std::invalid_argument("attention_backward: the workspace must be 256-byte aligned");
  char* ws = a.workspace ? static_cast<char*>(a.workspace) : static_cast<char*>(workspace_alloc(w.total, stream));
  p.dq_accum = w.dq_bytes ? reinterpret_cast<float*>(ws) : nullptr;
  p.dq_direct = plan.dq_direct ? 1 : 0;
  p.delta_in_main = plan.delta == DeltaPass::in_main ? 1 : 0;
  p.main_ctas = plan.main_ctas;
  p.key_groups = plan.key_groups;
  p.dq_semaphore = w.semaphores ? reinterpret_cast<int*>(ws + w.at_semaphores) : nullptr;
  p.dq_first_store = plan.dq_first_store ? 1 : 0;
  p.dq_claims = w.claims ? reinterpret_cast<int*>(ws + w.at_claims) : nullptr;
  p.delta = a.delta ? a.delta : reinterpret_cast<float*>(ws + w.at_delta);
  // What the main kernel needs zero, the δ pass clears beside its own work (the bytes up to the next
  // 16 are padding). One key block (dq_direct, the only plan with the δ inside the main kernel and so
  // without a pass) has nothing to clear (launch_plan_test).
  if (w.zeroed_bytes() > 0) {
    if (plan.delta == DeltaPass::in_main) throw std::logic_error("execute_backward: workspace to clear but no δ pass to clear it");
    p.zero_words = reinterpret_cast<uint4*>(ws + w.zeroed_begin());
    p.zero_word_count = std::int64_t((w.zeroed_bytes() + 15) / 16);
  }
  if (plan.kv_group > 1) {
    const TensorStrides per_head = device_strides(HeadStrides::of(Layout::bhtd, s.heads, s.k_len, s.head_dim));
    p.dk = reinterpret_cast<std::uint16_t*>(ws + w.at_dk), p.dv = reinterpret_cast<std::uint16_t*>(ws + w.at_dv);
    p.dk_strides = p.dv_strides = per_head;
  }
  with_kernels(plan.head_dim, plan.paper, [&]<int D, bool kPaper>() { launch_delta<D, kPaper>(p, plan.delta, stream); });
  launch_main(p, stream);
  if (plan.kv_group > 1) {
    GroupSumParams g{p.dk, reinterpret_cast<std::uint16_t*>(a.dk), device_strides(a.dk_strides()), s.batch,
                     s.resolved_kv_heads(), plan.kv_group, s.k_len, s.head_dim};
    launch_group_sum(g, stream);
    g.per_head = p.dv, g.out = reinterpret_cast<std::uint16_t*>(a.dv), g.out_strides = device_strides(a.dv_strides());
    launch_group_sum(g, stream);
  }
  if (!a.workspace) workspace_free(ws, stream);
}

void forward(const ForwardArgs& a, const AttentionOptions& options) {
  const AttentionOptions opt = options.for_shape(a.shape);
  check_resolved_args(a, opt);
  const ForwardPlan plan = plan_forward(a, opt, multiprocessors());
  execute_forward(a, opt, plan, [&](const ForwardParams& p, cudaStream_t stream) {
    with_kernels(plan.head_dim, plan.paper, [&]<int D, bool kPaper>() { launch_forward<D, kPaper>(p, plan, stream); });
  });
}

void delta(const BackwardArgs& a, const AttentionOptions& options, float* delta_out) {
  const AttentionOptions opt = options.for_shape(a.shape);
  check_resolved_args(a, opt);
  if (!delta_out) throw std::invalid_argument("attention_delta: the delta output is required");
  const BackwardPlan plan = plan_backward(a, opt, /*with_gradients=*/false);
  BackwardParams p = backward_params(a, opt);
  p.delta = delta_out;
  if (plan.delta == DeltaPass::exact) set_tensor_maps(p, a);  // the exact pass reads q, dO, k, v by bulk copies
  with_kernels(plan.head_dim, plan.paper, [&]<int D, bool kPaper>() { launch_delta<D, kPaper>(p, plan.delta, stream_of(opt)); });
}

std::size_t backward_workspace_bytes(const BackwardArgs& a, const AttentionOptions& options) {
  const AttentionOptions opt = options.for_shape(a.shape);
  check_shape_options(a.shape, opt, head_dim_compiled(a.shape.head_dim));
  return plan_backward(a, opt).workspace.total;
}

void backward(const BackwardArgs& a, const AttentionOptions& options) {
  const AttentionOptions opt = options.for_shape(a.shape);
  check_resolved_args(a, opt);
  if (!a.dq || !a.dk || !a.dv) throw std::invalid_argument("attention_backward: dq, dk and dv outputs are required");
  const BackwardPlan plan = plan_backward(a, opt, /*with_gradients=*/true, multiprocessors());
  execute_backward(a, opt, plan, [&](const BackwardParams& p, cudaStream_t stream) {
    with_kernels(plan.head_dim, plan.paper, [&]<int D, bool kPaper>() { launch_backward_main<D, kPaper>(p, stream); });
  });
}

}  // namespace stableflash::attention::cuda
