// Execution of a launch plan (entry.cu), shared by the production entry points and the kernel lab
// (attention/cuda/lab): parameters, tensor maps, workspace and counters around a launcher that
// runs the kernels. The production launchers are launch_forward / launch_backward_main
// (launch.hpp); the lab passes its own.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <stdexcept>
#include <string>

#include "kernel_params.cuh"
#include "plan.hpp"
#include "stableflash/attention/attention.hpp"

namespace stableflash::attention::cuda {

using ForwardLauncher = std::function<void(const ForwardParams&, cudaStream_t)>;
using BackwardLauncher = std::function<void(const BackwardParams&, cudaStream_t)>;  // main kernel + dQ conversion

// The forward of a checked call as `plan` says; `launch` runs the kernel(s) on the filled params.
void execute_forward(const ForwardArgs& args, const AttentionOptions& options, const ForwardPlan& plan,
                     const ForwardLauncher& launch);
// The backward: params, tensor maps, the plan's workspace, delta, `launch_main`, the group sum.
void execute_backward(const BackwardArgs& args, const AttentionOptions& options, const BackwardPlan& plan,
                      const BackwardLauncher& launch_main);

// Calls f.template operator()<D, kPaper>() for the plan's head dim and numerics, where this build
// has them (SF_CUDA_HD*: CMake's STABLEFLASH_CUDA_HEAD_DIMS).
template <class F>
void with_kernels(int head_dim, bool paper, F&& f) {
#if SF_CUDA_HD64
  if (head_dim == 64) return paper ? f.template operator()<64, true>() : f.template operator()<64, false>();
#endif
#if SF_CUDA_HD128
  if (head_dim == 128) return paper ? f.template operator()<128, true>() : f.template operator()<128, false>();
#endif
  (void)paper, (void)f;
  throw std::invalid_argument("CUDA attention: no kernels compiled for head_dim " + std::to_string(head_dim));
}

}  // namespace stableflash::attention::cuda
