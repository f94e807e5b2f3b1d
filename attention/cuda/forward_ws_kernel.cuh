// The warp-specialized fused forward for sm_90a (FlashAttention-3's CTA layout): one producer
// warpgroup whose single thread issues every bulk tensor copy, and kConsumers consumer warpgroups
// of 64 query rows each that share every K/V tile (WsForwardTraits). Against the one-warpgroup
// kernel (forward_wgmma_kernel.cuh) each K/V tile crosses L2 -> SM once per 64 kConsumers query
// rows instead of once per 64, the copies run ahead of the consumers without a CTA-wide barrier
// per step, and the producer gives its registers to the consumers (setmaxnreg), so 128-key steps
// fit at D = 128.
//
// Runs the `fused` fast path at D = 128 only (one shift per 128-key step, no event counters, a
// policy that needs no tile-wide tie count); everything else, D = 64 included (faster there with
// four one-warpgroup CTAs per SM, kernel_params.cuh), takes the one-warpgroup kernel. The consumers'
// walk is forward_pipelined_walk, the same code the one-warpgroup kernel runs, fed by ProducerFeed.
//
// Shared memory (WsForwardTraits::SharedStorage): Q of each consumer [64, D], the K and V stages, a
// residual tile per consumer, the barriers. The epilogue stages O in the consumer's own Q tile (no
// product reads it after the last S) and the residual in its own tile, then stores both by TMA.
#pragma once

#include <cstdint>
#include <cutlass/arch/reg_reconfig.h>  // warpgroup_reg_alloc / dealloc

#include "forward_rows.cuh"
#include "forward_wgmma_kernel.cuh"
#include "kernel_params.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

namespace stableflash::attention::cuda {

// Warpgroup register budgets (setmaxnreg, CUTLASS's wrappers; all warps of a warpgroup execute
// it). The kernel starts at 65536 / 384 = 168 per thread; the producer needs a handful.
#if defined(__CUDA_ARCH__) && !CUDA_CTA_RECONFIG_ACTIVATED
#error "the warp-specialized forward needs setmaxnreg (sm_90a): CUTLASS's wrappers would be no-ops"
#endif
template <int kRegs>
__device__ __forceinline__ void release_registers() {
  cutlass::arch::warpgroup_reg_dealloc<kRegs>();
}
template <int kRegs>
__device__ __forceinline__ void claim_registers() {
  cutlass::arch::warpgroup_reg_alloc<kRegs>();
}

// Barrier slots (8 bytes each) after the tiles: per consumer a Q barrier; per stage K full,
// V full (the producer's copies landed) and K empty, V empty (every consumer thread is done with it).
template <int kConsumers>
struct WsBarriers {
  static constexpr int kStages = kWsForwardStages;
  std::uint32_t base;
  __device__ std::uint32_t q(int consumer) const { return base + 8 * consumer; }
  __device__ std::uint32_t k_full(int s) const { return base + 8 * (kConsumers + s); }
  __device__ std::uint32_t v_full(int s) const { return base + 8 * (kConsumers + kStages + s); }
  __device__ std::uint32_t k_empty(int s) const { return base + 8 * (kConsumers + 2 * kStages + s); }
  __device__ std::uint32_t v_empty(int s) const { return base + 8 * (kConsumers + 3 * kStages + s); }
};

// The consumers' side of the K/V ring: tile j sits in stage j % kStages; its n-th use (n = j /
// kStages) completes phase n of the stage's full barrier.
template <class Traits>
struct ProducerFeed {
  static constexpr int kStages = kWsForwardStages;
  std::uint32_t s_k0, s_v0;
  WsBarriers<Traits::kConsumers> bars;

