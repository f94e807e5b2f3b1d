// Warpgroup register budgets (setmaxnreg, CUTLASS's wrappers; all warps of a warpgroup execute
// it) of the warp-specialized kernels (forward_ws_kernel.cuh, backward_wgmma_kernel.cuh): a CTA
// starts at cta_start_registers(threads) per thread (kernel_params.cuh); its producer warpgroup
// gives most of them up and its consumers take them.
#pragma once

#include <cutlass/arch/reg_reconfig.h>  // warpgroup_reg_alloc / dealloc

#if defined(__CUDA_ARCH__) && !CUDA_CTA_RECONFIG_ACTIVATED
#error "the warp-specialized kernels need setmaxnreg (sm_90a): CUTLASS's wrappers would be no-ops"
#endif

namespace stableflash::attention::cuda {

template <int kRegs>
__device__ __forceinline__ void release_registers() {
  cutlass::arch::warpgroup_reg_dealloc<kRegs>();
}
template <int kRegs>
__device__ __forceinline__ void claim_registers() {
  cutlass::arch::warpgroup_reg_alloc<kRegs>();
}

}  // namespace stableflash::attention::cuda
