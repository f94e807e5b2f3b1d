// The CUDA launch plan (attention/cuda/plan.hpp) on the CPU: which kernel, walk and template flags
// a call gets. These are the choices the GPU path makes; entry.cu executes them unchanged.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "plan.hpp"
#include "tail_pieces.hpp"
#include "walk_order.hpp"
#include "stableflash/attention/attention.hpp"
#include "stableflash/attention/cuda.hpp"

namespace stableflash::attention::cuda {
namespace {

// Aligned fake device pointers: the plan only looks at their addresses.
template <class T>
T* at(std::uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

ForwardArgs forward_args(const AttentionShape& s) {
  ForwardArgs a;
  a.shape = s;
  a.q = at<const bf16>(0x10000), a.k = at<const bf16>(0x20000), a.v = at<const bf16>(0x30000);
  a.o = at<bf16>(0x40000), a.lse = at<float>(0x50000);
  return a;
}

struct Case {
  int head_dim;
  Numerics numerics;
  ShiftPolicy policy;
  bool count_events;
  ForwardKernel kernel;
  ForwardWalk walk;
};

TEST(LaunchPlan, ForwardKernelAndWalkPerShapeAndOptions) {
  using enum ForwardKernel;
  const Case cases[] = {
      // the fused fast path (1,000 keys, causal: 500 a row on average): warp-specialized at both head dims
      {128, Numerics::fused, ShiftPolicy::standard, false, warp_specialized, ForwardWalk::pipelined},
      {128, Numerics::fused, ShiftPolicy::hashed_offset, false, warp_specialized, ForwardWalk::pipelined},
      {128, Numerics::fused, ShiftPolicy::fixed_offset, false, warp_specialized, ForwardWalk::pipelined},
      {64, Numerics::fused, ShiftPolicy::standard, false, warp_specialized, ForwardWalk::pipelined},
      {64, Numerics::fused, ShiftPolicy::hashed_offset, false, warp_specialized, ForwardWalk::pipelined},
      // the published rule counts ties per numerics tile: units with a pre-pass, one warpgroup
      {128, Numerics::fused, ShiftPolicy::paper, false, one_warpgroup, ForwardWalk::units},
      {64, Numerics::fused, ShiftPolicy::paper, false, one_warpgroup, ForwardWalk::units},
      // event counters: units, so that the counts mean the CPU's
      {128, Numerics::fused, ShiftPolicy::standard, true, one_warpgroup, ForwardWalk::units},
      {64, Numerics::fused, ShiftPolicy::hashed_offset, true, one_warpgroup, ForwardWalk::units},
      // paper numerics: always units, one warpgroup
      {128, Numerics::paper, ShiftPolicy::standard, false, one_warpgroup, ForwardWalk::units},
      {64, Numerics::paper, ShiftPolicy::hashed_offset, false, one_warpgroup, ForwardWalk::units},
      {64, Numerics::paper, ShiftPolicy::paper, true, one_warpgroup, ForwardWalk::units},
  };
  for (const Case& c : cases) {
    ForwardArgs a = forward_args({2, 4, 1000, 1000, c.head_dim});
    TieCounts ties;
    if (c.count_events) a.ties = &ties;
    AttentionOptions opt;
    opt.device = Device::cuda, opt.numerics = c.numerics, opt.policy = c.policy, opt.causal = true;
    const ForwardPlan plan = plan_forward(a, opt);
    const std::string what = "D " + std::to_string(c.head_dim) + " " + std::string(to_string(c.numerics)) + " " +
                             std::string(to_string(c.policy)) + (c.count_events ? " counting" : "");
    EXPECT_EQ(plan.kernel, c.kernel) << what;
    EXPECT_EQ(plan.walk, c.walk) << what;
    EXPECT_EQ(plan.head_dim, c.head_dim) << what;
    EXPECT_EQ(plan.paper, c.numerics == Numerics::paper) << what;
    EXPECT_EQ(plan.policy, c.policy) << what;
    EXPECT_EQ(plan.count_events, c.count_events) << what;
    EXPECT_TRUE(plan.tensor_maps) << what;
    EXPECT_TRUE(plan.store_by_tma) << what;
  }
}

TEST(LaunchPlan, ShortKeyRangesTakeTheOneWarpgroupForwardAtHeadDim128UnderTwoRounds) {
  // up to 128 keys the fast path runs one 64-row warpgroup per CTA (two CTAs per SM) unless the
  // 128-row tiles of the warp-specialized kernel make two rounds of its persistent grid or more;
  // past 128 keys always the warp-specialized kernel
  AttentionOptions opt;
  opt.device = Device::cuda, opt.numerics = Numerics::fused, opt.policy = ShiftPolicy::standard;
  constexpr int kSms = 132;
  for (const bool causal : {false, true}) {
    opt.causal = causal;
    struct ShortCase {
      AttentionShape shape;
      ForwardKernel kernel;
    };
    for (const ShortCase& c : {
             // 8 x 16 tiles of 128 rows: under one round
             ShortCase{{8, 16, 128, 1, 128}, ForwardKernel::one_warpgroup},
             ShortCase{{8, 16, 128, 128, 128}, ForwardKernel::one_warpgroup},
             ShortCase{{8, 16, 128, 129, 128}, ForwardKernel::warp_specialized},
             // 263 tiles (one short of 2 x 132), then 264
             ShortCase{{1, 263, 100, 128, 128}, ForwardKernel::one_warpgroup},
             ShortCase{{1, 132, 256, 128, 128}, ForwardKernel::warp_specialized},
             // 32 x 16: 3.9 rounds
             ShortCase{{32, 16, 128, 128, 128}, ForwardKernel::warp_specialized},
             // D = 64 stays on the one-warpgroup kernel up to 128 keys
             ShortCase{{32, 16, 128, 128, 64}, ForwardKernel::one_warpgroup},
         }) {
      const ForwardPlan plan = plan_forward(forward_args(c.shape), opt, kSms);
      const std::string what = std::to_string(c.shape.batch) + " x " + std::to_string(c.shape.heads) + " x " +
                               std::to_string(c.shape.q_len) + " x " + std::to_string(c.shape.k_len) + " D " +
                               std::to_string(c.shape.head_dim) + (causal ? " causal" : " full");
      EXPECT_EQ(plan.kernel, c.kernel) << what;
      EXPECT_EQ(plan.walk, ForwardWalk::pipelined) << what;
    }
  }
}

TEST(LaunchPlan, LongRowsTakeTheWarpSpecializedForwardAtHeadDim64) {
  // full attention past 128 keys; causal from 384 visible keys per row on average (causal rows
  // see half of a square's keys)
  AttentionOptions opt;
  opt.device = Device::cuda, opt.numerics = Numerics::fused, opt.policy = ShiftPolicy::hashed_offset;
  struct LenCase {
    int q_len, k_len;
    bool causal;
    double mean_keys;
    ForwardKernel kernel;
  };
  using enum ForwardKernel;
  for (const LenCase& c : {LenCase{64, 128, false, 128, one_warpgroup}, LenCase{1, 129, false, 129, warp_specialized},
                           LenCase{2047, 2047, false, 2047, warp_specialized}, LenCase{767, 767, true, 384, warp_specialized},
                           LenCase{766, 766, true, 383.5, one_warpgroup}, LenCase{300, 4097, true, 3947.5, warp_specialized},
                           // Tq > Tk: rows before the last k_len see nothing
                           LenCase{8192, 2507, true, 2507.0 * 2508 / (2 * 8192), one_warpgroup},
                           LenCase{8192, 2509, true, 2509.0 * 2510 / (2 * 8192), warp_specialized}}) {
    opt.causal = c.causal;
    const AttentionShape shape{2, 4, c.q_len, c.k_len, 64};
    const std::string what = std::to_string(c.q_len) + " x " + std::to_string(c.k_len) + (c.causal ? " causal" : " full");
    EXPECT_DOUBLE_EQ(mean_visible_keys(shape, c.causal), c.mean_keys) << what;
    const ForwardPlan plan = plan_forward(forward_args(shape), opt);
    EXPECT_EQ(plan.kernel, c.kernel) << what;
    EXPECT_EQ(plan.walk, ForwardWalk::pipelined) << what;
  }
  // the published rule and counting runs walk numerics tiles in the one-warpgroup kernel, however long
  opt.policy = ShiftPolicy::paper;
  EXPECT_EQ(plan_forward(forward_args({2, 4, 8192, 8192, 64}), opt).kernel, one_warpgroup);
}

// Small grids: one consumer a CTA (64-row tiles) where the 64-row blocks fit one an SM, or two an
// SM under the causal mask (spreads_rows_over_sms), on 132 SMs unless said.
TEST(LaunchPlan, SmallGridsTakeOneConsumerOfSixtyFourRows) {
  struct GridCase {
    AttentionShape shape;
    bool causal;
    int sms, consumers;
  };
  for (const GridCase& c : {
           // full: 8 x 16 = 128 blocks, then 8 x 17 = 136; 1 x 8,192 rows is 128 blocks too
           GridCase{{1, 8, 1024, 1024, 128}, false, 132, 1},
           GridCase{{1, 8, 1025, 1025, 128}, false, 132, 2},
           GridCase{{1, 1, 8192, 8192, 128}, false, 132, 1},
           GridCase{{1, 8, 1024, 1024, 128}, false, 114, 2},
           // 8 x 16 blocks at D = 64, then 9 x 16 = 144 (two consumers: 72 tiles of 128 rows, one round)
           GridCase{{1, 8, 1024, 1024, 64}, false, 132, 1},
           GridCase{{1, 9, 1024, 1024, 64}, false, 132, 2},
           // causal: up to 264 blocks (8 x 33 at 2,112 rows), then 8 x 34 = 272
           GridCase{{1, 8, 2112, 2112, 128}, true, 132, 1},
           GridCase{{1, 8, 2113, 2113, 128}, true, 132, 2},
           GridCase{{1, 8, 2048, 2048, 64}, true, 132, 1},
           GridCase{{2, 8, 1025, 1025, 64}, true, 132, 3},
       }) {
    const std::string what = std::to_string(c.shape.batch) + " x " + std::to_string(c.shape.heads) + " x " +
                             std::to_string(c.shape.q_len) + " D " + std::to_string(c.shape.head_dim) +
                             (c.causal ? " causal" : " full") + " on " + std::to_string(c.sms) + " SMs";
    EXPECT_EQ(ws_consumers_for(c.shape, c.causal, c.sms), c.consumers) << what;
    AttentionOptions opt;
    opt.device = Device::cuda, opt.causal = c.causal;
    const ForwardPlan plan = plan_forward(forward_args(c.shape), opt, c.sms);
    EXPECT_EQ(plan.kernel, ForwardKernel::warp_specialized) << what;
    EXPECT_EQ(plan.ws_consumers, c.consumers) << what;
  }
  // D = 64 causal rows of under 384 keys on average stay on the one-warpgroup kernel, however small the grid
  AttentionOptions opt;
  opt.device = Device::cuda, opt.causal = true;
  EXPECT_EQ(plan_forward(forward_args({1, 8, 512, 512, 64}), opt, 132).kernel, ForwardKernel::one_warpgroup);
}

// Full attention's last round as pieces (ws_tail_for): the tiles of a partial last round of the
// persistent grid taken as items of fewer 64-row blocks than a tile's, one-block items where they fit on
// two thirds of the SMs, larger ones where they fit one an SM. Counted by hand on 132 SMs.
TEST(LaunchPlan, LastRoundSplitsIntoItemsWhereTheyFit) {
  // 8 heads x 86 tiles of 192 rows = 688 = 5 x 132 + 28: 84 one-block items <= 88
  EXPECT_EQ(ws_tail_for({1, 8, 16384, 16384, 64}, false, 132, 3), (WsTailSplit{28, 1}));
  // 32 x 128 tiles of 128 rows = 4,096 = 31 x 132 + 4: 8 items; 512 x 16 = 8,192 = 62 x 132 + 8: 16
  EXPECT_EQ(ws_tail_for({2, 16, 16384, 16384, 128}, false, 132, 2), (WsTailSplit{4, 1}));
  EXPECT_EQ(ws_tail_for({32, 16, 2048, 2048, 128}, false, 132, 2), (WsTailSplit{8, 1}));
  // 32 x 11 tiles = 352 = 2 x 132 + 88, the last 8 heads' 32 blocks each: 256 one-block items, 128
  // of two
  EXPECT_EQ(ws_tail_for({2, 16, 2048, 2048, 64}, false, 132, 3), (WsTailSplit{88, 2}));
  // 128 x 22 = 2,816 = 21 x 132 + 44, two heads of 65 blocks: 130 one-block items (more than two
  // thirds of the SMs), 66 of two
  EXPECT_EQ(ws_tail_for({8, 16, 4097, 4097, 64}, false, 132, 3), (WsTailSplit{44, 2}));
  // GPT-2 full: 192 x 6 = 1,152 = 8 x 132 + 96, 128 two-block items, but every head ends in a lone
  // block (1,024 = 5 x 192 + 64): none
  EXPECT_EQ(ws_tail_for({16, 12, 1024, 1024, 64}, false, 132, 3), WsTailSplit{});
  // two consumers: one-block items or none; 32 x 64 = 2,048 = 15 x 132 + 68: 136 items
  EXPECT_EQ(ws_tail_for({2, 16, 8192, 8192, 128}, false, 132, 2), WsTailSplit{});
  // rounds filled (2 x 132 heads of one tile), one round, causal, one consumer: none
  EXPECT_EQ(ws_tail_for({2, 132, 128, 128, 128}, false, 132, 2), WsTailSplit{});
  EXPECT_EQ(ws_tail_for({1, 100, 128, 128, 128}, false, 132, 2), WsTailSplit{});
  EXPECT_EQ(ws_tail_for({1, 8, 16384, 16384, 64}, true, 132, 3), WsTailSplit{});
  EXPECT_EQ(ws_tail_for({1, 8, 16384, 16384, 64}, false, 132, 1), WsTailSplit{});
  // the plan carries it, for its own consumers and SM count
  AttentionOptions opt;
  opt.device = Device::cuda;
  const ForwardPlan plan = plan_forward(forward_args({1, 8, 16384, 16384, 64}), opt, 132);
  EXPECT_EQ(plan.ws_consumers, 3);
  EXPECT_EQ(plan.ws_tail, (WsTailSplit{28, 1}));
  // 688 = 6 x 114 + 4 on 114 SMs: 12 items
  EXPECT_EQ(plan_forward(forward_args({1, 8, 16384, 16384, 64}), opt, 114).ws_tail, (WsTailSplit{4, 1}));
}

// Full attention's heads ending in a lone 64-row block of a three-consumer tile, paired two heads a
// tile (ws_lone_pairs_for): GPT-2 full (1,024 rows = 5 x 192 + 64) and 1,000 rows (16 blocks); not
// where the last tile has two blocks (2,048 rows: 32 blocks), with two consumers, causal, where tail
// items take the last round, or with a single head.
TEST(LaunchPlan, LoneLastBlocksArePairedAcrossHeads) {
  EXPECT_TRUE(ws_lone_pairs_for({16, 12, 1024, 1024, 64}, false, 3, false));
  EXPECT_TRUE(ws_lone_pairs_for({8, 16, 1000, 1000, 64}, false, 3, false));
  EXPECT_FALSE(ws_lone_pairs_for({32, 16, 2048, 2048, 64}, false, 3, false));
  EXPECT_FALSE(ws_lone_pairs_for({16, 12, 1024, 1024, 64}, true, 3, false));
  EXPECT_FALSE(ws_lone_pairs_for({16, 12, 1024, 1024, 64}, false, 2, false));
  EXPECT_FALSE(ws_lone_pairs_for({16, 12, 1024, 1024, 64}, false, 3, true));
  EXPECT_FALSE(ws_lone_pairs_for({1, 1, 1024, 1024, 64}, false, 3, false));
  // the plan carries it where its kernel and consumers are the warp-specialized three
  AttentionOptions opt;
  opt.device = Device::cuda;
  const ForwardPlan gpt2_full = plan_forward(forward_args({16, 12, 1024, 1024, 64}), opt, 132);
  EXPECT_EQ(gpt2_full.ws_consumers, 3);
  EXPECT_TRUE(gpt2_full.ws_lone_pairs);
  opt.causal = true;
  EXPECT_FALSE(plan_forward(forward_args({16, 12, 1024, 1024, 64}), opt, 132).ws_lone_pairs);
  opt.causal = false;
  EXPECT_FALSE(plan_forward(forward_args({2, 16, 1024, 1024, 128}), opt, 132).ws_lone_pairs);
  // the GPU test's grid (PairedLoneBlocksGiveEveryHeadItsBitsAlone): the fewest odd heads of 1,000 rows
  // (16 blocks: 5 whole tiles and a lone block a head) that pair on the H100's and H200's 132 SMs
  // with two rounds of whole tiles or more, so that CTAs walk paired tiles between whole ones (fewer heads
  // take two consumers, or fill fewer rounds)
  int heads = 3;
  while (heads <= 401 && !(plan_forward(forward_args({1, heads, 1000, 1000, 64}), opt, 132).ws_lone_pairs && 5 * heads >= 2 * 132))
    heads += 2;
  EXPECT_EQ(heads, 53);
}

// The items of a split (tail_pieces.hpp) cover every 64-row block of the split tiles once, each item
// inside one head, and the schedule counts them: split tiles starting inside a head or at its start,
// a head's last tile partial or whole, items of one and two blocks.
TEST(LaunchPlan, TailItemsCoverTheSplitTilesBlocksOnce) {
  struct TailCase {
    int q_len, batch_heads, consumers, tail_tiles, group;
  };
  for (const TailCase& c : {TailCase{16384, 8, 3, 28, 1}, TailCase{2048, 32, 3, 88, 2}, TailCase{4097, 128, 3, 44, 2},
                            TailCase{1000, 34, 3, 72, 2}, TailCase{1024, 17, 2, 4, 1}, TailCase{1000, 7, 3, 10, 2}}) {
    const WsTailPieces tail = WsTailPieces::of(c.q_len, c.batch_heads, c.consumers, c.tail_tiles, c.group);
    const int head_tiles = (c.q_len + 64 * c.consumers - 1) / (64 * c.consumers), blocks = (c.q_len + 63) / 64;
    const std::string what = std::to_string(c.q_len) + " rows x " + std::to_string(c.batch_heads) + " heads, " +
                             std::to_string(c.tail_tiles) + " tiles split in groups of " + std::to_string(c.group);
    // the split tiles' blocks (bh, 64-row block), each to be covered once
    std::vector<int> covered(std::size_t(c.batch_heads) * blocks, 0);
    const int first = head_tiles * c.batch_heads - c.tail_tiles;
    for (int t = first; t < head_tiles * c.batch_heads; ++t)
      for (int k = 0; k < c.consumers; ++k) {
        const int block = t % head_tiles * c.consumers + k;
        if (block < blocks) covered[std::size_t(t / head_tiles) * blocks + block] = -1;
      }
    const int items = tail.items(c.batch_heads);
    EXPECT_EQ(tail.schedule(c.batch_heads), first + items) << what;
    for (int q = 0; q < items; ++q) {
      const WsTailPieces::Item item = tail.at(q);
      ASSERT_TRUE(item.bh >= 0 && item.bh < c.batch_heads && item.m0 % 64 == 0 && item.blocks >= 1 && item.blocks <= c.group) << what;
      ASSERT_LE(item.m0 / 64 + item.blocks, blocks) << what << ": item " << q << " leaves its head";
      for (int k = 0; k < item.blocks; ++k) {
        int& at = covered[std::size_t(item.bh) * blocks + item.m0 / 64 + k];
        EXPECT_EQ(at, -1) << what << ": item " << q << " takes a block outside the split tiles or twice";
        at = 1;
      }
    }
    int uncovered = 0;
    for (int x : covered) uncovered += x == -1;
    EXPECT_EQ(uncovered, 0) << what;
  }
}

// The warp-specialized forward's consumers at D = 64 (ws_consumers_for): two only where three would
// leave most of a round of the persistent grid idle. The rounds below are counted by hand from
// the tile counts (192 or 128 rows a tile) on 132 SMs.
TEST(LaunchPlan, TwoConsumersAtHeadDim64OnlyWhereThreeLeaveARoundIdle) {
  struct ConsumerCase {
    AttentionShape shape;
    int consumers;
  };
  for (const ConsumerCase& c : {
           // 8 heads x 22 tiles of 192 rows = 176: 2 rounds; 8 x 33 of 128 = 264: 2 rounds, 0.84 x 2 < 2
           ConsumerCase{{1, 8, 4097, 4097, 64}, 2},
           // one round either way (64 or 96 tiles): two consumers finish a round sooner
           ConsumerCase{{2, 16, 384, 384, 64}, 2},
           // 1,152 tiles: 9 rounds; 1,536: 12 rounds, 0.84 x 12 > 9
           ConsumerCase{{16, 12, 1024, 1024, 64}, 3},
           // 1,376 tiles: 11 rounds; 2,048: 16 rounds
           ConsumerCase{{2, 16, 8192, 8192, 64}, 3},
           // head dim 128 has two consumers (one on small grids: the test above)
           ConsumerCase{{1, 8, 4097, 4097, 128}, 2},
           ConsumerCase{{2, 16, 8192, 8192, 128}, 2}}) {
    EXPECT_EQ(ws_consumers_for(c.shape, false, 132), c.consumers) << c.shape.batch << "," << c.shape.heads << "," << c.shape.q_len << ","
                                                          << c.shape.head_dim;
  }
  AttentionOptions opt;
  opt.device = Device::cuda;
  EXPECT_EQ(plan_forward(forward_args({1, 8, 4097, 4097, 64}), opt, 132).ws_consumers, 2);
  EXPECT_EQ(plan_forward(forward_args({2, 16, 8192, 8192, 64}), opt, 132).ws_consumers, 3);
  // the SM count is the plan's: the launch sizes the persistent grid from it
  EXPECT_EQ(plan_forward(forward_args({1, 8, 4097, 4097, 64}), opt, 114).sms, 114);
  // the one-warpgroup kernel has no consumers to count
  EXPECT_EQ(plan_forward(forward_args({2, 4, 64, 64, 64}), opt, 132).ws_consumers, 0);
}

TEST(LaunchPlan, TheFastPathTestAgreesWithTheKernelsCompileTimeOne) {
  EXPECT_TRUE((kFastPathInstantiable<false, StandardShift>));
  EXPECT_TRUE((kFastPathInstantiable<false, HashedOffsetShift>));
  EXPECT_TRUE((kFastPathInstantiable<false, FixedOffsetShift>));
  EXPECT_FALSE((kFastPathInstantiable<false, PublishedShift>));
  EXPECT_FALSE((kFastPathInstantiable<true, StandardShift>));
  EXPECT_TRUE(takes_fast_path(Numerics::fused, ShiftPolicy::standard, false));
  EXPECT_FALSE(takes_fast_path(Numerics::fused, ShiftPolicy::standard, true));
  EXPECT_FALSE(takes_fast_path(Numerics::fused, ShiftPolicy::paper, false));
  EXPECT_FALSE(takes_fast_path(Numerics::paper, ShiftPolicy::hashed_offset, false));
}

TEST(LaunchPlan, OutputsWithoutSixteenByteRowsAreStoredElementWise) {
  AttentionOptions opt;
  opt.device = Device::cuda;
  ForwardArgs a = forward_args({1, 2, 64, 64, 64});
  a.o = at<bf16>(0x40004);  // 4-byte aligned: allowed, stored element-wise
  EXPECT_FALSE(plan_forward(a, opt).store_by_tma);
  a = forward_args({1, 2, 64, 64, 64});
  a.o_residual = at<bf16>(0x60008);
  EXPECT_FALSE(plan_forward(a, opt).store_by_tma);
  a.o_residual = at<bf16>(0x60010);
  EXPECT_TRUE(plan_forward(a, opt).store_by_tma);
  a.strides.o = HeadStrides{2 * 64 * 66, 64 * 66, 66};  // token stride of 66 elements: 4-byte rows
  EXPECT_FALSE(plan_forward(a, opt).store_by_tma);
}

BackwardArgs backward_args(const AttentionShape& s) {
  BackwardArgs a;
  a.shape = s;
  a.q = at<const bf16>(0x10000), a.k = at<const bf16>(0x20000), a.v = at<const bf16>(0x30000);
  a.o = at<const bf16>(0x40000), a.lse = at<const float>(0x50000), a.d_o = at<const bf16>(0x60000);
  a.dq = at<bf16>(0x70000), a.dk = at<bf16>(0x80000), a.dv = at<bf16>(0x90000);
  return a;
}

// The backward's main grid: persistent (one CTA per SM) for full attention at head dim 128 with more
// items (pairs x 128-key blocks) than SMs and walks of up to 128 query blocks; a CTA per item for
// causal attention (items of different lengths), head dim 64, longer walks, one key block
// (dq_direct), few items, or no SM count
TEST(LaunchPlan, BackwardPersistentGridOnlyForFullAttentionWithMoreItemsThanSms) {
  AttentionOptions opt;
  opt.device = Device::cuda;
  const int sms = 132;
  const BackwardArgs many = backward_args({2, 50, 300, 300, 128});  // 3 key blocks x 100 pairs = 300 items
  EXPECT_EQ(plan_backward(many, opt, true, sms).main_ctas, sms);
  EXPECT_EQ(plan_backward(many, opt, true, 0).main_ctas, 0);
  opt.deterministic = true;
  EXPECT_EQ(plan_backward(many, opt, true, sms).main_ctas, sms) << "deterministic: the same order of items";
  opt.deterministic = false, opt.causal = true;
  EXPECT_EQ(plan_backward(many, opt, true, sms).main_ctas, 0) << "causal";
  opt.causal = false;
  EXPECT_EQ(plan_backward(backward_args({2, 22, 300, 300, 128}), opt, true, sms).main_ctas, 0) << "132 items: one round";
  EXPECT_EQ(plan_backward(backward_args({8, 64, 300, 128, 128}), opt, true, sms).main_ctas, 0) << "one key block";
  EXPECT_EQ(plan_backward(backward_args({2, 50, 300, 300, 64}), opt, true, sms).main_ctas, 0) << "head dim 64";
  EXPECT_EQ(plan_backward(backward_args({2, 16, 8192, 8192, 128}), opt, true, sms).main_ctas, sms) << "128 query blocks a walk";
  EXPECT_EQ(plan_backward(backward_args({2, 16, 8193, 8193, 128}), opt, true, sms).main_ctas, 0) << "129 query blocks a walk";
}

// Head dim 128 grids of few 64-key items take 64-key CTAs (twice the CTAs of the 128-key items):
// causal up to one an SM, full up to 3/4 of the SMs; outside deterministic mode and with several key
// blocks; the workspace is the same either way
TEST(LaunchPlan, BackwardSmallGridsTakeSixtyFourKeyCtasAtHeadDim128) {
  AttentionOptions opt;
  opt.device = Device::cuda;
  const int sms = 132;
  const auto groups = [&](AttentionShape s, bool causal, int with_sms = 132) {
    opt.causal = causal;
    return plan_backward(backward_args(s), opt, true, with_sms).key_groups;
  };
  EXPECT_EQ(groups({1, 1, 8192, 8192, 128}, true), 1) << "causal, 128 items of 64 keys";
  EXPECT_EQ(groups({1, 2, 4224, 4224, 128}, true), 1) << "causal, 132";
  EXPECT_EQ(groups({1, 2, 4225, 4225, 128}, true), 2) << "causal, 134";
  EXPECT_EQ(groups({1, 16, 384, 384, 128}, false), 1) << "full, 96";
  EXPECT_EQ(groups({1, 1, 6336, 6336, 128}, false), 1) << "full, 99";
  EXPECT_EQ(groups({1, 1, 6337, 6337, 128}, false), 2) << "full, 100";
  EXPECT_EQ(groups({1, 1, 8192, 8192, 128}, false), 2) << "full, 128";
  EXPECT_EQ(groups({2, 16, 384, 384, 128}, true), 2) << "192";
  EXPECT_EQ(groups({1, 16, 128, 128, 128}, true), 2) << "one key block";
  EXPECT_EQ(groups({1, 1, 4096, 4096, 128}, true, 0), 2) << "no SM count";
  EXPECT_EQ(groups({1, 1, 4096, 4096, 64}, true), 2) << "head dim 64";
  opt.causal = true;
  const BackwardArgs small = backward_args({1, 1, 8192, 8192, 128});
  const BackwardPlan one = plan_backward(small, opt, true, sms);
  EXPECT_EQ(one.main_ctas, 0);
  EXPECT_EQ(one.workspace.total, plan_backward(small, opt, true, 0).workspace.total);
  opt.deterministic = true;
  EXPECT_EQ(plan_backward(small, opt, true, sms).key_groups, 2) << "deterministic: dQ's key-block order";
}

TEST(LaunchPlan, BackwardDeltaPassAndWorkspace) {
  AttentionOptions opt;
  opt.device = Device::cuda;
  // (3, 4, 1000, 128): Tq padded to 1024 for the fragment-ordered dQ accumulator
  const BackwardArgs a = backward_args({3, 4, 1000, 1000, 128});
  BackwardPlan plan = plan_backward(a, opt);
  EXPECT_EQ(plan.delta, DeltaPass::from_output);
  EXPECT_EQ(plan.kv_group, 1);
  EXPECT_EQ(plan.workspace.dq_bytes, std::size_t(3) * 4 * 1024 * 128 * 4);
  EXPECT_EQ(plan.workspace.semaphores, 0u);
  EXPECT_EQ(plan.workspace.delta_bytes, std::size_t(3) * 4 * 1000 * 4);
  EXPECT_EQ(plan.workspace.per_head_bytes, 0u);
  // the first key block to reach a dQ tile stores it: only the claims (one per [64, 64] tile) are
  // cleared, not the accumulator
  EXPECT_TRUE(plan.dq_first_store);
  EXPECT_EQ(plan.workspace.claims, std::size_t(3) * 4 * 16 * 2);
  EXPECT_EQ(plan.workspace.at_claims, plan.workspace.dq_bytes);
  EXPECT_EQ(plan.workspace.zeroed_begin(), plan.workspace.at_claims);
  EXPECT_EQ(plan.workspace.zeroed_bytes(), plan.workspace.claims * sizeof(int));
  // no per-head parts: the allocation ends at the 256-byte boundary after delta (entry.cu's former layout)
  EXPECT_EQ(plan.workspace.total, (plan.workspace.at_delta + plan.workspace.delta_bytes + 255) / 256 * 256);

  opt.deterministic = true, opt.delta_source = DeltaSource::exact;
  plan = plan_backward(a, opt);
  EXPECT_EQ(plan.delta, DeltaPass::exact);
  EXPECT_EQ(plan.workspace.claims, 0u);  // the turn counters order the key blocks: block 0 stores
  EXPECT_EQ(plan.workspace.semaphores, std::size_t(3) * 4 * 16);  // one turn counter per 64-query block
  EXPECT_EQ(plan.workspace.at_semaphores % 256, 0u);
  EXPECT_EQ(plan.workspace.zeroed_begin(), plan.workspace.at_semaphores);
  EXPECT_EQ(plan.workspace.zeroed_bytes(), 3 * 4 * 16 * sizeof(int));

  // grouped-query heads (16 query heads, 2 KV heads): per-query-head dK, dV parts; a given delta
  // output needs no workspace part
  BackwardArgs g = backward_args({2, 16, 256, 256, 64});
  g.shape.kv_heads = 2;
  float delta_out = 0.0f;
  g.delta = &delta_out;
  plan = plan_backward(g, AttentionOptions{});
  EXPECT_EQ(plan.kv_group, 8);
  EXPECT_EQ(plan.workspace.delta_bytes, 0u);
  EXPECT_EQ(plan.workspace.per_head_bytes, std::size_t(2) * 16 * 256 * 64 * 2);
  EXPECT_EQ(plan.workspace.at_dk % 256, 0u);
  EXPECT_EQ(plan.workspace.at_dv, plan.workspace.at_dk + plan.workspace.per_head_bytes);
  EXPECT_EQ(plan.workspace.total, plan.workspace.at_dv + plan.workspace.per_head_bytes);
  // attention_delta alone has no workspace
  EXPECT_EQ(plan_backward(g, AttentionOptions{}, /*with_gradients=*/false).workspace.total, 0u);
}

// Where the main kernel has one key block per (b, h) it stores dQ itself: no dQ accumulator or turn
// counters in the workspace, nothing for the delta pass to clear. One key more and the workspace is back.
TEST(LaunchPlan, OneKeyBlockStoresDqDirectlyWithoutAWorkspace) {
  AttentionOptions opt;
  opt.device = Device::cuda;
  opt.deterministic = true;
  for (const int k_len : {1, 97, kBackwardBlockK}) {
    const BackwardPlan plan = plan_backward(backward_args({8, 16, 300, k_len, 128}), opt);
    EXPECT_TRUE(plan.dq_direct) << "k_len " << k_len;
    EXPECT_EQ(plan.workspace.dq_bytes, 0u) << "k_len " << k_len;
    EXPECT_EQ(plan.workspace.semaphores, 0u) << "k_len " << k_len;
    EXPECT_EQ(plan.workspace.zeroed_bytes(), 0u) << "k_len " << k_len;
    EXPECT_EQ(plan.workspace.delta_bytes, std::size_t(8) * 16 * 300 * 4) << "k_len " << k_len;
  }
  const BackwardPlan two_blocks = plan_backward(backward_args({8, 16, 300, kBackwardBlockK + 1, 128}), opt);
  EXPECT_FALSE(two_blocks.dq_direct);
  EXPECT_EQ(two_blocks.workspace.dq_bytes, std::size_t(8) * 16 * 320 * 128 * 4);  // Tq padded to 5 blocks of 64
  EXPECT_EQ(two_blocks.workspace.semaphores, std::size_t(8) * 16 * 5);
  // the lab's layout with the direct store turned off is the one of the accumulating kernels
  BackwardPlan lab = plan_backward(backward_args({8, 16, 300, 128, 128}), opt);
  lab.dq_direct = false;
  lab.dq_first_store = false;
  settle_backward_plan(lab, backward_args({8, 16, 300, 128, 128}), opt);
  EXPECT_EQ(lab.workspace.dq_bytes, two_blocks.workspace.dq_bytes);
  EXPECT_EQ(lab.workspace.semaphores, two_blocks.workspace.semaphores);
  // the lab's kernels add into a cleared accumulator
  EXPECT_EQ(lab.workspace.zeroed_begin(), 0u);
  EXPECT_EQ(lab.workspace.zeroed_end(), lab.workspace.at_semaphores + lab.workspace.semaphores * sizeof(int));
}

// The exact delta: formed by the main kernel where it holds every key of a row (one key block), by
// its own pass otherwise, and always by the pass for attention_delta alone or once the lab turns
// the direct store off. The other sources read the output whatever the keys.
TEST(LaunchPlan, ExactDeltaInsideTheMainKernelOnlyWithOneKeyBlock) {
  AttentionOptions opt;
  opt.device = Device::cuda;
  opt.delta_source = DeltaSource::exact;
  for (const int k_len : {1, 77, kBackwardBlockK}) {
    const BackwardArgs a = backward_args({2, 4, 300, k_len, 64});
    EXPECT_EQ(plan_backward(a, opt).delta, DeltaPass::in_main) << "k_len " << k_len;
    // no δ pass, so nothing may need clearing (execute_backward: every δ pass clears the workspace)
    EXPECT_EQ(plan_backward(a, opt).workspace.zeroed_bytes(), 0u) << "k_len " << k_len;
    EXPECT_EQ(plan_backward(a, opt, /*with_gradients=*/false).delta, DeltaPass::exact) << "k_len " << k_len;
    BackwardPlan lab = plan_backward(a, opt);
    lab.dq_direct = false;
    settle_backward_plan(lab, a, opt);
    EXPECT_EQ(lab.delta, DeltaPass::exact) << "k_len " << k_len;
  }
  EXPECT_EQ(plan_backward(backward_args({2, 4, 300, kBackwardBlockK + 1, 64}), opt).delta, DeltaPass::exact);
  for (DeltaSource src : {DeltaSource::rounded, DeltaSource::compensated}) {
    opt.delta_source = src;
    EXPECT_EQ(plan_backward(backward_args({2, 4, 300, 77, 64}), opt).delta, DeltaPass::from_output) << to_string(src);
  }
}

// check_tensors' message for these arguments, or "" where it accepts them.
template <class Args>
std::string refusal(const Args& args, const AttentionOptions& opt) {
  try {
    check_tensors(args, opt);
    return "";
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
}

// The ranges the backward's kernels index in 32 bits and the exact delta pass's grid; each shape
// crosses exactly one of them by one, beside a shape one below it (check_backward_index_ranges in
// plan.cpp).
TEST(LaunchPlan, BackwardIndexRangesAreCheckedOnce) {
  AttentionOptions opt;
  opt.device = Device::cuda;
  const auto message = [&](const AttentionShape& s) { return refusal(backward_args(s), opt); };
  const int kMaxInt = 2147483647;
  // heads * q_len = 2^31 (the delta pass's rows of a batch element)
  EXPECT_NE(message({1, 2, 1 << 30, 64, 64}).find("heads * q_len"), std::string::npos);
  EXPECT_EQ(message({1, 2, (1 << 30) - 1, 64, 64}), "");
  // 128 heads x 2^24 key blocks of 128 = 2^31 CTAs (k_len 2^31 - 1 rounds up to 2^24 blocks, with
  // no int overflow on the way), then 256 heads x 2^23 blocks
  EXPECT_NE(message({1, 128, 64, kMaxInt, 64}).find("the backward's CTAs"), std::string::npos);
  EXPECT_EQ(message({1, 127, 64, kMaxInt, 64}), "");
  EXPECT_NE(message({1, 256, 64, 1 << 30, 64}).find("the backward's CTAs"), std::string::npos);
  EXPECT_EQ(message({1, 256, 64, (1 << 30) - 128, 64}), "");
  // 2^26 batch elements x 16 query blocks x 2 dim tiles = 2^31 dQ tiles
  EXPECT_NE(message({1 << 26, 1, 1024, 64, 128}).find("the dQ conversion's tiles"), std::string::npos);
  EXPECT_EQ(message({(1 << 26) - 1, 1, 1024, 64, 128}), "");
  // a CTA count past 2^63 (2^65 - 2^34): refused, not wrapped around to a small number
  const std::string huge = message({kMaxInt, 1024, 1, kMaxInt, 64});
  EXPECT_NE(huge.find("the backward's CTAs"), std::string::npos) << huge;
  EXPECT_NE(huge.find("more than 2^63"), std::string::npos) << huge;
  // q_len 2^31 - 63 rounds up to 2^31 in whole query blocks of 64 (the main kernel's loop bound)
  EXPECT_NE(message({1, 1, kMaxInt - 62, 64, 64}).find("q_len rounded up to query blocks of 64"), std::string::npos);
  EXPECT_EQ(message({1, 1, kMaxInt - 63, 64, 64}), "");
  // grouped-query heads: 16 batch elements x 2^30 keys x 32 threads (D = 128) = 2^31 group-sum CTAs of 256
  AttentionShape grouped{16, 2, 64, 1 << 30, 128};
  grouped.kv_heads = 1;
  EXPECT_NE(message(grouped).find("the group sum's CTAs"), std::string::npos);
  grouped.k_len = (1 << 30) - 1;
  EXPECT_EQ(message(grouped), "");
  // the exact delta pass: heads and batch in its grid's y and z (the main kernel's grid is 1-d, so
  // other delta sources take them), keys in steps of 64
  EXPECT_EQ(message({1, 65536, 64, 64, 64}), "");
  EXPECT_EQ(message({65536, 1, 64, 64, 64}), "");
  opt.delta_source = DeltaSource::exact;
  EXPECT_NE(message({1, 65536, 64, 64, 64}).find("heads (the exact delta pass's grid y)"), std::string::npos);
  EXPECT_EQ(message({1, 65535, 64, 64, 64}), "");
  EXPECT_NE(message({65536, 1, 64, 64, 64}).find("batch (the exact delta pass's grid z)"), std::string::npos);
  EXPECT_EQ(message({65535, 1, 64, 64, 64}), "");
  EXPECT_NE(message({1, 1, 64, kMaxInt - 62, 64}).find("the exact delta pass's steps of 64 keys"), std::string::npos);
  EXPECT_EQ(message({1, 1, 64, kMaxInt - 63, 64}), "");
}

// The forward's grid (heads in y, batch in z: at most 65535) and its kernels' 32-bit ranges (q_len
// and k_len rounded up to kForwardMaxBlock = 192, k_len to tile_k, the warp-specialized kernel's
// tiles); each shape crosses one of them by one, beside a shape one below it
// (check_forward_index_ranges in plan.cpp).
TEST(LaunchPlan, ForwardIndexRangesAreCheckedOnce) {
  AttentionOptions opt;
  opt.device = Device::cuda;
  const auto message = [&](const AttentionShape& s) { return refusal(forward_args(s), opt); };
  const int kMaxInt = 2147483647;
  EXPECT_NE(message({1, 65536, 64, 64, 64}).find("heads (the grid's y) must be at most 65535"), std::string::npos);
  EXPECT_EQ(message({1, 65535, 64, 64, 64}), "");
  EXPECT_NE(message({65536, 1, 64, 64, 64}).find("batch (the grid's z) must be at most 65535"), std::string::npos);
  EXPECT_EQ(message({65535, 1, 64, 64, 64}), "");
  // 2^31 - 127 rounds up past 2^31 (computed without int overflow); 2^31 - 128 = 192 (2^24 - 1) / 3
  // is a whole number of 192s
  static_assert(kForwardMaxBlock == 192, "the lengths below");
  EXPECT_NE(message({1, 1, kMaxInt - 126, 64, 64}).find("q_len rounded up to the largest CTA"), std::string::npos);
  EXPECT_EQ(message({1, 1, kMaxInt - 127, 64, 64}), "");
  EXPECT_NE(message({1, 1, 64, kMaxInt - 126, 64}).find("k_len rounded up to the largest key step"), std::string::npos);
  EXPECT_EQ(message({1, 1, 64, kMaxInt - 127, 64}), "");
  // the numerics-tile walk steps to the first key of the tile after the last
  opt.tile_k = 1024;
  EXPECT_NE(message({1, 1, 64, kMaxInt - 1022, 64}).find("k_len rounded up to whole key tiles (tile_k)"), std::string::npos);
  EXPECT_EQ(message({1, 1, 64, kMaxInt - 1023, 64}), "");
  opt.tile_k = 0;
  // the warp-specialized kernel's tiles and items, counted in blocks of 64 rows of whole 192-row
  // tiles: 3 x 5,462 = 16,386 per head of 2^20 rows; 4 x 32,764 heads x 16,386 = 2^31 - 32
  EXPECT_NE(message({32765, 4, 1 << 20, 64, 64}).find("batch * heads * blocks of 64 query rows in whole tiles of 192"), std::string::npos);
  EXPECT_EQ(message({32764, 4, 1 << 20, 64, 64}), "");
}

TEST(LaunchPlan, ArgumentChecksNameTheField) {
  AttentionOptions opt;
  opt.device = Device::cuda;
  ForwardArgs a = forward_args({1, 2, 64, 64, 64});
  EXPECT_NO_THROW(check_tensors(a, opt));
  a.strides.q = HeadStrides{2 * 64 * 68, 64 * 68, 68};
  try {
    check_tensors(a, opt);
    FAIL() << "strides.q.t = 68 passed";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("strides.q.t = 68 must be a multiple of 8 elements"), std::string::npos) << e.what();
  }
  EXPECT_THROW(check_shape_options({1, 2, 64, 64, 96}, opt, /*head_dim_compiled=*/false), std::invalid_argument);
  opt.tile_k = 96;
  EXPECT_THROW(check_shape_options({1, 2, 64, 64, 64}, opt, true), std::invalid_argument);
}

// The backward's walk order (walk_order.hpp): where a CTA's walk over its query blocks starts.
TEST(WalkStart, RotatesOnlyFullAttentionOutsideDeterministicModeWithSeveralKeyBlocks) {
  // 8,192 keys: 64 blocks of 128, walks of 128 query blocks of 64 rows
  EXPECT_EQ(walk_start(128 * 5, 128, 8192, false, false), 10);  // 5/64 of the way
  EXPECT_EQ(walk_start(128 * 5, 128, 8192, true, false), 0);    // causal: its diagonal
  EXPECT_EQ(walk_start(128 * 5, 128, 8192, false, true), 0);    // deterministic: key-block order
  EXPECT_EQ(walk_start(0, 2, 128, false, false), 0);            // one key block
  EXPECT_EQ(walk_start(0, 0, 8192, false, false), 0);           // no block to walk
}

TEST(WalkStart, SpreadsAHeadsKeyBlocksOverItsWalk) {
  // key blocks running in step start at distinct blocks, in order, evenly apart
  for (const auto [k_len, count] : {std::pair{8192, 128}, std::pair{1000, 16}, std::pair{384, 6}, std::pair{16384, 256}}) {
    SCOPED_TRACE(std::to_string(k_len) + " keys, walks of " + std::to_string(count));
    const int blocks = (k_len + 127) / 128;
    int last = -1;
    for (int r = 0; r < blocks; ++r) {
      const int start = walk_start(128 * r, count, k_len, false, false);
      EXPECT_GT(start, last);
      EXPECT_EQ(start, r * count / blocks);
      last = start;
    }
  }
}

TEST(WalkStart, SixtyFourKeyCtasStartWithTheirHundredTwentyEightKeyBlock) {
  // so that they sum dK, dV in the 128-key CTA's order and keep its bits
  for (int k0 = 0; k0 < 4096; k0 += 128) EXPECT_EQ(walk_start(k0 + 64, 64, 4096, false, false), walk_start(k0, 64, 4096, false, false));
}

TEST(WalkStart, StaysInsideTheWalkWhereThirtyTwoBitsOverflow) {
  // (Tk / 128) x count >= 2^32: the spread changes, the start is still a block of the walk
  const int k_len = 1 << 30, count = 1 << 22;
  for (int k0 : {0, 128, 1 << 20, (1 << 29) + 128, k_len - 128}) {
    const int start = walk_start(k0, count, k_len, false, false);
    EXPECT_GE(start, 0);
    EXPECT_LT(start, count);
  }
}

}  // namespace
}  // namespace stableflash::attention::cuda
