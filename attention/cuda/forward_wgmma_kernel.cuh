// Flash-attention forward for sm_90a with warpgroup MMA (wgmma.mma_async, wgmma.cuh), in `fused`
// or `paper` numerics (Traits::kPaper) with any shift policy (template parameter). The key walk,
// the per-row softmax state and every rounding point are forward_rows.cuh's (ForwardRows), shared
// with the kernel lab's mma.sync forward; only the two products differ: S = Q K^T with both operands read by the tensor cores from shared
// memory, and O += P V with P from registers, one m64 instruction per 16 keys for the whole
// warpgroup instead of 2 x D/8 mma.sync per warp.
//
// A CTA is one warpgroup owning 64 query rows of one (b, h), 16 per warp, so every per-row
// quantity (max, shift, sums) lives in the four threads of a quad. Keys are walked in
// sub-tiles of 64, K and V double buffered (bulk tensor copies). The numerics' key tile (tile_k, a
// multiple of 64; docs/numerics-contract.md: rounding and tie detection are per tile) groups sub-tiles into
// "shift units": every sub-tile of a unit uses one shift m. When a unit spans several sub-tiles
// and its m needs the whole unit's maximum (always in `paper`; the published policy's tie count in
// `fused`), a pre-pass over the unit's keys computes S once more to find it: the kernel never
// holds more than one 64-key S tile. Every rounding point comes from rounding_points.hpp and the
// shift from shift_policies.hpp, the very code the CPU oracle runs.
#pragma once

#include <cstdint>
#include <type_traits>

#include "forward_rows.cuh"
#include "kernel_params.cuh"
#include "row_tiles.cuh"
#include "tma.cuh"
#include "warp_mma.cuh"
#include "wgmma.cuh"

namespace stableflash::attention::cuda {

// acc += BF16(P-bar) V over the first N keys of a V tile of kTileRows: A from registers, V MN-major
// (keys step 2048 bytes per k16; the 64-wide d blocks are a block of kTileRows rows apart). Issued,
// not waited for.
template <int D, int N, int kTileRows = N>
__device__ __forceinline__ void issue_pv(float (&acc)[D / 8][4], const std::uint32_t (&pa)[N / 16][4], std::uint32_t s_v) {
  static_assert(N <= kTileRows);
  const Sw128Desc v(s_v, WgmmaTile<kTileRows, D>::kBlockBytes, 1024);
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk) wgmma_pv<D>(acc, pa[kk], v.at(kk * 2048));
}

// The phases of a pipelined step (forward_pipelined_walk) at which a feed's mark() is called: the
// kernel lab's timeline (lab/forward_timeline.cu) stamps them with the SM's clock to see where a
// step's time goes; the production feeds' mark() is empty and compiles to nothing.
enum class StepMark : int {
  begin,         // the step starts (before the wait for K_j)
  k_ready,       // K_j has landed
  turn_taken,    // this consumer's turn to issue (the warp-specialized kernel's turns)
  issued,        // S_j and P_(j-1) V_(j-1) issued
  s_landed,      // S_j has landed
  softmax_done,  // the shift, P-bar and the row sums of S_j are done
  pv_landed,     // P_(j-1) V_(j-1) has landed
  end,           // acc rescaled, P-bar packed: the step is over
  count
};

// Where the fused fast path's K and V tiles come from (kv_h: the K/V head the CTA's query head reads).
// SelfFeed: the walking warpgroup's thread 0 issues the copies itself: Q (barrier 0) and K_0
// together at the start, so the CTA pays one L2 round trip before its first product rather than
// two; then one step ahead, into double buffers freed by a __syncthreads at the end
// of each step (K_j: bars + 8 (1 + j % 2), V_j: bars + 8 (3 + j % 2)); step j's copies (K_(j+1),
// V_j) go into buffers whose last readers, S_(j-1) and P_(j-2) V_(j-2), were waited for before the
// previous step's __syncthreads. The warp-specialized kernel's feed (forward_ws_kernel.cuh) waits
// for a producer warp's copies instead and hands each buffer back as soon as its product is done.
template <int D, int BK, int KV>
struct SelfFeed {
  static constexpr int kStepsPerIteration = 2;  // buffers alternate: forward_pipelined_walk unrolls by the parity
  const ForwardParams& p;
  int m0, h, kv_h, b, total;  // the CTA's 64 query rows from m0 of head h
  std::uint32_t s_q, s_k0, s_v0, bars;

