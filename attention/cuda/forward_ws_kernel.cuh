// The warp-specialized fused forward for sm_90a (FlashAttention-3's CTA layout): one producer
// warpgroup whose single thread issues every bulk tensor copy, and kConsumers consumer warpgroups
// of 64 query rows each that share every K/V tile (WsForwardTraits). Against the one-warpgroup
// kernel (forward_wgmma_kernel.cuh) each K/V tile crosses L2 -> SM once per 64 kConsumers query
// rows instead of once per 64, the copies run ahead of the consumers without a CTA-wide barrier
// per step, and the producer gives its registers to the consumers (setmaxnreg), so 128-key steps
// fit at D = 128.
//
// Runs the `fused` fast path (one shift per 128-key step, no event counters, a policy that needs
// no tile-wide tie count) where the plan picks it (takes_warp_specialized_forward, plan.cpp): past
// 128 keys, with two consumers at D = 128 and three (192 rows) at D = 64, there causal only from
// 384 visible keys a row on average; at D = 128 also up to 128 keys where its tiles make two
// rounds of the grid; one consumer (64-row tiles) where the grid is too small to fill the SMs.
// Everything else takes the one-warpgroup kernel. The consumers' walk is
// forward_pipelined_walk, the same code the one-warpgroup kernel runs, fed by ProducerFeed, which
// also makes the consumers take turns issuing their products.
//
// Persistent (the plan's TileSchedule): one CTA per SM walks tile after tile (WsTileOrder), so a
// consumer's next Q and the next tile's K/V land while it stores the last tile's outputs, and the
// barrier set-up and register hand-over happen once per SM, not per tile. The next tile comes
// from a global counter (dynamic: a CTA that drew short causal tiles takes more) or is fixed in
// advance (rounds). A grid with a CTA per tile runs the same code for one round (the kernel lab's
// comparison).
//
// A tile's outputs: each consumer stages O (and the residual) in tiles of its own and hands them to
// the store warp (producer warp 1), which issues the bulk stores; the consumer stores lse and walks on.
//
// Shared memory (WsForwardTraits::SharedStorage): Q of each consumer [64, D], the K and V stages,
// O and residual staging tiles per consumer, the barriers, the tile records.
#pragma once

#include <cstdint>
#include <type_traits>

#include "forward_rows.cuh"
#include "forward_wgmma_kernel.cuh"
#include "kernel_params.cuh"
#include "tail_pieces.hpp"
#include "tma.cuh"
#include "warpgroup_registers.cuh"
#include "wgmma.cuh"

