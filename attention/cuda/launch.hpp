// Kernel launchers of the production library, one explicit instantiation per (head dim, numerics)
// in the generated instance files (*_instances.cu.in), so a build compiles only the head dims it
// asks for. Which one runs is the plan's choice (plan.hpp); the kernel lab's launchers are in lab/.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>
#include <utility>

#include "kernel_params.cuh"
#include "plan.hpp"
#include "stableflash/attention/modes.hpp"

namespace stableflash::attention::cuda {

// The planned forward kernel (plan.kernel, plan.policy; p.walk = plan.walk).
template <int D, bool kPaper>
void launch_forward(const ForwardParams& p, const ForwardPlan& plan, cudaStream_t stream);
// delta (plan.delta) into p.delta
template <int D, bool kPaper>
void launch_delta(const BackwardParams& p, DeltaPass pass, cudaStream_t stream);
// the wgmma main kernel and the dQ conversion; p.delta ready, p.dq_claims or p.dq_semaphore zeroed
// (and p.dq_accum, unless p.dq_first_store)
template <int D, bool kPaper>
void launch_backward_main(const BackwardParams& p, cudaStream_t stream);
// the dQ conversion alone (launch_backward_main's last launch; the kernel lab times it by itself):
// p.dq_accum in the wgmma kernel's fragment order into p.dq
template <int D, bool kPaper>
void launch_dq_convert(const BackwardParams& p, cudaStream_t stream);

inline void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(err));
}

// Launches `kernel` as a programmatic dependent of the stream's previous kernel: its CTAs may start
// before that kernel ends (once its CTAs allowed it: allow_dependent_launch), and must call
// grid_dependency_wait (tma.cuh) before touching what that kernel writes. Hides the launch and the
// prologue (barrier set-up, loads of inputs the previous kernel does not write) behind its tail.
template <class... Params, class... Args>
void launch_after_previous(void (*kernel)(Params...), dim3 grid, int threads, int smem, cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid, config.blockDim = dim3(unsigned(threads)), config.dynamicSmemBytes = std::size_t(smem);
  config.stream = stream, config.attrs = &attribute, config.numAttrs = 1;
  check_cuda(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...), "cudaLaunchKernelEx");
}

// The current device's SM count (a persistent grid's size).
inline int multiprocessors() {
  int device = 0, sms = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  return sms;
}

// The dynamic tile schedule's counters for one launch of the warp-specialized forward: a pair
// {next tile, CTAs done} that is zero, and that the launch's last CTA zeroes again (so no memset
// per call). The current device's pairs are allocated at the first call and taken in turn, so
// launches in flight at once on several streams never share one (a captured CUDA graph keeps the
// pair of the launch it captured; its replays run one after another on their stream). Null where
// the stream is capturing before the device's pairs exist: no allocation inside a capture, the
// kernel falls back to fixed rounds.
int* next_tile_counters(cudaStream_t stream);

// Raises a kernel's dynamic shared-memory limit (past the 48 KB default) once per process.
template <class Kernel>
void allow_smem(Kernel kernel, int bytes) {
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), "cudaFuncSetAttribute");
}

}  // namespace stableflash::attention::cuda
