// Our kernels are launched as programmatic dependents of whatever kernel came before them in the
// stream (launch_after_previous), so they may start before it ends. They must read nothing that
// kernel writes before griddepcontrol.wait: here the kernel before them is a "late writer" that lets
// its dependents launch at once and only after a while writes the tensor they need (as a GEMM that
// produces dO and lets the next kernel launch early would). The outputs must be those of a run whose
// inputs were written long before, bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "gpu_support.hpp"
#include "launch.hpp"
#include "tma.cuh"
#include "stableflash/numerics/bf16.hpp"

namespace stableflash::attention::gpu_test {
namespace {

using cuda::check_cuda;

// One CTA: allows its dependents to launch, waits `wait_ns` (the dependents' CTAs start on the other
// SMs meanwhile), then copies n BF16 values src -> dst.
__global__ void late_writer_kernel(const std::uint16_t* src, std::uint16_t* dst, std::int64_t n, unsigned long long wait_ns) {
  cuda::allow_dependent_launch();
  if (threadIdx.x == 0) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    while (now - start < wait_ns);
  }
  __syncthreads();
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}

constexpr unsigned long long kLateWriteNs = 200'000;  // far longer than a dependent's prologue

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags"); }
  ~Stream() { cudaStreamDestroy(s); }
};

// `target` (device, values.size() elements) zeroed, then rewritten with `values` by a late writer
// launched on `stream`, the last work in it: the next launch there is the writer's dependent. The
// staging copy is freed when this goes out of scope, after the caller's synchronization.
class LateWrite {
 public:
  LateWrite(bf16* target, const std::vector<bf16>& values, cudaStream_t stream) {
    const std::size_t bytes = values.size() * sizeof(bf16);
    check_cuda(cudaMalloc(&staging_, bytes), "cudaMalloc");
    check_cuda(cudaMemcpy(staging_, values.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    check_cuda(cudaMemset(target, 0, bytes), "cudaMemset");
    check_cuda(cudaDeviceSynchronize(), "before the late writer");
    late_writer_kernel<<<1, 256, 0, stream>>>(static_cast<const std::uint16_t*>(staging_), reinterpret_cast<std::uint16_t*>(target),
                                              std::int64_t(values.size()), kLateWriteNs);
    check_cuda(cudaGetLastError(), "late writer launch");
  }
  ~LateWrite() { cudaFree(staging_); }
  LateWrite(const LateWrite&) = delete;
  LateWrite& operator=(const LateWrite&) = delete;

 private:
  void* staging_ = nullptr;
};

// The backward with dO written late by the kernel before it, against the backward of the same
// inputs written long before; the caller's workspace, so that nothing but kernels sits between.
// Deterministic mode: dQ's bits do not depend on the order in which the key blocks add theirs.
void expect_backward_waits_for_dO(const AttentionShape& s, cuda::DeltaPass expected_pass) {
  AttentionOptions opt;
  opt.device = Device::cuda, opt.deterministic = true;
  // the library's default delta_source is `rounded` (a pass from the output); the main kernel forms
  // the exact one itself at one key block
  opt.delta_source = expected_pass == cuda::DeltaPass::in_main ? DeltaSource::exact : DeltaSource::rounded;
  const Inputs in = random_inputs(s, Layout::bhtd, 77);
  const Outputs reference = run_gpu(in, opt, /*backward=*/true);
  BackwardInputsOnDevice dev(in, reference);
  BackwardArgs ba = dev.args();
  const auto nq = std::size_t(s.q_elements()), nk = std::size_t(s.k_elements());
  GuardedBuffer<bf16> dq(nq), dk(nk), dv(nk);
  ba.dq = dq.get(), ba.dk = dk.get(), ba.dv = dv.get();
  ASSERT_EQ(cuda::plan_backward(ba, opt.for_shape(s), true, cuda::multiprocessors()).delta, expected_pass);
  const std::size_t workspace_bytes = std::max<std::size_t>(cuda::backward_workspace_bytes(ba, opt), 256);
  void* workspace = nullptr;
  check_cuda(cudaMalloc(&workspace, workspace_bytes), "cudaMalloc");
  ba.workspace = workspace, ba.workspace_bytes = workspace_bytes;
  Stream stream;
  opt.cuda_stream = stream.s;
  const LateWrite late(dev.d_o.get(), in.d_o, stream.s);
  attention_backward(ba, opt);
  check_cuda(cudaStreamSynchronize(stream.s), "backward after the late writer");
  check_cuda(cudaFree(workspace), "cudaFree");
  EXPECT_TRUE(same_bits(dq.download(), reference.dq)) << "dq";
  EXPECT_TRUE(same_bits(dk.download(), reference.dk)) << "dk";
  EXPECT_TRUE(same_bits(dv.download(), reference.dv)) << "dv";
}

// One key block: no δ pass runs before the main kernel (the exact δ is formed inside it), so the
// kernel before it in the stream is the late writer itself.
TEST(DependentLaunchGpu, BackwardOfOneKeyBlockReadsDoOnlyAfterTheKernelBeforeItEnds) {
  SF_REQUIRE_GPU();
  expect_backward_waits_for_dO({2, 4, 128, 128, 64}, cuda::DeltaPass::in_main);
  expect_backward_waits_for_dO({2, 4, 128, 128, 128}, cuda::DeltaPass::in_main);
}

TEST(DependentLaunchGpu, BackwardWithADeltaPassReadsDoOnlyAfterTheKernelBeforeItEnds) {
  SF_REQUIRE_GPU();
  expect_backward_waits_for_dO({2, 4, 384, 384, 64}, cuda::DeltaPass::from_output);
  expect_backward_waits_for_dO({2, 4, 384, 384, 128}, cuda::DeltaPass::from_output);
}

TEST(DependentLaunchGpu, ForwardReadsQOnlyAfterTheKernelBeforeItEnds) {
  SF_REQUIRE_GPU();
  for (const int head_dim : {64, 128}) {
    const AttentionShape s{2, 4, 384, 384, head_dim};
    AttentionOptions opt;
    opt.device = Device::cuda;
    const Inputs in = random_inputs(s, Layout::bhtd, 78);
    const Outputs reference = run_gpu(in, opt, /*backward=*/false);
    const auto nq = std::size_t(s.q_elements()), nk = std::size_t(s.k_elements()), rows = std::size_t(s.rows());
    const bool residual = opt.needs_residual(s);
    GuardedBuffer<bf16> q(nq), k(nk, in.k), v(nk, in.v), o(nq), r(residual ? nq : 0);
    GuardedBuffer<float> lse(rows);
    ForwardArgs fa;
    fa.shape = s, fa.layout = Layout::bhtd, fa.q = q.get(), fa.k = k.get(), fa.v = v.get(), fa.o = o.get(), fa.lse = lse.get();
    fa.o_residual = residual ? r.get() : nullptr;
    Stream stream;
    opt.cuda_stream = stream.s;
    const LateWrite late(q.get(), in.q, stream.s);
    attention_forward(fa, opt);
    check_cuda(cudaStreamSynchronize(stream.s), "forward after the late writer");
    EXPECT_TRUE(same_bits(o.download(), reference.o)) << "o, head dim " << head_dim;
    EXPECT_TRUE(same_bits(lse.download(), reference.lse)) << "lse, head dim " << head_dim;
  }
}

}  // namespace
}  // namespace stableflash::attention::gpu_test
