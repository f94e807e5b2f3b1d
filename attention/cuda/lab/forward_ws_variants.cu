// The kernel lab's builds of the warp-specialized forward (forward_ws_kernel.cuh) with traits that
// production does not instantiate: three consumers of 64-key steps at head dim 128
// (`--forward-kernel wgmma-ws-3c64`), 192-row tiles whose K/V tiles are shared three ways, where
// production runs two consumers of 128-key steps (three of 128 keys do not fit the registers: S 64,
// P 32 and O 64 a thread beside 160 after setmaxnreg). Standard shift only (one instantiation).
#include <algorithm>
#include <stdexcept>

#include "forward_ws_kernel.cuh"
#include "lab/lab_launch.hpp"
#include "launch.hpp"

namespace stableflash::attention::cuda::lab {

void launch_ws_three_consumers_64(const ForwardParams& p, const ForwardPlan& plan, cudaStream_t stream) {
#if SF_CUDA_HD128
  if (plan.head_dim != 128 || plan.policy != ShiftPolicy::standard)
    throw std::invalid_argument("kernel lab wgmma-ws-3c64: head dim 128 and the standard shift only");
  using Traits = WsForwardTraits<128, 3, 64>;
  constexpr auto kernel = attention_forward_ws_kernel<Traits, StandardShift>;
  static const bool configured = (allow_smem(kernel, Traits::kSmemBytes), true);
  (void)configured;
  const int tiles = blocks_of(p.q_len, Traits::kCtaRows) * p.heads * p.batch;
  const int ctas = plan.schedule == TileSchedule::per_cta ? tiles : std::min(tiles, plan.sms);
  launch_after_previous(kernel, dim3(unsigned(ctas)), Traits::kThreads, Traits::kSmemBytes, stream, p);
  check_cuda(cudaGetLastError(), "lab wgmma-ws-3c64 forward launch");
#else
  (void)p, (void)plan, (void)stream;
  throw std::invalid_argument("kernel lab wgmma-ws-3c64: this build has no head dim 128 kernels");
#endif
}

}  // namespace stableflash::attention::cuda::lab
