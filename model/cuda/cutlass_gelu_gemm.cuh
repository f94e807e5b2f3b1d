// The CUTLASS sm90 kernels behind cutlass_gelu_gemm.hpp, as templates on the tile configuration:
// the production file (cutlass_gelu_gemm.cu) instantiates one configuration per product, the GEMM
// lab (model/cuda/lab/gemm_lab_cutlass_*.cu) the same one and its rivals, so that what the lab
// times is what the trainer runs.
//
// Each product is CUTLASS's TMA warp-specialized GEMM (wgmma from shared memory, FP32 accumulators)
// with one of its epilogue fusion operations (cutlass/epilogue/fusion/operations.hpp):
//   forward:  LinCombPerColBiasEltActAux: Z = alpha acc + bias[n] (FP32; a null bias adds 0),
//             aux = BF16(Z) through its own TMA store, D = BF16(GELU(Z)): GELU of the FP32 Z, not of
//             the rounded aux, as cuBLASLt's GELU_AUX_BIAS;
//   backward: LinCombDeEltAct: D = BF16(GELU'(aux) (alpha acc)), aux loaded by TMA beside the tile.
// No source C (ElementC void: beta = 0, nothing read), so the D store is delayed behind the next
// tile's math. CUTLASS's own GELU functors (GELU_taylor, dGELU in cutlass/epilogue/thread/activation.h)
// are the tanh form too but use tanh.approx.f32 (relative error ~2^-11), which leaves nothing of
// 1 + tanh(u) in the negative tail (x = -3.5: 1 + tanh = 7e-4, the approximation's error 5e-4);
// hence GeluTanh and GeluTanhBackward below.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/array.h>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/dispatch_policy.hpp>
#include <cutlass/epilogue/fusion/operations.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/kernel_hardware_info.h>
#include <cutlass/numeric_types.h>

#include "stableflash/model/cuda/cutlass_gelu_gemm.hpp"

namespace stableflash::model::cuda::gelu_gemm {

// GPT-2's GELU, 0.5 x (1 + tanh u) with u = sqrt(2/pi) (x + 0.044715 x^3), in FP32 through the
// logistic function: with e = exp(-2u), s = 0.5 (1 + tanh u) = 1 / (1 + e) and
// r = 0.5 (1 - tanh u) = e s, neither a difference of nearly equal numbers (tanh's 1 + t is one in
// the negative tail, 1 - t in the positive one):
//   GELU(x) = x s,   GELU'(x) = s + 2 x s r sqrt(2/pi) (1 + 3 0.044715 x^2)
// (1 - t^2 = 4 s r). Error: exp2f (2 ulps) of an argument rounded with relative error ~2^-23,
// |2u| < 90 where it matters, and one approximate division (2 ulps): a few 2^-20 relative in
// s and r, far inside the 2^-16 that the tests allow for the FP32 evaluation, far outside the
// reach of tanh.approx. Where e overflows (u < -44, x < -9.5) s = 0: GELU and GELU' are 0, the true
// values below 1e-37.
struct GeluMath {
  static constexpr float kSqrt2OverPi = 0.7978845608028654f;
  static constexpr float kCubic = 0.044715f;
  static constexpr float kMinusTwoLog2e = -2.8853900817779268f;  // exp(-2u) = 2^(u * this)

  CUTLASS_HOST_DEVICE static float divide(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fdividef(a, b);  // 2 ulps; a / inf = 0, which the overflow above relies on
#else
    return a / b;
#endif
  }
  CUTLASS_HOST_DEVICE static float exp_minus_2u(float x) {
    const float u = kSqrt2OverPi * x * (1.0f + kCubic * x * x);
    return exp2f(kMinusTwoLog2e * u);
  }
  CUTLASS_HOST_DEVICE static float gelu(float x) { return divide(x, 1.0f + exp_minus_2u(x)); }
  CUTLASS_HOST_DEVICE static float gelu_grad(float x) {
    const float e = exp_minus_2u(x);
    const float s = divide(1.0f, 1.0f + e);
    const float r = e < 1.0f ? e * s : 1.0f - s;  // 1 - s only where s <= 1/2 (no cancellation); e = inf: 1
    return s * (1.0f + 2.0f * kSqrt2OverPi * x * r * (1.0f + 3.0f * kCubic * x * x));
  }
};

// The activation functors in the form CUTLASS's Sm90Compute calls them: on a fragment
// (cutlass::Array<float, N>), instantiated on the element for its argument lookup.
template <class T>
struct GeluTanh {
  static constexpr bool kIsHeavy = true;
  CUTLASS_HOST_DEVICE T operator()(T const& x) const { return T(GeluMath::gelu(float(x))); }
};
template <class T, int N>
struct GeluTanh<cutlass::Array<T, N>> {
  static constexpr bool kIsHeavy = true;
  CUTLASS_HOST_DEVICE cutlass::Array<T, N> operator()(cutlass::Array<T, N> const& x) const {
    cutlass::Array<T, N> y;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) y[i] = GeluTanh<T>{}(x[i]);
    return y;
  }
};