  __device__ std::uint32_t k(int j) const { return s_k0 + (j & 1) * KV; }
  __device__ std::uint32_t v(int j) const { return s_v0 + (j & 1) * KV; }
  __device__ void start() const {
    if (threadIdx.x == 0) {
      load_tile<D, 64>(&p.tma_q, s_q, m0, h, b, bars);
      if (total > 0) load_tile<D, BK>(&p.tma_k, k(0), 0, kv_h, b, bars + 8);
    }
    mbar_wait(bars, 0);
  }
  __device__ void begin_step(int j) const {
    if (threadIdx.x != 0) return;
    if (j + 1 < total) load_tile<D, BK>(&p.tma_k, k(j + 1), (j + 1) * BK, kv_h, b, bars + 8 * (1 + ((j + 1) & 1)));
    load_tile<D, BK>(&p.tma_v, v(j), j * BK, kv_h, b, bars + 8 * (3 + (j & 1)));
  }
  __device__ void wait_k(int j) const { mbar_wait(bars + 8 * (1 + (j & 1)), (j >> 1) & 1); }
  __device__ void wait_v(int j) const { mbar_wait(bars + 8 * (3 + (j & 1)), (j >> 1) & 1); }
  __device__ void release_k(int) const {}
  __device__ void release_v(int) const {}
  __device__ void release_q() const {}  // Q stays for the CTA's one tile
  __device__ void take_turn() const {}  // one walking warpgroup: nobody to take turns with
  __device__ void pass_turn() const {}
  __device__ void end_step() const { __syncthreads(); }  // K_j and V_(j-1) are free for step j + 1's copies
  __device__ void mark(StepMark, int) const {}
};

// The fused fast path's key walk, one step of BK keys per j (FlashAttention-3's intra-warpgroup
// overlap): S_j = Q K_j^T and acc += P_(j-1) V_(j-1) are issued together; the softmax of S_j runs
// while the P V product is still on the tensor cores, and the rescale of acc by exp(m_old - m_new)
// waits for that product. P-bar stays FP32 in sc until P_(j-1) V_(j-1) has landed and is packed
// into pa then, so only one set of A fragments is live. K_j is handed back once S_j has landed,
// V_(j-1) once P_(j-1) V_(j-1) has, and Q once the walk's last S has (last: j is the last step).
// kKeys: the keys the step computes, BK or, for a walk's last step whose second half no row of the
// warpgroup sees (the causal diagonal, a sequence's last keys), its first BK / 2: the products
// and the softmax of masked keys give exact zeros (P-bar = 0, l + 0 = l, acc + 0 V = acc), so
// leaving them out changes no bit.
template <int D, int BK, int kKeys, PbarForm kForm, class Rows, class Feed>
__device__ __forceinline__ void pipelined_step(const ForwardParams& p, Rows& rows, const Feed& feed, int j, bool last, int min_last,
                                               int t, std::uint32_t s_q, std::uint32_t (&pa)[1][BK / 16][4]) {
  static_assert(kKeys == BK || kKeys == BK / 2);
  const int key0 = j * BK;
  feed.mark(StepMark::begin, j);
  feed.begin_step(j);
  feed.wait_k(j);
  feed.mark(StepMark::k_ready, j);
  feed.take_turn();  // several consumers of one CTA issue their products in turns
  feed.mark(StepMark::turn_taken, j);
  float sc[1][kKeys / 8][4];
  wgmma_fence();
  issue_scores<D, kKeys, BK>(sc[0], s_q, feed.k(j));
  wgmma_commit();
  if (j > 0) {
    feed.wait_v(j - 1);
    // The loop-top fence covers these registers (acc and pa were last written before it), but
    // ptxas does not see that across wait_v's retry loop and injected this same arrive itself,
    // with warning C7519 (the SASS is identical either way).
    wgmma_fence();
    issue_pv<D, BK>(rows.softmax.acc[0], pa[0], feed.v(j - 1));
    wgmma_commit();
    feed.pass_turn();
    feed.mark(StepMark::issued, j);
    wgmma_wait<1>();  // S_j has landed; P_(j-1) V_(j-1) may still run
  } else {
    feed.pass_turn();
    feed.mark(StepMark::issued, j);
    wgmma_wait<0>();
  }
  fence_registers(sc[0]);
  feed.mark(StepMark::s_landed, j);
  feed.release_k(j);
  if (last) feed.release_q();
  mode_scores_and_mask<false, kKeys>(sc, p.scale, key0, min_last, t, rows.last);
  float c[1][2];
  rows.template start_unit<true, kForm>(p, sc, KeyStep{key0, 0, 1, true, false}, c);
  rows.template exponentiate<kForm>(p, sc);
  feed.mark(StepMark::softmax_done, j);
  wgmma_wait<0>();
  fence_registers(rows.softmax.acc[0]);
  fence_registers(pa[0]);
  feed.mark(StepMark::pv_landed, j);
  if (j > 0) feed.release_v(j - 1);
  // Where no row of the warp moved its shift, every c is exactly 1 (exp(0)) and acc * 1 = acc:
  // skipping the D / 2 multiplies changes no bit. Long rows stop moving their maximum after a
  // few steps, so most steps skip it.
  if (__any_sync(0xffffffffu, c[0][0] != 1.0f || c[0][1] != 1.0f)) rows.softmax.rescale_acc(c);
  Rows::pack_operands(sc, reinterpret_cast<std::uint32_t(&)[1][kKeys / 16][4]>(pa));  // a half step: pa's first half
  feed.mark(StepMark::end, j);
  feed.end_step();
}

