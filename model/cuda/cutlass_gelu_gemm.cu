// cutlass_gelu_gemm.hpp: one CUTLASS configuration per product, the only instantiations in the
// library (each costs minutes of nvcc; the lab's rivals live in model/cuda/lab).
// The configuration and why: cutlass_gelu_gemm.cuh, ProductionConfig.
#include <stdexcept>
#include <string>

#include "cutlass_gelu_gemm.cuh"
#include "stableflash/model/cuda/cutlass_gelu_gemm.hpp"

namespace stableflash::model::cuda {
namespace {

using Forward = gelu_gemm::Kernel<GeluGemm::forward, gelu_gemm::ProductionConfig>;
using Backward = gelu_gemm::Kernel<GeluGemm::backward, gelu_gemm::ProductionConfig>;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("cutlass_gelu_gemm: ") + what + ": " + cudaGetErrorString(e));
}

}  // namespace

bool cutlass_gelu_gemm_supported(GeluGemm which, const GeluGemmArgs& args) {
  return which == GeluGemm::forward ? Forward::supported(args) : Backward::supported(args);
}

void cutlass_gelu_gemm(GeluGemm which, const GeluGemmArgs& args, cudaStream_t stream) {
  if (!cutlass_gelu_gemm_supported(which, args))
    throw std::invalid_argument("cutlass_gelu_gemm: unsupported arguments (m " + std::to_string(args.m) + ", n " + std::to_string(args.n) +
                                ", k " + std::to_string(args.k) + "; 16-byte alignment of pointers and rows needed)");
  int device = 0, sms = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  const cutlass::Status st = which == GeluGemm::forward ? Forward::run(args, device, sms, stream) : Backward::run(args, device, sms, stream);
  if (st != cutlass::Status::kSuccess)
    throw std::runtime_error(std::string("cutlass_gelu_gemm: CUTLASS: ") + cutlass::cutlassGetStatusString(st));
  check(cudaGetLastError(), "launch");
}

}  // namespace stableflash::model::cuda