// dy * GELU'(z): the backward through the GELU, z its forward input (the aux).
template <class T>
struct GeluTanhBackward {
  static constexpr bool kIsHeavy = true;
  CUTLASS_HOST_DEVICE T operator()(T const& dy, T const& z) const { return T(float(dy) * GeluMath::gelu_grad(float(z))); }
};
template <class T, int N>
struct GeluTanhBackward<cutlass::Array<T, N>> {
  static constexpr bool kIsHeavy = true;
  CUTLASS_HOST_DEVICE cutlass::Array<T, N> operator()(cutlass::Array<T, N> const& dy, cutlass::Array<T, N> const& z) const {
    cutlass::Array<T, N> y;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) y[i] = GeluTanhBackward<T>{}(dy[i], z[i]);
    return y;
  }
};

enum class Schedule {
  pingpong,     // two consumer warp groups on two tiles: one's epilogue overlaps the other's MMAs
  cooperative,  // two consumer warp groups share one tile (half of M each), epilogue after the MMAs
};

// A tile configuration: CTA tile M x N (x 64 of K, four 128-byte swizzled BF16 k-blocks), the
// thread-block cluster (CTAs along M x N; the cluster multicasts the shared operand's tiles).
template <int TileM, int TileN, int ClusterM, int ClusterN, Schedule S>
struct Config {
  using TileShape = cute::Shape<cute::Int<TileM>, cute::Int<TileN>, cute::_64>;
  using ClusterShape = cute::Shape<cute::Int<ClusterM>, cute::Int<ClusterN>, cute::_1>;
  using MainloopSchedule = std::conditional_t<S == Schedule::pingpong, cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                                              cutlass::gemm::KernelTmaWarpSpecializedCooperative>;
  using EpilogueSchedule = std::conditional_t<S == Schedule::pingpong, cutlass::epilogue::TmaWarpSpecialized,
                                              cutlass::epilogue::TmaWarpSpecializedCooperative>;
  static std::string name() {
    return std::string(S == Schedule::pingpong ? "pingpong" : "cooperative") + " " + std::to_string(TileM) + "x" + std::to_string(TileN) +
           "x64 cluster " + std::to_string(ClusterM) + "x" + std::to_string(ClusterN);
  }
};

// The configuration the library runs (cutlass_gelu_gemm.cu), for both products. Why: at GPT-2
// 124M's MLP (m = 16384 tokens, n = 3072, k = 768) a tile's mainloop is short (12 k-blocks, ~4 us
// for 128 x 128 at the H200's ~790 TFLOP/s over 132 SMs) and the epilogue heavy for an epilogue:
// two MUFU operations (exp2, reciprocal) and a dozen FP32 ones per element and two BF16 matrices
// moved (D and aux), ~2 us for a 128 x 128 tile on one warp group. Pingpong runs one warp group's
// epilogue while the other's MMAs keep the tensor cores busy; the cooperative schedule (128 x 256,
// both warp groups on one tile) runs it after the MMAs. 128 x 128 tiles make 3,072 tiles = 23.3
// waves of 132 SMs (a 1.4% tail); the cluster pair along M shares (multicasts) the weight tile.
// The GEMM lab (scripts/gemm-lab.sh) times it against its rivals (gemm_lab_cutlass.cuh).
using ProductionConfig = Config<128, 128, 2, 1, Schedule::pingpong>;