// Steps per iteration of the walk's loop: a feed whose buffers alternate between two (SelfFeed,
// kStepsPerIteration = 2) gets its step's parity as a compile-time constant, so its buffer and
// barrier addresses and the K/V descriptors derived from them stop being recomputed every step
// (17 instructions a step, most of them uniform-datapath, at D = 64).
template <class Feed>
__device__ constexpr int steps_per_iteration() {
  if constexpr (requires { Feed::kStepsPerIteration; }) {
    return Feed::kStepsPerIteration;
  } else {
    return 1;
  }
}

// max_last: the largest last visible key of the walking warpgroup's rows. Where it falls in the
// first half of the last step (BK = 128 only), that step is a half step (pipelined_step's kKeys).
template <int D, int BK, class Rows, class Feed>
__device__ __forceinline__ void forward_pipelined_walk(const ForwardParams& p, Rows& rows, const Feed& feed, int total,
                                                       int min_last, int max_last, int t, std::uint32_t s_q) {
  // Counting runs walk in numerics tiles (cta_keys), never here: telling the compiler lets it drop
  // the counters' code from the loop (2-3% of its instructions with a policy that can fall back).
  __builtin_assume(rows.events.records == nullptr);
  constexpr int U = steps_per_iteration<Feed>();
  static_assert(U == 1 || U == 2, "the parity trick below assumes U divides 2");
  feed.start();
  if (total == 0) feed.release_q();  // reads no Q (a walk with steps hands it back at its last S)
  std::uint32_t pa[1][BK / 16][4];  // BF16(P-bar) of the previous step
  // Half steps where BK = 128 (the warp-specialized kernels): 64-key products are the narrowest
  // the SW128 tiles take without another layout. Head dim 64 only: at 128 the added step code cost
  // its long and full shapes 1-2% where no half step runs (H100, docs/benchmarks.md).
  constexpr bool kHalfSteps = BK == 128 && D == 64;
  const int half_step = kHalfSteps && total > 0 && max_last < (total - 1) * BK + BK / 2 ? total - 1 : -1;
  const auto steps = [&](auto pow2_scale) {
    constexpr PbarForm kForm = decltype(pow2_scale)::value ? PbarForm::pow2_scale : PbarForm::log2_units;
    // j = U i + u: the compiler sees j % U = u from the known low bits of U i (an assumption about
    // j itself did not reach the backend, which merged the copies back into one).
    for (int i = 0; U * i < total; ++i) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int j = U * i + u;
        if (u > 0 && j == total) break;
        if constexpr (kHalfSteps) {
          if (j == half_step) {
            pipelined_step<D, BK, BK / 2, kForm>(p, rows, feed, j, true, min_last, t, s_q, pa);
            continue;
          }
        }
        pipelined_step<D, BK, BK, kForm>(p, rows, feed, j, j == total - 1, min_last, t, s_q, pa);
      }
    }
  };
  // One FMA less per score where the scale allows it (fused_pbar_pow2_scale: the same bits), else
  // scores in log2 units (one multiply less; PbarForm). The first is instantiated only where the
  // default scale 1/sqrt(D) is a power of two (D a power of 4: here D = 64); at D = 128 the copy
  // would be dead code and registers.
  constexpr bool kDefaultScalePow2 = D > 0 && (D & (D - 1)) == 0 && (D & 0x55555555) != 0;
  if (kDefaultScalePow2 && scale_is_exact_power_of_two(p.scale)) {
    steps(std::bool_constant<kDefaultScalePow2>{});
  } else {
    steps(std::false_type{});
  }
  if (total > 0) {
    const int j = total - 1;
    feed.wait_v(j);
    // The last P V over the step's keys (N: BK, or BK / 2 after a half step), issued and waited for
    // within one branch: a product in flight across the branches' join made ptxas inject fences (C7519).
    const auto last_pv = [&](auto keys) {
      constexpr int N = decltype(keys)::value;
      wgmma_fence();
      issue_pv<D, N, BK>(rows.softmax.acc[0], reinterpret_cast<const std::uint32_t(&)[N / 16][4]>(pa[0]), feed.v(j));
      wgmma_commit();
      wgmma_wait<0>();
    };
    if (kHalfSteps && j == half_step) {
      last_pv(std::integral_constant<int, BK / 2>{});
    } else {
      last_pv(std::integral_constant<int, BK>{});
    }
    fence_registers(rows.softmax.acc[0]);
    feed.release_v(j);  // a persistent feed reuses the stage for the next tile
  }
}