  __device__ std::uint32_t k(int j) const { return s_k0 + (j % kStages) * Traits::kSmemKV; }
  __device__ std::uint32_t v(int j) const { return s_v0 + (j % kStages) * Traits::kSmemKV; }
  __device__ void start() const {}
  __device__ void begin_step(int) const {}
  __device__ void wait_k(int j) const { mbar_wait(bars.k_full(j % kStages), (j / kStages) & 1); }
  __device__ void wait_v(int j) const { mbar_wait(bars.v_full(j % kStages), (j / kStages) & 1); }
  __device__ void release_k(int j) const { mbar_arrive(bars.k_empty(j % kStages)); }
  __device__ void release_v(int j) const { mbar_arrive(bars.v_empty(j % kStages)); }
  __device__ void end_step() const {}
};

// The producer: Q of every consumer, then K_j and V_j for every step, each into its stage as soon
// as the consumers have handed the stage's previous tile back. K_j goes before V_j: the consumers
// need K_(j+1) before V_j (S_(j+1) is issued ahead of P_j V_j).
template <class Traits>
__device__ __forceinline__ void produce_tiles(const ForwardParams& p, const ProducerFeed<Traits>& feed, std::uint32_t s_q,
                                              int m0, int h, int b, int total) {
  constexpr int D = Traits::kHeadDim, BK = Traits::kBlockK, S = kWsForwardStages;
  const int kv_h = h / p.kv_group;  // grouped-query heads share K/V
#pragma unroll
  for (int c = 0; c < Traits::kConsumers; ++c) load_tile<D, 64>(&p.tma_q, s_q + c * Traits::kSmemQ, m0 + 64 * c, h, b, feed.bars.q(c));
  for (int j = 0; j < total; ++j) {
    const int s = j % S, use = j / S;
    if (use > 0) mbar_wait(feed.bars.k_empty(s), (use - 1) & 1);
    load_tile<D, BK>(&p.tma_k, feed.k(j), j * BK, kv_h, b, feed.bars.k_full(s));
    if (use > 0) mbar_wait(feed.bars.v_empty(s), (use - 1) & 1);
    load_tile<D, BK>(&p.tma_v, feed.v(j), j * BK, kv_h, b, feed.bars.v_full(s));
  }
}

template <class Traits, class Policy>
__global__ void __launch_bounds__(Traits::kThreads, 1) attention_forward_ws_kernel(const __grid_constant__ ForwardParams p) {
  static_assert(kFastPathInstantiable<Traits::kPaper, Policy>, "the fast path only");
  constexpr int D = Traits::kHeadDim, BK = Traits::kBlockK;
  using Rows = ForwardRows<Traits, Policy>;

  extern __shared__ __align__(1024) unsigned char smem[];
  auto& shared = *reinterpret_cast<typename Traits::SharedStorage*>(smem);
  constexpr int C = Traits::kConsumers, kRows = Traits::kCtaRows;
  const std::uint32_t s_q = smem_u32(shared.q), s_res = smem_u32(shared.residual);
  const ProducerFeed<Traits> feed{smem_u32(shared.k), smem_u32(shared.v), WsBarriers<C>{smem_u32(shared.barriers)}};

  // Causal blocks late in the sequence see the most keys: launch those first.
  const int b = blockIdx.z, h = blockIdx.y, m0 = (p.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * kRows;
  // Every consumer walks the keys of the CTA's last row: causal steps past an earlier consumer's
  // rows are masked out whole (at most 64 (kConsumers - 1) keys' worth, on the diagonal only).
  const int total = (cta_keys<kRows, BK, false>(p, m0).n_keys + BK - 1) / BK;

  if (threadIdx.x == 0) {
    for (int i = 0; i < C; ++i) mbar_init(feed.bars.q(i), 1);
    for (int s = 0; s < kWsForwardStages; ++s) {
      mbar_init(feed.bars.k_full(s), 1), mbar_init(feed.bars.v_full(s), 1);
      mbar_init(feed.bars.k_empty(s), 128 * C), mbar_init(feed.bars.v_empty(s), 128 * C);  // every consumer thread
    }
    mbar_fence_init();
  }
  __syncthreads();  // the last CTA-wide barrier: the producer's idle warps leave below
  // a programmatic dependent of the kernel before it (launch_with): global memory only past here
  grid_dependency_wait();
  allow_dependent_launch();

  const int wg = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0);  // warp-uniform (see the wgmma backward)
  if (wg == 0) {
    release_registers<Traits::kProducerRegisters>();
    if (threadIdx.x == 0) produce_tiles<Traits>(p, feed, s_q, m0, h, b, total);
    return;
  }
  claim_registers<Traits::kConsumerRegisters>();

  const int c = wg - 1, m0c = m0 + 64 * c;  // this consumer's 64 rows
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32, t = lane % 4;
  const std::uint32_t s_qc = s_q + c * Traits::kSmemQ;
  Rows rows(p, nullptr, nullptr, b, h, m0c + warp * 16 + lane / 4, warp * 16 + lane / 4);
  mbar_wait(feed.bars.q(c), 0);
  forward_pipelined_walk<D, BK>(p, rows, feed, total, last_key(m0c, p.q_len, p.k_len, p.causal != 0), t, s_qc);

  if (p.store_by_tma) {
    // Named barrier 1 + c: this consumer's 128 threads only.
    store_outputs_by_tma<Traits>(p, rows, m0c, h, b, t, s_qc, s_res + c * Traits::kSmemQ, tid == 0,
                                 [c] { named_barrier_sync(1 + c, 128); });
  } else {
    ForwardEpilogue<Rows>::store(rows, p, b, h, t);
  }
}

}  // namespace stableflash::attention::cuda
