// The backward's `exact` delta (docs/numerics-contract.md `delta_source`): delta_i = FP32-rowsum
// (dP_ij P_ij) over the keys row i sees, with dP = dO V^T and P = exp(S - lse), S = Q K^T: one
// pass over the keys of its own, no O involved. For sm_90a, on the forward's tiles and products
// (row_tiles.cuh): a warpgroup owns 64 query rows of one (b, h), 16 per warp (the m64
// of a wgmma). A CTA is kDeltaExactWarpgroups<D> of them on consecutive row blocks, sharing the K
// and V tiles: one at D = 64 (four CTAs share an SM and overlap each other's products and
// arithmetic), two at D = 128 (half the K/V traffic from L2 at the same threads per SM). Q and dO
// arrive once by bulk tensor copies (TMA), K and V in tiles of kDeltaExactKeys<D> keys (64 at D = 64,
// 128 at 128) double buffered, one thread of a copy warp (a warpgroup at D = 128, whose registers
// the consumers take) after the warpgroups issuing every copy (it refills a slot once every
// consumer warp is done with it, so neither warpgroup waits for the other). Per warpgroup and key tile
//   S = Q K^T, dP = dO V^T            wgmma m64n64 / m64n128, both operands K-major from SW128 shared memory
//                                     (the forward's S), committed as two groups: P is formed while
//                                     dP is still on the tensor cores; with two warpgroups the next
//                                     tile's S is issued before this tile's P dP is added (kAhead)
//   part += P dP                      per element, in accumulator order (the mma.sync m16n8
//                                     layout per warp: rows g, g + 8, keys 8 nj + 2t + {0, 1})
// and at the end the quad's four parts are added (quad_sum). The elementwise expressions are the
// main backward kernel's (backward_common.cuh probs_and_dscores): fused::prob_fast(fused::score)
// or paper::prob(paper::score) times dP (paper: paper::dprob(dP)); keys a row does not see (past
// Tk, past the causal diagonal) get S = -inf, so P = 0. Rows past Tq read zeros (the copy engine
// fills them) and are not stored.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backward_common.cuh"
#include "exact_delta_order.cuh"
#include "kernel_params.cuh"
#include "row_tiles.cuh"
#include "stableflash/attention/rounding_points.hpp"
#include "tma.cuh"
#include "warp_mma.cuh"
#include "warpgroup_registers.cuh"
#include "wgmma.cuh"