// The epilogue's first part: O (and the residual) of a warpgroup's rows staged in the SW128 layout at
// s_o (s_r), the one-warpgroup kernel's K buffers, which no product reads any more, or the
// warp-specialized consumer's own staging tiles (which its store warp then writes:
// forward_ws_kernel.cuh), and made visible to the copy engine (each thread's fence; the caller
// orders them before the thread that issues the bulk stores, issue_output_stores). A warp stages
// four 8-column blocks of one half of its rows per stmatrix (16 instructions a warp at D = 128 where
// 64 32-bit stores were), into 16-byte chunks that the swizzle spreads over all banks.
template <class Traits, class Rows>
__device__ __forceinline__ void stage_outputs(const ForwardParams& p, const Rows& rows, std::uint32_t s_o, std::uint32_t s_r) {
  constexpr int D = Traits::kHeadDim;
  using Tile = WgmmaTile<64, D>;
  static_assert(D % 32 == 0, "stmatrix x4: four 8-column blocks at a time");
  const bool residual = p.o_residual != nullptr;
  const int lane = threadIdx.x % 32;
  std::uint32_t o4[4], r4[4];  // the pairs of four consecutive 8-column blocks, one per matrix
  ForwardEpilogue<Rows>::template finalize_outputs<true>(rows, p, residual, [&](int, int lrow, int nd, std::uint32_t o2, std::uint32_t r2) {
    o4[nd % 4] = o2, r4[nd % 4] = r2;
    if (nd % 4 != 3) return;
    // Lane l addresses row l % 8 of matrix l / 8: the 8 rows of this half (lrow - lane / 4 is its
    // first), block nd - 3 + l / 8.
    const std::uint32_t off = Tile::offset(lrow - lane / 4 + lane % 8, nd - 3 + lane / 8);
    stmatrix_x4(s_o + off, o4);
    if (residual) stmatrix_x4(s_r + off, r4);
  });
  fence_proxy_async_smem();  // the copy engine reads what the threads wrote
}

// The bulk stores of 64 staged rows from m0 (rows past Tq are clipped by the copy engine), one
// commit group.
template <int D>
__device__ __forceinline__ void issue_output_stores(const ForwardParams& p, std::uint32_t s_o, std::uint32_t s_r, int m0, int h, int b) {
  using Tile = WgmmaTile<64, D>;
#pragma unroll
  for (int x = 0; x < D / 64; ++x) {
    tma_store_4d(&p.tma_o, s_o + x * Tile::kBlockBytes, 64 * x, m0, h, b);
    if (p.o_residual) tma_store_4d(&p.tma_o_residual, s_r + x * Tile::kBlockBytes, 64 * x, m0, h, b);
  }
  bulk_commit_group();
}

