// gemm_lab (bench only): the CUTLASS GELU products in the configurations the lab times, the
// library's own first (model/cuda/cutlass_gelu_gemm.cuh, ProductionConfig), then its rivals:
//   1: the pingpong tile with the cluster across N (the pair shares the activation tile, not the weights');
//   2: cooperative 128 x 256, cluster 2 x 1 (CUTLASS's usual BF16 choice at large sizes: both warp
//      groups on one tile, half the weight-tile loads per output, the epilogue after the MMAs).
// Included by gemm_lab_cutlass_forward.cu and gemm_lab_cutlass_backward.cu, one product each, so
// that the two compile in parallel.
#pragma once

#include <tuple>

#include "../cutlass_gelu_gemm.cuh"
#include "gemm_lab.hpp"

namespace gemm_lab {

namespace gg = stableflash::model::cuda::gelu_gemm;
using LabConfigs = std::tuple<gg::ProductionConfig, gg::Config<128, 128, 1, 2, gg::Schedule::pingpong>,
                              gg::Config<128, 256, 2, 1, gg::Schedule::cooperative>>;
static_assert(std::tuple_size_v<LabConfigs> == kCutlassConfigs, "gemm_lab.hpp's count");

template <stableflash::model::cuda::GeluGemm Which, std::size_t I = 0>
CutlassResult cutlass_call(int config, const stableflash::model::cuda::GeluGemmArgs& args, cudaStream_t stream, bool launch) {
  if constexpr (I == std::tuple_size_v<LabConfigs>) {
    return {};
  } else {
    if (config != int(I)) return cutlass_call<Which, I + 1>(config, args, stream, launch);
    using Cfg = std::tuple_element_t<I, LabConfigs>;
    using K = gg::Kernel<Which, Cfg>;
    CutlassResult r;
    r.name = Cfg::name();
    r.supported = K::supported(args);
    if (!launch || !r.supported) return r;
    int device = 0, sms = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    const cutlass::Status st = K::run(args, device, sms, stream);
    r.ran = st == cutlass::Status::kSuccess;
    if (!r.ran) r.error = cutlass::cutlassGetStatusString(st);
    return r;
  }
}

}  // namespace gemm_lab
