// gemm_lab (bench only): the forward (fc) CUTLASS GELU product in the lab's configurations
// (gemm_lab_cutlass.cuh).
#include "gemm_lab_cutlass.cuh"

namespace gemm_lab {

CutlassResult cutlass_forward(int config, const stableflash::model::cuda::GeluGemmArgs& args, cudaStream_t stream, bool launch) {
  return cutlass_call<stableflash::model::cuda::GeluGemm::forward>(config, args, stream, launch);
}

}  // namespace gemm_lab