// The one-warpgroup kernel's epilogue: `leader` issues the copies after `sync` (the warpgroup's
// threads wait for each other) and waits until they have read the staging tiles (the CTA exits).
template <class Traits, class Rows, class Sync>
__device__ __forceinline__ void store_outputs_by_tma(const ForwardParams& p, const Rows& rows, int m0, int h, int b, int t,
                                                     std::uint32_t s_o, std::uint32_t s_r, bool leader, Sync&& sync) {
  stage_outputs<Traits>(p, rows, s_o, s_r);
  sync();  // every thread of the warpgroup has staged its part
  if (leader) {
    issue_output_stores<Traits::kHeadDim>(p, s_o, s_r, m0, h, b);
    bulk_wait_group_read<0>();  // shared memory must outlive the copies' reads
  }
  ForwardEpilogue<Rows>::store_row_stats(rows, p, b, h, t);
}

template <class Traits, class Policy>
__global__ void __launch_bounds__(Traits::kThreads, Traits::kMinBlocks) attention_forward_wgmma_kernel(const __grid_constant__ ForwardParams p) {
  constexpr int D = Traits::kHeadDim, BQ = Traits::kBlockQ, BK = Traits::kBlockK;
  constexpr int MR = Traits::kRowTiles, NT = Traits::kKeyTiles, DT = Traits::kDimTiles;
  constexpr bool kPaper = Traits::kPaper;
  constexpr bool kMultiPass = !kFastPathInstantiable<kPaper, Policy>;
  using Rows = ForwardRows<Traits, Policy>;
  static_assert(MR == 1 && BQ == 64 && Traits::kThreads == 128, "one warpgroup, 16 rows per warp");

  extern __shared__ __align__(1024) unsigned char smem[];
  auto& shared = *reinterpret_cast<typename Traits::SharedStorage*>(smem);
  const std::uint32_t s_q = smem_u32(shared.q), s_k0 = smem_u32(shared.k), s_v0 = smem_u32(shared.v);

  // Causal rows late in the sequence see the most keys: launch those blocks first so the last
  // wave is made of short ones.
  const int b = blockIdx.z, h = blockIdx.y, m0 = (p.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * BQ;
  const int kv_h = h / p.kv_group;  // grouped-query heads share K/V
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t = lane % 4;
  (void)NT, (void)DT;

  Rows rows(p, shared.events, shared.top[0], b, h, m0 + warp * 16 * MR + lane / 4, warp * 16 * MR + lane / 4);
  const CtaKeys keys = cta_keys<BQ, BK, kMultiPass>(p, m0);
  const KeyWalk& walk = keys.walk;
  const int n_keys = keys.n_keys, min_last = keys.min_last;

  const auto finish = [&](const Rows& done) {
    if (p.store_by_tma) {
      store_outputs_by_tma<Traits>(p, done, m0, h, b, t, s_k0, s_k0 + Traits::kSmemKV, threadIdx.x == 0, [] { __syncthreads(); });
    } else {
      ForwardEpilogue<Rows>::store(done, p, b, h, t);
    }
  };

  // Bulk tensor copies issued by thread 0, one 64 x 64 box per 64 columns of a tile; every thread
  // waits on the buffer's barrier. Barrier 0: Q; 1 + (s & 1): step s's K (and V in the serial
  // walk); 3 + (s & 1): step s's V in the pipelined walk.
  const std::uint32_t bars = smem_u32(shared.barriers);
  constexpr int kBoxBytes = 64 * 64 * 2, kBoxes = D / 64;
  // K, and V on main steps
  auto issue_loads = [&](int s, const KeyStep& st) {
    const std::uint32_t bar = bars + 8 * (1 + (s & 1));
    mbar_arrive_expect_tx(bar, (st.main ? 2 : 1) * kBoxes * kBoxBytes);
#pragma unroll
    for (int x = 0; x < kBoxes; ++x) {
      tma_load_4d(s_k0 + (s & 1) * Traits::kSmemKV + x * kBoxBytes, &p.tma_k, 64 * x, st.key0, kv_h, b, bar);
      if (st.main) tma_load_4d(s_v0 + (s & 1) * Traits::kSmemKV + x * kBoxBytes, &p.tma_v, 64 * x, st.key0, kv_h, b, bar);
    }
  };
  if (threadIdx.x == 0) {
#pragma unroll
    for (int i = 0; i < Traits::kBarriers; ++i) mbar_init(bars + 8 * i, 1);
    mbar_fence_init();
  }
  __syncthreads();
  // a programmatic dependent of the kernel before it (launch_with): global memory only past here
  grid_dependency_wait();
  allow_dependent_launch();
  // The fused fast path (the plan's ForwardWalk::pipelined: one shift per step, no counters)
  // overlaps each step's softmax with the previous step's P-bar * V on the tensor cores.
  if constexpr (!kMultiPass) {
    if (p.walk == static_cast<int>(ForwardWalk::pipelined)) {
      constexpr int BKF = Traits::kFastBlockK;
      const int steps = (n_keys + BKF - 1) / BKF;
      const SelfFeed<D, BKF, Traits::kSmemKV> feed{p, m0, h, kv_h, b, steps, s_q, s_k0, s_v0, bars};
      forward_pipelined_walk<D, BKF>(p, rows, feed, steps, min_last, n_keys - 1, t, s_q);
      finish(rows);
      return;
    }
  }
  const int total = walk.total_steps();  // after the fast path, which needs none of its divisions
  if (threadIdx.x == 0) {
    mbar_arrive_expect_tx(bars, kBoxes * kBoxBytes);
#pragma unroll
    for (int x = 0; x < kBoxes; ++x) tma_load_4d(s_q + x * kBoxBytes, &p.tma_q, 64 * x, m0, h, b, bars);
    if (total > 0) issue_loads(0, KeyCursor(walk).step);
  }
  mbar_wait(bars, 0);

  KeyCursor cursor(walk), ahead(walk);  // steps s and s + 1
  ahead.advance();
  for (int s = 0; s < total; ++s, cursor.advance(), ahead.advance()) {
    const KeyStep st = cursor.step;
    if (threadIdx.x == 0 && s + 1 < total) issue_loads(s + 1, ahead.step);  // its buffer was released at the end of step s - 1
    mbar_wait(bars + 8 * (1 + (s & 1)), (s >> 1) & 1);
    const std::uint32_t s_k = s_k0 + (s & 1) * Traits::kSmemKV, s_v = s_v0 + (s & 1) * Traits::kSmemKV;

    float sc[MR][NT][4];
    wgmma_fence();
    issue_scores<D, BK>(sc[0], s_q, s_k);
    wgmma_commit();
    wgmma_wait_all();
    fence_registers(sc[0]);
    // ---- Scores at the mode's rounding point, and the mask. paper keeps them as BF16 pairs (sp),
    // maximized and shifted two at a time.
    std::uint32_t sp[NT][2];
    if constexpr (kPaper) {
      paper_score_pairs<BK>(sc, p.scale, st.key0, min_last, t, rows.last, sp);
    } else {
      mode_scores_and_mask<kPaper, BK>(sc, p.scale, st.key0, min_last, t, rows.last);
    }
    // FP32 scores where paper still needs them: a unit without pre-pass picks its shift from
    // them, the counters count them
    if constexpr (kPaper) {
      if (rows.events.counting() || (st.main && st.sub == 0 && !st.prepass)) unpack_score_pairs(sp, sc);
    }

    if (!st.main) {
      if constexpr (kPaper) {
        rows.top2.fold_pairs(sp);
      } else {
        rows.top2.fold(sc);
      }
    } else {
      if (st.sub == 0) rows.start_unit(p, sc, st);
      if (rows.events.counting()) rows.events.count_repeated_max(sc);
      if constexpr (kPaper) {
        rows.exponentiate_pairs(p, sp, sc);
      } else {
        rows.exponentiate(p, sc);
      }
      std::uint32_t pa[MR][NT / 2][4];  // BF16(P-bar) as A fragments, 16 keys each
      Rows::pack_operands(sc, pa);

      wgmma_fence();
      issue_pv<D, BK>(rows.softmax.acc[0], pa[0], s_v);
      wgmma_commit();
      wgmma_wait_all();
      fence_registers(rows.softmax.acc[0]);
      if (st.sub == st.n_sub - 1) rows.end_unit(p);
    }
    __syncthreads();  // this step's K/V buffers are refilled by the copies issued next iteration
  }
  finish(rows);
}

}  // namespace stableflash::attention::cuda
