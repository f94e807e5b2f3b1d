// Timing of the CUDA attention the way shared/peers/torch_peers.py times its peers, so the two
// can be compared as ratios within one run on one GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "launch.hpp"
#include "stableflash/attention/cuda.hpp"

namespace stableflash::attention::cuda {
namespace {

// Standard normal BF16 values from a counter hash (Box-Muller), never zeros.
__global__ void fill_normal_kernel(std::uint16_t* out, std::int64_t n, std::uint64_t seed) {
  const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  auto hash = [](std::uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  const std::uint64_t r = hash(seed * 0x632be59bd9b4e019ull + std::uint64_t(i));
  const float u1 = (float((r >> 40) & 0xffffff) + 1.0f) * (1.0f / 16777217.0f);  // (0, 1]
  const float u2 = float(r & 0xffffff) * (1.0f / 16777216.0f);
  const float x = sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
  out[i] = static_cast<std::uint16_t>(__float_as_uint(round_bf16(x)) >> 16);
}

template <class T>
struct Buffer {
  T* ptr = nullptr;
  explicit Buffer(std::size_t n) { check_cuda(cudaMalloc(&ptr, std::max<std::size_t>(n, 1) * sizeof(T)), "cudaMalloc"); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { cudaFree(ptr); }
};

// torch_peers.per_call_ms: synchronous warm-up for warmup_s (>= 3 calls), one timed call sizes the
// window, then the median over windows of back-to-back calls between one pair of events.
double per_call_ms(const std::function<void()>& fn, cudaStream_t stream, double warmup_s, int windows, double min_window_ms,
                   int* calls_out) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int n = 0; n < 3 || std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < warmup_s; ++n) {
    fn();
    check_cuda(cudaStreamSynchronize(stream), "warm-up");
  }
  cudaEvent_t a, b;
  check_cuda(cudaEventCreate(&a), "cudaEventCreate");
  check_cuda(cudaEventCreate(&b), "cudaEventCreate");
  float ms = 0.0f;
  check_cuda(cudaEventRecord(a, stream), "cudaEventRecord");
  fn();
  check_cuda(cudaEventRecord(b, stream), "cudaEventRecord");
  check_cuda(cudaEventSynchronize(b), "cudaEventSynchronize");
  check_cuda(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
  const int calls = std::max(1, int(std::ceil(min_window_ms / std::max(double(ms), 1e-3))));
  std::vector<double> res;
  for (int w = 0; w < windows; ++w) {
    check_cuda(cudaEventRecord(a, stream), "cudaEventRecord");
    for (int c = 0; c < calls; ++c) fn();
    check_cuda(cudaEventRecord(b, stream), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(b), "cudaEventSynchronize");
    check_cuda(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
    res.push_back(double(ms) / calls);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(res.begin(), res.end());
  if (calls_out) *calls_out = calls;
  return res[res.size() / 2];
}

}  // namespace

BenchTiming bench(const AttentionShape& s, Layout layout, const AttentionOptions& options, std::uint64_t seed,
                  double warmup_s, int windows, double min_window_ms, const Kernels& kernels) {
  AttentionOptions opt = options;
  opt.device = Device::cuda;
  check_supported(s, opt);
  const cudaStream_t stream = static_cast<cudaStream_t>(opt.cuda_stream);
  const auto nq = std::size_t(s.q_elements()), nk = std::size_t(s.k_elements()), rows = std::size_t(s.rows());
  Buffer<std::uint16_t> q(nq), k(nk), v(nk), o(nq), res(nq), d_o(nq), dq(nq), dk(nk), dv(nk);
  Buffer<float> lse(rows);
  std::uint64_t stream_id = 0;
  for (auto [ptr, n] : {std::pair{q.ptr, nq}, {k.ptr, nk}, {v.ptr, nk}, {d_o.ptr, nq}}) {
    fill_normal_kernel<<<unsigned((n + 255) / 256), 256, 0, stream>>>(ptr, std::int64_t(n), seed * 16 + stream_id++);
    check_cuda(cudaGetLastError(), "fill_normal_kernel");
  }
  const bool compensated = opt.needs_residual(s);
  ForwardArgs fa;
  fa.shape = s, fa.layout = layout;
  fa.q = reinterpret_cast<const bf16*>(q.ptr), fa.k = reinterpret_cast<const bf16*>(k.ptr);
  fa.v = reinterpret_cast<const bf16*>(v.ptr), fa.o = reinterpret_cast<bf16*>(o.ptr), fa.lse = lse.ptr;
  fa.o_residual = compensated ? reinterpret_cast<bf16*>(res.ptr) : nullptr;
  BackwardArgs ba;
  ba.shape = s, ba.layout = layout, ba.q = fa.q, ba.k = fa.k, ba.v = fa.v, ba.o = fa.o, ba.lse = lse.ptr;
  ba.o_residual = fa.o_residual, ba.d_o = reinterpret_cast<const bf16*>(d_o.ptr);
  ba.dq = reinterpret_cast<bf16*>(dq.ptr), ba.dk = reinterpret_cast<bf16*>(dk.ptr), ba.dv = reinterpret_cast<bf16*>(dv.ptr);

  BenchTiming t;
  t.fwd_ms = per_call_ms([&] { kernels.forward(fa, opt); }, stream, warmup_s, windows, min_window_ms, &t.calls_per_window_fwd);
  t.bwd_ms = per_call_ms([&] { kernels.backward(ba, opt); }, stream, warmup_s, windows, min_window_ms, &t.calls_per_window_bwd);
  check_cuda(cudaStreamSynchronize(stream), "bench");
  return t;
}

}  // namespace stableflash::attention::cuda