namespace stableflash::attention::cuda {

// Barrier slots (8 bytes each) after the tiles: per consumer Q full (the producer's copy landed)
// and Q empty (every consumer thread is done with it); per stage K full, V full and K empty,
// V empty (every consumer thread is done with the tile); per consumer `staged` (every consumer
// thread has staged its outputs, or has none this round) and `stage_free` (the store warp's copies
// have read them). kStages: the K/V slots of every ring (WsForwardTraits::kRingSlots).
template <int kConsumers, int kStages_ = kWsForwardStages>
struct WsBarriers {
  static constexpr int kStages = kStages_;
  std::uint32_t base;
  __device__ std::uint32_t q(int consumer) const { return base + 8 * consumer; }
  __device__ std::uint32_t q_empty(int consumer) const { return base + 8 * (kConsumers + consumer); }
  __device__ std::uint32_t k_full(int s) const { return base + 8 * (2 * kConsumers + s); }
  __device__ std::uint32_t v_full(int s) const { return base + 8 * (2 * kConsumers + kStages + s); }
  __device__ std::uint32_t k_empty(int s) const { return base + 8 * (2 * kConsumers + 2 * kStages + s); }
  __device__ std::uint32_t v_empty(int s) const { return base + 8 * (2 * kConsumers + 3 * kStages + s); }
  __device__ std::uint32_t staged(int consumer) const { return base + 8 * (2 * kConsumers + 4 * kStages + consumer); }
  __device__ std::uint32_t stage_free(int consumer) const { return base + 8 * (3 * kConsumers + 4 * kStages + consumer); }
};

// A place in the K/V ring, which runs on across a CTA's tiles: position n is in stage n % kStages,
// its use (n / kStages) of that stage completes phase use & 1 of the stage's full barrier and
// waits for phase (use - 1) & 1 of its empty one. Positions are never negative; unsigned, stage
// and use are a mask and a shift where int's % and / also round towards zero for negative values
// (3 more instructions each). The producer and the consumers both count in it.
struct KvRingPlace {
  static constexpr unsigned kStages = kWsForwardStages;
  unsigned position;
  __device__ unsigned stage() const { return position % kStages; }
  __device__ unsigned use() const { return position / kStages; }
};

// The kernel lab's timeline (lab/forward_timeline.cu): traits that have it stamp the SM's clock at
// the phases of every consumer step (StepMark, by ring position), of the producer's copies
// (ProducerMark, by ring position) and of each consumer's tiles (TileMark, by round). Production
// traits have no timeline, and the calls below compile to nothing.
enum class ProducerMark : int { tile_drawn, k_free, k_issued, v_free, v_issued, count };
enum class TileMark : int { q_ready, walk_done, store_free, staged, synced /* handed to the store warp */, stored, count };
template <class Traits>
concept HasTimeline = requires { Traits::mark_step(0, 0u); };
template <class Traits>
__device__ __forceinline__ void mark_producer(ProducerMark e, unsigned position) {
  if constexpr (HasTimeline<Traits>) Traits::mark_producer(int(e), position);
}
template <class Traits>
__device__ __forceinline__ void mark_tile(TileMark e, int round) {
  if constexpr (HasTimeline<Traits>) Traits::mark_tile(int(e), round);
}

struct NoRingSlot {};

// The consumers' side of the K/V ring: step j of the current tile is ring position first + j.
template <class Traits>
struct ProducerFeed {
  std::uint32_t s_k0, s_v0;
  WsBarriers<Traits::kConsumers, Traits::kRingSlots> bars;
  int consumer = 0;  // whose Q this feed hands back (release_q)
  int first = 0;     // ring positions taken by the CTA's earlier tiles
  // kLonePairs: the ring's first K/V slot (consumer 1 of a paired tile: the second ring's); nothing
  // in the other builds, whose code stays as it was without the pairs
  [[no_unique_address]] std::conditional_t<Traits::kLonePairs, unsigned, NoRingSlot> ring_slot0{};
  // Turns (FlashAttention-3's warpgroup scheduler barriers): a consumer issues a step's products
  // only after the consumer before it issued its own, then hands the turn on, so one consumer's
  // softmax runs while the next one's products keep the tensor cores busy instead of every
  // consumer issuing at once and then all computing their softmax at once. Named barriers
  // turn_bar (this consumer's) and next_turn_bar, 256 threads each: this consumer and the one
  // handing on (set for the consumers; the producer takes no turns).
  int turn_bar = 0, next_turn_bar = 0;