namespace stableflash::attention::cuda {

// Warpgroups per CTA of the exact delta pass, per head dim, from one H200 run of both at each
// (docs/benchmarks.md, 2026-12-01): the exact backward at D = 128 took 4.26-4.41 ms with two
// against 4.53-4.75 with one (8,16,4096,128 causal) and 15.5 against 16.6-16.7 ms (2,16,16384,128
// causal); at D = 64 0.348-0.349 ms with one against 0.353-0.356 with two (16,12,1024,64 causal).
template <int D>
inline constexpr int kDeltaExactWarpgroups = D == 128 ? 2 : 1;
// Keys per K/V tile: 128 at D = 128, where the products are m64n128 (an m64n64 pair of
// shared-memory operands reads as many bytes from shared memory as the tensor cores multiply, which
// leaves the copies of the next tiles no bandwidth), 64 at D = 64 (four CTAs an SM; 128-key tiles
// would leave room for two).
template <int D>
inline constexpr int kDeltaExactKeys = D == 128 ? 128 : 64;

// Shared memory of delta_exact_kernel: tiles in the SW128 layout (wgmma.cuh), Q and dO [64, D] one
// per warpgroup, K and V [BK, D]; barriers: Q and dO arrived; K/V slot 0, 1 arrived (full); every
// warp is done with slot 0, 1 (free).
template <int D, int W, int BK = kDeltaExactKeys<D>>
struct DeltaExactStorage {
  static constexpr int kTile = 64 * D * 2, kKvTile = BK * D * 2;
  std::uint16_t q[W][64 * D];
  std::uint16_t d_o[W][64 * D];
  std::uint16_t k[2][BK * D];  // double buffered
  std::uint16_t v[2][BK * D];
  std::uint64_t barriers[5];
  static_assert(kTile % 1024 == 0 && kKvTile % 1024 == 0, "SW128 atoms are 1024-byte aligned");
};

// Threads of a CTA: W warpgroups and the copy warp, which is a whole warpgroup where W = 2. There
// ptxas (CUDA 13.0) gives a thread at most 168 registers (the CTA counted in whole warpgroups,
// cta_start_registers(384)), and a consumer holding two tiles' S and one dP (64 registers each at
// 128 keys) needs more; the copy warpgroup gives its registers to the consumers (setmaxnreg, which
// all four of its warps execute), as the backward's producer does.
__host__ __device__ constexpr int delta_exact_copy_threads(int warpgroups) { return warpgroups > 1 ? 128 : 32; }
__host__ __device__ constexpr int delta_exact_threads(int warpgroups) { return 128 * warpgroups + delta_exact_copy_threads(warpgroups); }
// The setmaxnreg budgets where the copy threads are a warpgroup (the backward's: 24 / 240).
inline constexpr int kDeltaExactCopyRegisters = 24, kDeltaExactConsumerRegisters = 240;
static_assert(kDeltaExactCopyRegisters + 2 * kDeltaExactConsumerRegisters <= 3 * cta_start_registers(delta_exact_threads(2)),
              "setmaxnreg only moves the CTA's registers between its warpgroups");

// Grid (ceil(Tq / (64 W)), H, B), delta_exact_threads(W) threads.
template <int D, bool kPaper, int W>
__global__ void __launch_bounds__(delta_exact_threads(W)) delta_exact_kernel(const __grid_constant__ BackwardParams p) {
  allow_dependent_launch();  // the main kernel's CTAs may start their prologue (they wait for this grid's end)
  clear_zero_word_share(p);  // what the main kernel needs zero, as the pass from the output clears it
  constexpr int BQ = 64, BK = kDeltaExactKeys<D>, NT = BK / 8;
  using Storage = DeltaExactStorage<D, W, BK>;
  constexpr int kTile = Storage::kTile, kKvTile = Storage::kKvTile;
  static_assert(offsetof(Storage, k) % 1024 == 0 && offsetof(Storage, v) % 1024 == 0, "SW128 atoms are 1024-byte aligned");
  extern __shared__ __align__(1024) unsigned char smem[];
  auto& shared = *reinterpret_cast<Storage*>(smem);
  const std::uint32_t s_q = smem_u32(shared.q), s_do = smem_u32(shared.d_o), s_k0 = smem_u32(shared.k), s_v0 = smem_u32(shared.v);
  const std::uint32_t bar_qdo = smem_u32(shared.barriers);
  auto bar_full = [&](int slot) { return bar_qdo + 8 * (1 + slot); };
  auto bar_free = [&](int slot) { return bar_qdo + 8 * (3 + slot); };

  // The warpgroup index broadcast from lane 0: warp-uniform to the compiler, so the addresses
  // derived from it (wgmma descriptors) stay in uniform registers. W: the copy warp.
  const int wg = __shfl_sync(0xffffffffu, int(threadIdx.x / 128), 0);
  const int copier = 128 * W;  // the copy warp's issuing thread
  // Causal rows late in the sequence see the most keys: their blocks start first (as the forward's).
  const bool causal = p.causal != 0;
  const int b = blockIdx.z, h = blockIdx.y, m_cta = (causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * (W * BQ);
  const int m0 = m_cta + wg * BQ;  // this warpgroup's rows
  const int warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const std::uint32_t s_q_wg = s_q + wg * kTile, s_do_wg = s_do + wg * kTile;
  const std::int64_t row_base = (std::int64_t(b) * p.heads + h) * p.q_len;
  const int kv_h = h / p.kv_group;  // grouped-query heads share K/V

  // keys up to the CTA's last row's last visible one (none for causal rows before the first key:
  // Tq > Tk); with two warpgroups the first one's last tile may be masked whole for it
  const int cta_last_row = m_cta + min(W * BQ, p.q_len - m_cta) - 1;  // no m_cta + 128 overflow
  const int n_keys = max(0, last_key(cta_last_row, p.q_len, p.k_len, causal) + 1);
  const int min_last = last_key(m0, p.q_len, p.k_len, causal);
  const int n_steps = (n_keys + BK - 1) / BK;

  // K and V of step s into slot s % 2 (its free barrier passed, or never used yet)
  auto issue_kv = [&](int s) {
    const int slot = s & 1;
    mbar_arrive_expect_tx(bar_full(slot), 2 * kKvTile);
    load_tile_boxes<D, BK>(&p.tma_k, s_k0 + slot * kKvTile, s * BK, kv_h, b, bar_full(slot));
    load_tile_boxes<D, BK>(&p.tma_v, s_v0 + slot * kKvTile, s * BK, kv_h, b, bar_full(slot));
  };
  if (threadIdx.x == copier) {
    mbar_init(bar_qdo, 1);
    for (int slot = 0; slot < 2; ++slot) mbar_init(bar_full(slot), 1), mbar_init(bar_free(slot), 4 * W);
    mbar_fence_init();
    if (n_steps > 0) {  // no copy may still be in flight when the CTA exits
      mbar_arrive_expect_tx(bar_qdo, 2 * W * kTile);
#pragma unroll
      for (int w = 0; w < W; ++w) {  // rows wholly past Tq arrive as zeros (and are not stored)
        load_tile_boxes<D, 64>(&p.tma_q, s_q + w * kTile, m_cta + w * BQ, h, b, bar_qdo);
        load_tile_boxes<D, 64>(&p.tma_do, s_do + w * kTile, m_cta + w * BQ, h, b, bar_qdo);
      }
      issue_kv(0);
      if (n_steps > 1) issue_kv(1);
    }
  }
  __syncthreads();  // the barriers are initialized
  constexpr bool kReconfigure = delta_exact_copy_threads(W) == 128;  // a copy warpgroup: its registers go to the consumers
  if (wg == W) {  // the copy warp: slot s % 2 refilled with step s once step s - 2 is done with it
    if constexpr (kReconfigure) release_registers<kDeltaExactCopyRegisters>();
    if (threadIdx.x == copier) {
      for (int s = 2; s < n_steps; ++s) {
        mbar_wait(bar_free(s & 1), ((s >> 1) - 1) & 1);
        issue_kv(s);
      }
    }
    return;
  }
  if constexpr (kReconfigure) claim_registers<kDeltaExactConsumerRegisters>();

  // A row's keys fit one main-kernel CTA: this pass then adds in that kernel's order (attention_delta
  // alone must give the backward's bits; a warp-uniform branch, one per key tile)
  const bool one_block = p.k_len <= kExactDeltaGroups * kExactDeltaGroupKeys;
  const auto mode_dprob = [](float dp) { return exact_delta_dprob<kPaper>(dp); };
  int last[2];
  float lse[2], part[2] = {0.0f, 0.0f};
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int i = m0 + warp * 16 + g + 8 * hf;
    last[hf] = i < p.q_len ? last_key(i, p.q_len, p.k_len, causal) : -1;
    lse[hf] = i < p.q_len ? p.lse[row_base + i] : __builtin_huge_valf();
  }
  if (n_steps > 0) mbar_wait(bar_qdo, 0);

  // Per tile s: S and dP issued, P formed while dP runs, then P dP added. With two warpgroups a
  // consumer has the registers for a second S, so the next tile's S is issued before this tile's
  // P dP is added and runs on the tensor cores meanwhile (FlashAttention-3's intra-warpgroup
  // overlap); with one (D = 64, four CTAs an SM) the other CTAs fill that time. The loop's
  // iterations end with every product landed: accumulators in flight across the back edge (where
  // the compiler may copy them) would serialize the wgmma (ptxas C7515).
  constexpr bool kAhead = kReconfigure;  // the second S takes the registers the copy warpgroup gives
  float sc[2][NT][4], dp[NT][4];  // [64 rows, BK keys]: this thread's rows 16 warp + g (+ 8), keys 8 nj + 2t (+ 1)
  auto issue_s = [&](float (&c)[NT][4], int s) {
    mbar_wait(bar_full(s & 1), (s >> 1) & 1);
    wgmma_fence();
    issue_scores<D, BK>(c, s_q_wg, s_k0 + (s & 1) * kKvTile);
    wgmma_commit();
  };
  // dP_s; `fence`: dP's registers were read since the last wgmma_fence (an issue right after S's needs none)
  auto issue_dp = [&](int s, bool fence) {
    if (fence) wgmma_fence();
    issue_scores<D, BK>(dp, s_do_wg, s_v0 + (s & 1) * kKvTile);
    wgmma_commit();
  };
  auto form_p = [&](float (&c)[NT][4], int s) {  // S_s into P_s while dP_s runs; returns with dP_s landed
    wgmma_wait<1>();  // S has landed; dP may still run
    fence_registers(c);
    if (s * BK + BK - 1 > min_last) {  // keys a row does not see: S = -inf, so P = 0 (one branch per tile)
#pragma unroll
      for (int nj = 0; nj < NT; ++nj)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (s * BK + nj * 8 + 2 * t + (e & 1) > last[e / 2]) c[nj][e] = -__builtin_huge_valf();
    }
#pragma unroll
    for (int nj = 0; nj < NT; ++nj)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        c[nj][e] = kPaper ? paper::prob(paper::score(c[nj][e], p.scale), lse[e / 2])
                          : fused::prob_fast(fused::score(c[nj][e], p.scale), lse[e / 2]);
    wgmma_wait<0>();  // dP has landed: this thread's products no longer read the slot
    fence_registers(dp);
  };
  auto add_pdp = [&](const float (&c)[NT][4]) {
    if (one_block) {  // exact_delta_order.cuh: 16-key groups, each summed as the main kernel sums it
#pragma unroll
      for (int w = 0; w < BK / kExactDeltaGroupKeys; ++w)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          float a[2];
#pragma unroll
          for (int e2 = 0; e2 < 2; ++e2) {
            const int e = 2 * hf + e2;
            a[e2] = exact_delta_key_pair(c[2 * w][e], mode_dprob(dp[2 * w][e]), c[2 * w + 1][e], mode_dprob(dp[2 * w + 1][e]));
          }
          part[hf] = __fadd_rn(part[hf], quad_sum(__fadd_rn(a[0], a[1])));
        }
    } else {
#pragma unroll
      for (int nj = 0; nj < NT; ++nj)
#pragma unroll
        for (int e = 0; e < 4; ++e) part[e / 2] += c[nj][e] * mode_dprob(dp[nj][e]);
    }
  };
  // tile s, P_s in `cur` (formed ahead where kAhead): its P dP added
  auto tile_alone = [&](float (&cur)[NT][4], int s) {
    if constexpr (!kAhead) issue_s(cur, s), issue_dp(s, false), form_p(cur, s);
    if (lane == 0) mbar_arrive(bar_free(s & 1));  // this warp no longer reads the slot
    add_pdp(cur);
  };
  // the same with S_(s+1) issued into `next` first and P_(s+1) formed after. Called only where a tile
  // follows: wgmma issued under a run-time condition make ptxas serialize them (C7514), as if the
  // P dP additions read an accumulator still in flight.
  auto tile_ahead = [&](float (&cur)[NT][4], float (&next)[NT][4], int s) {
    if (lane == 0) mbar_arrive(bar_free(s & 1));
    issue_s(next, s + 1);
    add_pdp(cur);
    issue_dp(s + 1, true);
    form_p(next, s + 1);
  };
  if constexpr (kAhead) {
    if (n_steps > 0) issue_s(sc[0], 0), issue_dp(0, false), form_p(sc[0], 0);
    int s = 0;
    for (; s + 2 < n_steps; s += 2) {  // two tiles an iteration, each with one after it: S's buffers by constant index
      tile_ahead(sc[0], sc[1], s);
      tile_ahead(sc[1], sc[0], s + 1);
    }
    if (s + 1 < n_steps) {  // the last two tiles
      tile_ahead(sc[0], sc[1], s);
      tile_alone(sc[1], s + 1);
    } else if (s < n_steps) {  // the last one
      tile_alone(sc[0], s);
    }
  } else {
    for (int s = 0; s < n_steps; ++s) tile_alone(sc[0], s);
  }
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const float sum = one_block ? part[hf] : quad_sum(part[hf]);  // one_block: every group already quad-summed
    const int i = m0 + warp * 16 + g + 8 * hf;
    if (t == 0 && i < p.q_len) p.delta[row_base + i] = sum;
  }
}

}  // namespace stableflash::attention::cuda