// The GEMM of one product (row-major problem [m, n, k], as cutlass_gelu_gemm.hpp states it; in
// CUTLASS's terms A is [M, K] K-major, B is [N, K] and K-major for the backward, N-major for the
// forward, D and aux [M, N] N-major).
template <GeluGemm Which, class Cfg>
struct Kernel {
  static constexpr bool kForward = Which == GeluGemm::forward;
  using Element = cutlass::bfloat16_t;
  static constexpr int kAlignment = 8;  // elements: 16 bytes, what TMA needs
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = std::conditional_t<kForward, cutlass::layout::RowMajor, cutlass::layout::ColumnMajor>;
  using LayoutD = cutlass::layout::RowMajor;
  using FusionOp = std::conditional_t<
      kForward,
      cutlass::epilogue::fusion::LinCombPerColBiasEltActAux<LayoutD, GeluTanh, Element, float, /*aux*/ Element, /*bias*/ Element>,
      cutlass::epilogue::fusion::LinCombDeEltAct<LayoutD, GeluTanhBackward, Element, float, /*aux*/ Element>>;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, typename Cfg::TileShape, typename Cfg::ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, /*C*/ void, LayoutD, kAlignment, Element, LayoutD, kAlignment,
      typename Cfg::EpilogueSchedule, FusionOp>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA, kAlignment, Element, LayoutB, kAlignment, float,
      typename Cfg::TileShape, typename Cfg::ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      typename Cfg::MainloopSchedule>::CollectiveOp;
  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
  using StrideA = typename GemmKernel::StrideA;
  using StrideB = typename GemmKernel::StrideB;
  using StrideD = typename GemmKernel::StrideD;
  static_assert(std::is_same_v<StrideA, cute::Stride<int64_t, cute::_1, int64_t>>, "A: [M, K] with unit stride along K");
  static_assert(std::is_same_v<StrideD, cute::Stride<int64_t, cute::_1, int64_t>>, "D: [M, N] with unit stride along N");

  static typename Gemm::Arguments arguments(const GeluGemmArgs& p, int device, int sm_count) {
    StrideB stride_b;
    if constexpr (kForward)
      stride_b = cute::make_stride(cute::_1{}, int64_t(p.ldb), int64_t(0));  // B(n, k) at k ldb + n
    else
      stride_b = cute::make_stride(int64_t(p.ldb), cute::_1{}, int64_t(0));  // B(n, k) at n ldb + k
    const StrideA stride_a = cute::make_stride(int64_t(p.lda), cute::_1{}, int64_t(0));
    const StrideD stride_d = cute::make_stride(int64_t(p.ldd), cute::_1{}, int64_t(0));
    typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                  {p.m, p.n, p.k, 1},
                                  {static_cast<const Element*>(p.a), stride_a, static_cast<const Element*>(p.b), stride_b},
                                  {{}, nullptr, stride_d, static_cast<Element*>(p.d), stride_d},
                                  cutlass::KernelHardwareInfo{device, sm_count}};
    auto& fusion = args.epilogue.thread;
    fusion.alpha = p.alpha;
    fusion.beta = 0.0f;
    fusion.dAux = stride_d;
    if constexpr (kForward) {
      fusion.aux_ptr = static_cast<Element*>(p.aux);
      fusion.bias_ptr = static_cast<const Element*>(p.bias);
    } else {
      fusion.aux_ptr = static_cast<const Element*>(p.aux);
    }
    return args;
  }

  static bool supported(const GeluGemmArgs& p) {
    auto aligned = [](const void* q) { return reinterpret_cast<std::uintptr_t>(q) % 16 == 0; };
    if (p.m < 1 || p.n < 1 || p.k < 1 || !p.a || !p.b || !p.d || !p.aux) return false;
    if (!aligned(p.a) || !aligned(p.b) || !aligned(p.d) || !aligned(p.aux) || !aligned(p.bias)) return false;
    if (!kForward && p.bias) return false;
    const std::int64_t b_row = kForward ? p.n : p.k;
    if (p.lda < p.k || p.ldb < b_row || p.ldd < p.n) return false;
    if (p.lda % kAlignment || p.ldb % kAlignment || p.ldd % kAlignment || p.n % kAlignment || p.k % kAlignment) return false;
    const auto args = arguments(p, 0, 1);
    return Gemm::can_implement(args) == cutlass::Status::kSuccess && Gemm::get_workspace_size(args) == 0;
  }

  // Launches on the current device; the status of CUTLASS's initialize and run.
  static cutlass::Status run(const GeluGemmArgs& p, int device, int sm_count, cudaStream_t stream) {
    Gemm gemm;
    const auto args = arguments(p, device, sm_count);
    cutlass::Status st = gemm.initialize(args, /*workspace=*/nullptr, stream);
    if (st != cutlass::Status::kSuccess) return st;
    return gemm.run(stream);
  }
};

}  // namespace stableflash::model::cuda::gelu_gemm