  __device__ KvRingPlace place(int j) const { return {unsigned(first + j)}; }
  __device__ unsigned stage(int j) const {
    if constexpr (Traits::kLonePairs) return ring_slot0 + place(j).stage();
    return place(j).stage();
  }
  __device__ unsigned phase(int j) const { return place(j).use() & 1; }
  __device__ std::uint32_t k(int j) const { return s_k0 + stage(j) * Traits::kSmemKV; }
  __device__ std::uint32_t v(int j) const { return s_v0 + stage(j) * Traits::kSmemKV; }
  __device__ void start() const {}
  __device__ void begin_step(int) const {}
  __device__ void wait_k(int j) const { mbar_wait(bars.k_full(stage(j)), phase(j)); }
  __device__ void wait_v(int j) const { mbar_wait(bars.v_full(stage(j)), phase(j)); }
  __device__ void release_k(int j) const { mbar_arrive(bars.k_empty(stage(j))); }
  __device__ void release_v(int j) const { mbar_arrive(bars.v_empty(stage(j))); }
  // The walk's last S has landed: the producer may load this consumer's next Q while the walk's
  // last softmax, P V product and the epilogue run.
  __device__ void release_q() const { mbar_arrive(bars.q_empty(consumer)); }
  // (one consumer: nobody to take turns with)
  __device__ void take_turn() const {
    if constexpr (Traits::kConsumers > 1) named_barrier_sync(turn_bar, 256);
  }
  __device__ void pass_turn() const {
    if constexpr (Traits::kConsumers > 1) named_barrier_arrive(next_turn_bar, 256);
  }
  __device__ void end_step() const {}
  __device__ void mark(StepMark e, int j) const {
    if constexpr (HasTimeline<Traits>) Traits::mark_step(int(e), place(j).position);
  }
};

// Schedule entry t, a tail item (tail_pieces.hpp). Not inlined: inlined into the producer, its
// divisions took registers that the producer's loop then spilled (48 bytes at D = 64 against 40),
// and the unsplit shapes' tiles ran 0.7-0.8% longer.
template <int kConsumers>
__device__ __noinline__ WsTailPieces::Item tail_item(const ForwardParams& p, int batch_heads, int t) {
  const WsTailPieces split = WsTailPieces::of(p.q_len, batch_heads, kConsumers, p.tail_tiles, p.tail_group);
  return split.at(t - split.first_tile);
}

// The tiles (batch, head, block of kRows query rows) and which CTA takes which: in round r a CTA
// takes tile r * gridDim.x + its place in the grid, counted from the other end in odd rounds.
// Full-attention tiles go head by head: a head's blocks read the same K/V while it is in L2.
// Causal tiles go in sections of heads whose K/V fit in kL2Budget (FlashAttention-3's
// longest-first order): within a section the heaviest blocks (late rows, which see the most keys)
// first, each block of all the section's heads in a row, so the CTAs running at once share the
// K/V of a few heads through L2 (heaviest-first over all heads was 15% slower at 8 x 16 heads of
// 4,096 keys, D = 128). With fixed rounds, their back-and-forth gives every CTA a share of long
// and short tiles; the dynamic schedule balances by itself.
// Full attention's last p.tail_tiles tiles (a last round that would leave most SMs idle; the plan's
// ws_tail_for) come as items of p.tail_group 64-row blocks of one head (tail_pieces.hpp). A row walks
// the same steps in an item as in a tile, so the bits do not change.
// kLonePairs (p.lone_pairs, ForwardPlan::ws_lone_pairs: full attention where each head ends in one
// 64-row block, GPT-2's 1,024 rows = 5 x 192 + 64): heads two by two, the whole tiles of heads 2g and
// 2g + 1 and then their lone blocks in one tile (an odd last head's alone).
template <int kRows, int kHeadDim, bool kLonePairs = false>
struct WsTileOrder {
  // Of the H100's and H200's 50 MB; measured with the dynamic schedule over 10 causal shapes, 8 MB
  // beat 1 and 32 MB at 8 of them (by up to 5%; docs/benchmarks.md).
  static constexpr long long kL2Budget = 8ll << 20;
  // Every head in one section (heaviest blocks first over all heads) when all their K/V fit in L2 at
  // once: sections each ordered heaviest first leave the last section's heaviest tiles to the end
  // of the schedule, which costs most where a CTA takes only a few tiles (1 x 8 heads of 4,097 keys).
  static constexpr long long kL2Whole = 32ll << 20;
  int blocks, batch_heads, heads, tiles, section;  // tiles: the schedule's length, items counted
  bool causal;
  // Causal tiles end within 64 rows of the sequence's last row, so the first tile starts
  // causal_lead rows (whole consumers' 64) before row 0: the partial tile, where some consumers have
  // no rows, is then the lightest (one step at 1,024 rows and D = 64: 27 CTA steps a head against
  // 32 with the partial tile last, where it is the heaviest). Consumers before row 0 load and store
  // nothing (a bulk copy's coordinates stay >= 0).
  int causal_lead;

