// Launchers of the kernel lab's own kernels, one explicit instantiation per (head dim, numerics)
// in the generated lab_instances_*.cu (lab_instances.cu.in).
#pragma once

#include <cuda_runtime.h>

#include "kernel_params.cuh"
#include "plan.hpp"

namespace stableflash::attention::cuda::lab {

template <int D, bool kPaper>
void launch_mma_forward(const ForwardParams& p, ShiftPolicy policy, cudaStream_t stream);
// the mma.sync main kernel and its row-major dQ conversion
template <int D, bool kPaper>
void launch_mma_backward_main(const BackwardParams& p, cudaStream_t stream);
// the wgmma backward with a dQ warpgroup (lab/backward_dqwg_kernel.cuh) and the production dQ conversion
template <int D, bool kPaper>
void launch_dqwg_backward_main(const BackwardParams& p, cudaStream_t stream);

}  // namespace stableflash::attention::cuda::lab
