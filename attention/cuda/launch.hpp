// Kernel launchers, one explicit instantiation per (head dim, numerics) in the generated
// instance files (instances_*.cu.in), so a build compiles only the head dims it asks for.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "kernel_params.cuh"
#include "stableflash/attention/modes.hpp"

namespace stableflash::attention::cuda {

// The forward's tensor-core path: wgmma (Hopper warpgroup MMA, the default) or mma.sync (the
// FlashAttention-2-style kernel it grew from, kept for comparison). STABLEFLASH_FORWARD_KERNEL=mma
// selects the latter (benchmarks, bisecting).
enum class ForwardKernel { wgmma, mma_sync };
ForwardKernel forward_kernel_kind();
// The wgmma forward's fused fast path: warp-specialized (forward_ws_kernel.cuh, the default) or the
// one-warpgroup kernel (STABLEFLASH_FORWARD_KERNEL=wgmma-1wg, for comparison).
bool forward_warp_specialized();
// The same choice for the backward's main kernel: STABLEFLASH_BACKWARD_KERNEL=mma or wgmma.
ForwardKernel backward_kernel_kind();

template <int D, bool kPaper>
void launch_forward(const ForwardParams& p, ShiftPolicy policy, cudaStream_t stream);
// delta (per p.delta_source) into p.delta
template <int D, bool kPaper>
void launch_delta(const BackwardParams& p, cudaStream_t stream);
// main kernel and dQ conversion; p.delta, p.dq_accum (zeroed) and p.dq_semaphore (zeroed) ready
template <int D, bool kPaper>
void launch_backward_main(const BackwardParams& p, cudaStream_t stream);

inline void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(err));
}

// Raises a kernel's dynamic shared-memory limit (past the 48 KB default) once per process.
template <class Kernel>
void allow_smem(Kernel kernel, int bytes) {
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), "cudaFuncSetAttribute");
}

}  // namespace stableflash::attention::cuda