  __device__ explicit WsTileOrder(const ForwardParams& p)
      : blocks((p.q_len + kRows - 1) / kRows), batch_heads(p.batch * p.heads), heads(p.heads),
        causal(p.causal != 0),
        causal_lead((blocks * kRows - p.q_len) / 64 * 64) {
    // K and V, BF16, of one query head (grouped-query heads share theirs)
    const long long kv_bytes = (4ll * kHeadDim * max(p.k_len, 1) + p.kv_group - 1) / p.kv_group;
    // assigned here, not in the initializer list: from there ptxas chose other instructions throughout
    // the kernels (the same SASS from here, which the device measured)
    tiles = ws_schedule_length(p, kRows / 64);
    const long long budget = kv_bytes * batch_heads <= kL2Whole ? kL2Whole : kL2Budget;
    section = causal ? int(max(1ll, min(budget / kv_bytes, (long long)batch_heads))) : 1;
  }

  __device__ int tile(int round) const {
    const int g = gridDim.x, place = round & 1 ? g - 1 - blockIdx.x : blockIdx.x;
    return round * g + place;  // >= tiles: this CTA is done (only the last round is partial)
  }
  struct Tile {
    int m0, h, b;
    int item_blocks;  // an item's 64-row blocks from m0 (its consumers 0 ..); 0: a whole tile
    int pair_bh = -1;  // kLonePairs: the second head (batch x heads index) of a paired tile, its block at m0 too
  };
  __device__ Tile at(const ForwardParams& p, int t) const {
    if constexpr (kLonePairs) {
      // the pair right after its heads' whole tiles, while their K/V is still in L2 (every pair at the
      // schedule's end read 46 MB more from memory at GPT-2 and ran slower at the real clock)
      const int whole = blocks - 1, group = 2 * whole + 1, g = t / group, r = t % group;
      if (r < min(2, batch_heads - 2 * g) * whole) {
        const int bh = 2 * g + r / whole;
        return {r % whole * kRows, bh % heads, bh / heads, 0};
      }
      const int bh = 2 * g;
      return {whole * kRows, bh % heads, bh / heads, 1, bh + 1 < batch_heads ? bh + 1 : -1};
    }
    if (!causal) {
      if (p.tail_group > 0 && t >= blocks * batch_heads - p.tail_tiles) {
        const WsTailPieces::Item item = tail_item<kRows / 64>(p, batch_heads, t);
        return {item.m0, item.bh % heads, item.bh / heads, item.blocks};
      }
      const int bh = t / blocks;
      return {(t % blocks) * kRows, bh % heads, bh / heads, 0};
    }
    const int first_head = t / (section * blocks) * section, r = t % (section * blocks);
    const int width = min(section, batch_heads - first_head);  // the last section may be narrower
    const int bh = first_head + r % width;
    return {(blocks - 1 - r / width) * kRows - causal_lead, bh % heads, bh / heads, 0};
  }
};

// K/V steps of kRows query rows from m0 on: those of the last row among them (none past q_len). The
// producer loads a tile's steps (kRows = kCtaRows); a consumer computes its own rows' (kRows = 64)
// and hands the rest back unread: on the causal diagonal an earlier consumer's rows see up to 64
// (kConsumers - 1) keys fewer, and a tile past the sequence's end or before its start (a causal
// sequence's first tile, WsTileOrder) has consumers without rows.
template <int kRows, class Traits>
__device__ __forceinline__ int steps_of_rows(const ForwardParams& p, int m0) {
  if (m0 >= p.q_len || m0 + kRows <= 0) return 0;
  return (cta_keys<kRows, Traits::kBlockK, false>(p, m0).n_keys + Traits::kBlockK - 1) / Traits::kBlockK;
}

// The producer: per round the tile (fixed, or the next from the dynamic schedule's counter),
// decoded, into shared memory, once every consumer is done with its previous Q and so has read the
// last one; then Q of every consumer, K_j and V_j for every step, each into its stage as soon as the
// consumers have handed the stage's previous tile back. K_j goes before V_j: the consumers need
// K_(j+1) before V_j (S_(j+1) is issued ahead of P_j V_j). Past the last tile the Q barriers
// complete without a copy: the consumers read the end and leave.
template <class Traits>
__device__ __forceinline__ void produce_tiles(const ForwardParams& p,
                                              const WsTileOrder<Traits::kCtaRows, Traits::kHeadDim, Traits::kLonePairs>& order,
                                              const ProducerFeed<Traits>& feed, std::uint32_t s_q, volatile WsTile* handed,
                                              volatile int* rows_of, volatile WsConsumerTile* tiles_of) {
  constexpr int D = Traits::kHeadDim, BK = Traits::kBlockK, C = Traits::kConsumers;
  KvRingPlace ring{0};
  KvRingPlace ring_b{0};  // kLonePairs: the second ring, consumer 1's in paired tiles
  // Step j's K and V into the ring place's slot (slot0: the ring's first), each once the consumers
  // have handed that slot's previous tile back. The timeline (no pairs build has one) marks the first
  // ring's.
  const auto load_step = [&](KvRingPlace place, unsigned slot0, int j, int kv_head, int batch) {
    const unsigned s = slot0 + place.stage(), use = place.use();
    const bool marked = slot0 == 0;
    if (use > 0) mbar_wait(feed.bars.k_empty(s), (use - 1) & 1);
    if (marked) mark_producer<Traits>(ProducerMark::k_free, place.position);
    load_tile<D, BK>(&p.tma_k, feed.s_k0 + s * Traits::kSmemKV, j * BK, kv_head, batch, feed.bars.k_full(s));
    if (marked) mark_producer<Traits>(ProducerMark::k_issued, place.position);
    if (use > 0) mbar_wait(feed.bars.v_empty(s), (use - 1) & 1);
    if (marked) mark_producer<Traits>(ProducerMark::v_free, place.position);
    load_tile<D, BK>(&p.tma_v, feed.s_v0 + s * Traits::kSmemKV, j * BK, kv_head, batch, feed.bars.v_full(s));
    if (marked) mark_producer<Traits>(ProducerMark::v_issued, place.position);
  };
  int tile = order.tile(0);  // round 0 is the same in both schedules: CTA i takes tile i
  for (int round = 0;; ++round) {
    if (round > 0) {
#pragma unroll
      for (int c = 0; c < C; ++c) mbar_wait(feed.bars.q_empty(c), (round - 1) & 1);
    }
    // Written before the barriers' arrivals (release), read after their waits (acquire).
    if (tile >= order.tiles) {
      handed->steps = WsTile::kEnd;
#pragma unroll
      for (int c = 0; c < C; ++c) mbar_arrive(feed.bars.q(c));
      break;
    }
    mark_producer<Traits>(ProducerMark::tile_drawn, ring.position);
    const auto [m0, h, b, item_blocks, pair_bh] = order.at(p, tile);
    const int total = steps_of_rows<Traits::kCtaRows, Traits>(p, m0);  // an item's too (full attention: every row's)
    // (the consumers read their rows from rows_of, and in the pairs build their head from tiles_of)
    handed->steps = total;
    if constexpr (!Traits::kLonePairs) handed->h = h, handed->b = b;
    const int kv_h = h / p.kv_group;  // grouped-query heads share K/V
    // kLonePairs: a paired tile's second head, whose block at m0 consumer 1 computes on the second ring
    const bool paired = Traits::kLonePairs && pair_bh >= 0;
    const int h_pair = paired ? pair_bh % p.heads : h, b_pair = paired ? pair_bh / p.heads : b;
#pragma unroll
    for (int c = 0; c < C; ++c) {
      // an item's blocks go to its first consumers, one each (a paired tile's second head: consumer 1)
      const bool second = paired && c == 1;
      const int hc = second ? h_pair : h, bc = second ? b_pair : b;
      const int m0c = second ? m0 : item_blocks == 0 || c < item_blocks ? m0 + 64 * c : WsTile::kNoRows;
      rows_of[c] = m0c;
      if constexpr (Traits::kLonePairs) {
        tiles_of[c].h = hc, tiles_of[c].b = bc;
        tiles_of[c].ring_slot0 = second ? kWsForwardStages : 0;
        tiles_of[c].arrivals = paired && c == C - 1 ? 2 : 1;  // it hands back consumer 1's share of the first ring
      }
      if (m0c >= 0) {
        load_tile<D, 64>(&p.tma_q, s_q + c * Traits::kSmemQ, m0c, hc, bc, feed.bars.q(c));
      } else {
        mbar_arrive(feed.bars.q(c));  // a consumer before row 0: no rows, no copy
      }
    }
    for (int j = 0; j < total; ++j, ++ring.position) {
      load_step(ring, 0, j, kv_h, b);
      if (paired) {  // the second head's step j, into the second ring (slots kWsForwardStages ..)
        load_step(ring_b, kWsForwardStages, j, h_pair / p.kv_group, b_pair);
        ++ring_b.position;
      }
    }
    // The next round's tile, drawn once this tile's last copies are issued (the consumers are then
    // a pipeline's depth from its end): the atomic's round trip runs behind their last steps, and
    // the CTAs still draw in about the order they finish. Drawn at the tile's start (FlashAttention-3's
    // prefetch) the first CTAs to draw were not the first to finish: 3-23% slower on causal shapes.
    tile = p.tile_counters ? int(gridDim.x) + atomicAdd(p.tile_counters, 1) : order.tile(round + 1);
  }
  // The launch's last CTA to finish taking tiles zeroes the counters for a later launch (every CTA
  // took its last tile before counting itself done).
  if (p.tile_counters) {
    __threadfence();
    if (atomicAdd(p.tile_counters + 1, 1) == int(gridDim.x) - 1) atomicExch(p.tile_counters, 0), atomicExch(p.tile_counters + 1, 0);
  }
}

// The store warp (producer warp 1, one thread; store_by_tma): per round, each consumer's staged
// outputs (`staged`: all its threads arrived, the tile in shared.staged) go out by bulk stores, and
// once the copies have read them every consumer gets its staging tiles back (`stage_free`, every
// round, so a consumer is never more than a round ahead). The consumers' warps neither wait for
// each other nor for a thread issuing the copies at a tile's end: issuing them took warp 0 of each
// consumer ~1,300 cycles a tile in the kernel lab's timeline (docs/benchmarks.md), and the next
// step's turn waited for that warp. Not inlined: inlined, ptxas spilled the producer's registers
// (40 a thread after setmaxnreg) in its tile decoding; called, it keeps bars in local memory (one
// load a round).
template <class Traits>
__device__ __noinline__ void store_tiles(const ForwardParams& p, const WsBarriers<Traits::kConsumers, Traits::kRingSlots>& bars, const volatile WsTile* staged,
                                            std::uint32_t s_o, std::uint32_t s_res) {
  constexpr int C = Traits::kConsumers;
  for (int round = 0;; ++round) {
    bool end = true;
#pragma unroll
    for (int c = 0; c < C; ++c) {
      mbar_wait(bars.staged(c), round & 1);
      const int steps = staged[c].steps;
      end = end && steps == WsTile::kEnd;
      if (steps > 0) issue_output_stores<Traits::kHeadDim>(p, s_o + c * Traits::kSmemQ, s_res + c * Traits::kSmemQ, staged[c].m0, staged[c].h, staged[c].b);
    }
    if (end) break;  // every consumer past the last tile (they all see the same end)
    bulk_wait_group_read<0>();
#pragma unroll
    for (int c = 0; c < C; ++c) mbar_arrive(bars.stage_free(c));
  }
}

template <class Traits, class Policy>
__global__ void __launch_bounds__(Traits::kThreads, 1) attention_forward_ws_kernel(const __grid_constant__ ForwardParams p) {
  static_assert(kFastPathInstantiable<Traits::kPaper, Policy>, "the fast path only");
  constexpr int D = Traits::kHeadDim, BK = Traits::kBlockK;
  using Rows = ForwardRows<Traits, Policy>;

  extern __shared__ __align__(1024) unsigned char smem[];
  auto& shared = *reinterpret_cast<typename Traits::SharedStorage*>(smem);
  constexpr int C = Traits::kConsumers;
  const std::uint32_t s_q = smem_u32(shared.q), s_o = smem_u32(shared.o), s_res = smem_u32(shared.residual);
  const ProducerFeed<Traits> feed{smem_u32(shared.k), smem_u32(shared.v), WsBarriers<C, Traits::kRingSlots>{smem_u32(shared.barriers)}};

  if (threadIdx.x == 0) {
    for (int i = 0; i < C; ++i) mbar_init(feed.bars.q(i), 1), mbar_init(feed.bars.q_empty(i), 128);  // every consumer thread
    for (int i = 0; i < C; ++i) mbar_init(feed.bars.staged(i), 128), mbar_init(feed.bars.stage_free(i), 1);  // the store warp
    for (int s = 0; s < Traits::kRingSlots; ++s) {
      // the first ring: every consumer thread; the second (kLonePairs): consumer 1's
      const int readers = s < kWsForwardStages ? 128 * C : 128;
      mbar_init(feed.bars.k_full(s), 1), mbar_init(feed.bars.v_full(s), 1);
      mbar_init(feed.bars.k_empty(s), readers), mbar_init(feed.bars.v_empty(s), readers);
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
    if (threadIdx.x == 0) {
      produce_tiles<Traits>(p, WsTileOrder<Traits::kCtaRows, D, Traits::kLonePairs>(p), feed, s_q, &shared.tile, shared.consumer_rows,
                            shared.consumer_tiles);
    } else if (threadIdx.x == 32 && p.store_by_tma) {  // else: nothing of it stays live across the producer's loop
      store_tiles<Traits>(p, feed.bars, shared.staged, smem_u32(shared.o), smem_u32(shared.residual));
    }
    return;
  }
  claim_registers<Traits::kConsumerRegisters>();

  const int c = wg - 1;  // this consumer's 64 rows of every tile: m0 + 64 c ...
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32, t = lane % 4;
  const std::uint32_t s_qc = s_q + c * Traits::kSmemQ, s_oc = s_o + c * Traits::kSmemQ, s_rc = s_res + c * Traits::kSmemQ;
  ProducerFeed<Traits> tile_feed = feed;
  tile_feed.consumer = c;
  // named barriers 1 + C + c: consumer c's turn
  tile_feed.turn_bar = 1 + C + c, tile_feed.next_turn_bar = 1 + C + (c + 1) % C;
  if (C > 1 && c == 0) named_barrier_arrive(tile_feed.turn_bar, 256);  // the first turn is consumer 0's
  // store_by_tma: this consumer's outputs of the round to the store warp (kEnd: past the last tile;
  // 0: no rows). Its staging tiles are free again once the store warp has had the last round's read.
  volatile WsTile& to_store = shared.staged[c];
  const auto hand_to_store = [&](int round, int m0c_, int h_, int b_, int what) {
    if (tid == 0) to_store.m0 = m0c_, to_store.h = h_, to_store.b = b_, to_store.steps = what;
    mbar_arrive(feed.bars.staged(c));  // release: the staged tiles (fenced) and the record
    mark_tile<Traits>(TileMark::synced, round);
  };
  // kLonePairs: the positions taken in the ring this consumer is not walking (the second ring's; the
  // first's while consumer 1 walks a paired tile on the second), and the switch between the two
  int other_ring_first = 0;
  const auto switch_ring = [&](auto slot0) {  // generic: instantiated in kLonePairs builds only
    const int first = tile_feed.first;
    tile_feed.first = other_ring_first, other_ring_first = first, tile_feed.ring_slot0 = slot0;
  };
  for (int round = 0;; ++round) {
    mbar_wait(feed.bars.q(c), round & 1);
    mark_tile<Traits>(TileMark::q_ready, round);
    const volatile WsTile& handed = shared.tile;
    const int total = handed.steps;
    if (total == WsTile::kEnd) {
      if (p.store_by_tma) {
        if (round > 0) mbar_wait(feed.bars.stage_free(c), (round - 1) & 1);
        hand_to_store(round, 0, 0, 0, WsTile::kEnd);
      }
      break;
    }
    // the consumer's first row, as the producer loaded its Q (m0 + 64 c; WsTile::kNoRows past a
    // tail item's blocks): read, not computed, so that the items cost the walk no register
    // (kLonePairs: this consumer's own head, ring and hand-back arrivals, as produce_tiles wrote them)
    const volatile WsConsumerTile& mine = shared.consumer_tiles[Traits::kLonePairs ? c : 0];
    const int h = Traits::kLonePairs ? mine.h : handed.h, b = Traits::kLonePairs ? mine.b : handed.b;
    const int m0c = static_cast<const volatile int*>(shared.consumer_rows)[c];
    const bool covers_consumer_1 = Traits::kLonePairs && mine.arrivals == 2;
    if constexpr (Traits::kLonePairs) {
      if (mine.ring_slot0 != 0) switch_ring(unsigned(mine.ring_slot0));  // a paired tile's second head
    }
    const int own = steps_of_rows<64, Traits>(p, m0c);
    Rows rows(p, nullptr, nullptr, b, h, m0c + warp * 16 + lane / 4, warp * 16 + lane / 4);
    // the keys of the consumer's first and last row (past Tq: of row Tq - 1)
    const int min_last = last_key(m0c, p.q_len, p.k_len, p.causal != 0);
    const int max_last = last_key(min(m0c + 63, p.q_len - 1), p.q_len, p.k_len, p.causal != 0);
    forward_pipelined_walk<D, BK>(p, rows, tile_feed, own, min_last, max_last, t, s_qc);
    // The tile's steps past this consumer's rows, handed back once landed (an arrival before the
    // copy landed could count towards the stage's previous use and free it early).
    // Their turns are taken and passed on too: the turns go round the consumers once per step.
    // (kLonePairs: consumer 1 of a paired tile walked every step on the second ring and hands back
    // nothing; the consumer without rows arrives twice on the first ring, for itself and for it.)
    if constexpr (Traits::kLonePairs) {
      if (tile_feed.ring_slot0 != 0) {  // back to the first ring, which this tile advanced by `total` too
        tile_feed.first += total;
        switch_ring(0);
      }
    }
    for (int j = own; j < total; ++j) {
      tile_feed.wait_k(j);
      tile_feed.take_turn();
      tile_feed.pass_turn();
      tile_feed.release_k(j);
      if (covers_consumer_1) tile_feed.release_k(j);
      tile_feed.wait_v(j);
      tile_feed.release_v(j);
      if (covers_consumer_1) tile_feed.release_v(j);
    }
    tile_feed.first += total;
    mark_tile<Traits>(TileMark::walk_done, round);

    if (p.store_by_tma) {
      if (round > 0) mbar_wait(feed.bars.stage_free(c), (round - 1) & 1);  // the last round's copies read (long since)
      mark_tile<Traits>(TileMark::store_free, round);
      if (m0c >= 0) stage_outputs<Traits>(p, rows, s_oc, s_rc);
      mark_tile<Traits>(TileMark::staged, round);
      hand_to_store(round, m0c, h, b, m0c >= 0 ? 1 : 0);  // a consumer before row 0 (WsTileOrder::causal_lead): nothing
      if (m0c >= 0) ForwardEpilogue<Rows>::store_row_stats(rows, p, b, h, t);
    } else if (m0c >= 0) {
      ForwardEpilogue<Rows>::store(rows, p, b, h, t);
    }
    mark_tile<Traits>(TileMark::stored, round);
  }
}

}  // namespace stableflash::attention::cuda
