// The `fused` forward on the GPU against docs/numerics-contract.md's bound: max|O_gpu - O_ref| <= 2 x the naive
// BF16 implementation's error + one BF16 ulp at max|O_ref|, over odd shapes, both layouts,
// Tq != Tk, every shift policy, large logits; fully masked rows give o = 0 and lse = +inf, a row of NaN
// scores NaN as the CPU oracle does.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>
#include <algorithm>

#include "gpu_support.hpp"
#include "plan.hpp"
#include "stableflash/numerics/exact_ops.hpp"

namespace stableflash::attention::gpu_test {
namespace {

struct FwdCase {
  int batch, heads, q_len, k_len, dim;
  bool causal;
  Layout layout;
  ShiftPolicy policy;
  double logit_scale;
};

std::string name_of(const ::testing::TestParamInfo<FwdCase>& info) {
  const FwdCase& c = info.param;
  std::string s = "B" + std::to_string(c.batch) + "H" + std::to_string(c.heads) + "Tq" + std::to_string(c.q_len) + "Tk" +
                  std::to_string(c.k_len) + "D" + std::to_string(c.dim) + (c.causal ? "causal" : "full") + "_" +
                  std::string(to_string(c.layout)) + "_" + std::string(to_string(c.policy)) + "_x" +
                  std::to_string(int(c.logit_scale));
  return s;
}

class FusedForward : public ::testing::TestWithParam<FwdCase> {};

TEST_P(FusedForward, WithinTwiceNaiveBf16Error) {
  SF_REQUIRE_GPU();
  const FwdCase& c = GetParam();
  const AttentionShape s{c.batch, c.heads, c.q_len, c.k_len, c.dim};
  const Inputs in = random_inputs(s, c.layout, 1000 + c.q_len * 7 + c.k_len, c.logit_scale);
  AttentionOptions opt;
  opt.numerics = Numerics::fused, opt.policy = c.policy, opt.causal = c.causal;
  const Outputs g = run_gpu(in, opt, /*backward=*/false);
  const Bounds b = fused_bounds(in, opt, /*backward=*/false);
  std::int64_t nonfinite = 0;
  const double err = max_err(g.o, b.ref_o, &nonfinite);
  EXPECT_EQ(nonfinite, 0);
  EXPECT_LE(err, b.o) << "max|O_gpu - O_ref| vs the bound 2 err_naive + ulp";
  // lse: FP32 log of an FP32 sum; the GPU's exp2 and the FP32 shift m contribute ~2^-21 relative
  // to the logits involved, so allow 2^-18 of max(1, |lse|).
  for (std::size_t r = 0; r < g.lse.size(); ++r) {
    const double ref = b.ref_lse[r];
    if (std::isinf(ref)) {
      ASSERT_TRUE(std::isinf(g.lse[r]) && g.lse[r] > 0) << "row " << r << ": fully masked rows store lse = +inf";
      continue;
    }
    ASSERT_LE(std::fabs(g.lse[r] - ref), std::ldexp(std::max(1.0, std::fabs(ref)), -18)) << "lse of row " << r;
  }
}

std::vector<FwdCase> fused_cases() {
  std::vector<FwdCase> out;
  const auto bhtd = Layout::bhtd, bthd = Layout::bthd;
  const auto standard = ShiftPolicy::standard;
  // odd lengths, causal and not, both head dims
  for (int t : {1, 17, 97, 1000, 1025})
    for (bool causal : {false, true}) out.push_back({1, 2, t, t, 64, causal, bhtd, standard, 1.0});
  for (int t : {17, 1025}) out.push_back({2, 1, t, t, 128, true, bhtd, standard, 1.0});
  out.push_back({1, 1, 4097, 4097, 128, true, bhtd, standard, 1.0});
  out.push_back({1, 1, 4097, 4097, 64, false, bhtd, standard, 1.0});
  // D = 64 causal rows of >= 384 keys on average: the warp-specialized kernel (plan_forward; full
  // attention takes it past 128 keys, as the shapes above do, and causal ones from 1,000 rows on);
  // one consumer on grids as small as these (ws_consumers_for)
  out.push_back({1, 1, 4097, 4097, 64, true, bhtd, standard, 1.0});
  // causal tiles of several consumers end at the sequence's end, the first one partial: 1,025 rows
  // leave 64 rows before row 0 in no consumer's hands; 2 x 8 heads of 17 row blocks (272, past two
  // an SM) take two consumers at D = 128 and three at D = 64
  for (int d : {64, 128}) out.push_back({2, 8, 1025, 1025, d, true, bthd, ShiftPolicy::hashed_offset, 1.0});
  out.push_back({1, 2, 300, 4097, 64, true, bthd, ShiftPolicy::hashed_offset, 1.0});
  out.push_back({2, 1, 2100, 2100, 64, false, bthd, ShiftPolicy::fixed_offset, 5.0});
  // more tiles than an H200 has SMs (132: 140 and 288 tiles): persistent CTAs take several tiles
  // each (causal tiles heaviest first, full ones head by head)
  out.push_back({1, 70, 200, 2048, 64, false, bthd, ShiftPolicy::hashed_offset, 1.0});
  // D = 64 with three consumers (ws_consumers_for: 256 tiles of 192 rows against 384 of 128, 2
  // against 3 rounds on 132 SMs, 3 against 4 on 114); every shorter D = 64 case above runs two
  out.push_back({1, 64, 768, 768, 64, false, bthd, ShiftPolicy::hashed_offset, 1.0});
  out.push_back({2, 16, 1100, 1100, 128, true, bthd, ShiftPolicy::hashed_offset, 1.0});
  // up to 128 keys at D = 128 with two rounds of 128-row tiles or more (280 and 540 tiles on 132
  // SMs): the warp-specialized kernel, one step a tile; the second with rows that see no key
  out.push_back({2, 140, 128, 128, 128, false, bthd, ShiftPolicy::hashed_offset, 1.0});
  out.push_back({1, 270, 200, 97, 128, true, bthd, standard, 1.0});
  // grids too small to fill the SMs with 128-row tiles: one consumer, 64-row tiles (ws_consumers_for;
  // so does {3, 2, 200, 333, 128} below), two steps, so that the sanitizers' cases cover it
  for (int d : {64, 128}) out.push_back({1, 2, 150, 200, d, false, bthd, ShiftPolicy::hashed_offset, 1.0});
  // causal heads whose K/V exceed 32 MB together (72 x 512 KB): sections of 16 heads in L2, the
  // last 8 wide (WsTileOrder); the causal shapes above fit in one section
  out.push_back({1, 72, 1024, 1024, 128, true, bthd, ShiftPolicy::hashed_offset, 1.0});
  // Tq != Tk (bottom-right causal; Tq > Tk leaves fully masked rows), [B, T, H, D]
  out.push_back({2, 3, 97, 300, 64, true, bthd, standard, 1.0});
  out.push_back({2, 3, 300, 97, 128, true, bthd, standard, 1.0});
  out.push_back({1, 2, 300, 97, 64, false, bhtd, standard, 1.0});
  out.push_back({3, 2, 200, 333, 128, false, bthd, standard, 1.0});
  // every policy, both head dims
  for (ShiftPolicy p : {ShiftPolicy::paper, ShiftPolicy::hashed_offset, ShiftPolicy::fixed_offset})
    for (int d : {64, 128}) out.push_back({2, 2, 257, 257, d, true, bhtd, p, 1.0});
  // large logits: x5 and |S| ~ 1e4
  for (ShiftPolicy p : {standard, ShiftPolicy::hashed_offset})
    for (double scale : {5.0, 3000.0}) out.push_back({1, 2, 300, 300, 64, true, bhtd, p, scale});
  out.push_back({1, 2, 300, 300, 128, false, bthd, ShiftPolicy::paper, 5.0});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Shapes, FusedForward, ::testing::ValuesIn(fused_cases()), name_of);

TEST(FusedForwardGpu, FullyMaskedRowsAreZeroWithInfiniteLse) {
  SF_REQUIRE_GPU();
  // causal with Tq = 200 > Tk = 70: query i sees keys j <= i - 130, so rows 0..129 see none
  const AttentionShape s{1, 2, 200, 70, 64};
  const Inputs in = random_inputs(s, Layout::bhtd, 5);
  for (Numerics n : {Numerics::fused, Numerics::paper}) {
    AttentionOptions opt;
    opt.numerics = n, opt.causal = true, opt.delta_source = DeltaSource::compensated;
    const Outputs g = run_gpu(in, opt, /*backward=*/true, /*count_ties=*/true);
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 130; ++i) {
        const std::size_t row = std::size_t(h) * 200 + i;
        EXPECT_EQ(g.lse[row], std::numeric_limits<float>::infinity()) << "row " << row;
        for (int d = 0; d < 64; ++d) {
          EXPECT_EQ(g.o[row * 64 + d].bits, 0) << "o of masked row " << row;
          EXPECT_EQ(g.residual[row * 64 + d].bits, 0) << "residual of masked row " << row;
          EXPECT_EQ(g.dq[row * 64 + d].bits & 0x7fff, 0) << "dq of masked row " << row;
        }
        EXPECT_EQ(g.delta[row], 0.0f);
      }
    EXPECT_EQ(g.ties.masked_rows, 2 * 130);
  }
}

// A query row of NaN makes each of its scores NaN. The CPU oracle's row sum is then NaN, and with
// it the row's O and lse; the GPU must give the same, not take the row for one that saw no key (O =
// 0, lse = +inf), and leave every other row finite.
TEST(FusedForwardGpu, ARowOfNanScoresIsNanAsInTheOracle) {
  SF_REQUIRE_GPU();
  // the warp-specialized kernel (full attention, 1,025 keys) and the one-warpgroup kernel (97)
  for (const AttentionShape& s : {AttentionShape{1, 2, 1025, 1025, 128}, AttentionShape{1, 2, 97, 97, 64}}) {
    Inputs in = random_inputs(s, Layout::bhtd, 11);
    const std::size_t nan_row = std::size_t(s.q_len) + 40;  // head 1, query 40 ([B, H, T, D])
    for (int d = 0; d < s.head_dim; ++d) in.q[nan_row * s.head_dim + d] = bf16::from_float(std::numeric_limits<float>::quiet_NaN());
    AttentionOptions opt;
    opt.numerics = Numerics::fused;
    const Outputs g = run_gpu(in, opt, /*backward=*/false);
    const Outputs c = run_cpu(in, opt, /*backward=*/false);
    ASSERT_TRUE(std::isnan(c.lse[nan_row])) << "the oracle's row of NaN scores";
    std::int64_t lse_differ = 0, o_differ = 0, nan_rows = 0;
    for (std::size_t r = 0; r < c.lse.size(); ++r) {
      nan_rows += std::isnan(g.lse[r]);
      lse_differ += std::isnan(g.lse[r]) != std::isnan(c.lse[r]);
      for (int d = 0; d < s.head_dim; ++d) {
        const std::size_t i = r * s.head_dim + d;
        o_differ += std::isnan(g.o[i].to_float()) != std::isnan(c.o[i].to_float());
      }
    }
    EXPECT_EQ(nan_rows, 1) << "T = " << s.q_len;
    EXPECT_EQ(lse_differ, 0) << "rows whose lse is NaN on one side only, T = " << s.q_len;
    EXPECT_EQ(o_differ, 0) << "o elements NaN on one side only, T = " << s.q_len;
  }
}

// fused, causal, compensated delta (so the forward writes the residual too), with `policy`.
AttentionOptions fused_causal_with_residual(ShiftPolicy policy) {
  AttentionOptions opt;
  opt.numerics = Numerics::fused, opt.policy = policy, opt.causal = true;
  opt.delta_source = DeltaSource::compensated;
  return opt;
}

// Outputs that are 4- but not 16-byte aligned cannot take the epilogue's bulk tensor stores; the
// element-wise stores that replace them must write the same bits, and only the output's elements.
// Covers both forwards of the fast path: the one-warpgroup kernel (D = 64) and the
// warp-specialized one (D = 128), causal with a partial last block.
TEST(FusedForwardGpu, UnalignedOutputsGetTheSameBits) {
  SF_REQUIRE_GPU();
  for (int dim : {64, 128}) {
    const AttentionShape s{2, 3, 300, 300, dim};
    const Inputs in = random_inputs(s, Layout::bhtd, 77 + dim);
    const AttentionOptions opt = fused_causal_with_residual(ShiftPolicy::hashed_offset);
    const Outputs aligned = run_gpu(in, opt, /*backward=*/false);

    const auto nq = std::size_t(s.q_elements()), nk = std::size_t(s.k_elements());
    constexpr std::size_t kShift = 2;  // elements: 4 bytes past a 16-byte boundary
    GuardedBuffer<bf16> q(nq, in.q), k(nk, in.k), v(nk, in.v), o(nq + kShift), r(nq + kShift);
    GuardedBuffer<float> lse(std::size_t(s.rows()));
    const std::vector<bf16> before = o.download();
    ForwardArgs fa;
    fa.shape = s, fa.layout = in.layout, fa.q = q.get(), fa.k = k.get(), fa.v = v.get();
    fa.o = o.get() + kShift, fa.o_residual = r.get() + kShift, fa.lse = lse.get();
    AttentionOptions gpu = opt;
    gpu.device = Device::cuda;
    attention_forward(fa, gpu);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<bf16> got = o.download(), got_r = r.download();
    EXPECT_TRUE(o.intact(false) && r.intact(false)) << "guards around the shifted outputs";
    for (std::size_t i = 0; i < kShift; ++i) EXPECT_EQ(got[i].bits, before[i].bits) << "element before the output";
    std::int64_t differing = 0;
    for (std::size_t i = 0; i < nq; ++i)
      differing += (got[i + kShift].bits != aligned.o[i].bits) + (got_r[i + kShift].bits != aligned.residual[i].bits);
    EXPECT_EQ(differing, 0) << "D = " << dim << ": element-wise vs bulk-stored outputs";
  }
}

// How many of head bh's forward outputs (o, residual, lse) in `all`, the run of the multi-head
// [B, H, T, D] inputs `in`, differ from those of the same head run alone.
std::int64_t outputs_differing_from_alone(const Inputs& in, const Outputs& all, const AttentionOptions& opt, int bh) {
  const AttentionShape& s = in.shape;
  EXPECT_EQ(in.layout, Layout::bhtd) << "heads sliced as contiguous [T, D] blocks";
  const std::size_t q_head = std::size_t(s.q_len) * s.head_dim, kv_head = std::size_t(s.k_len) * s.head_dim;
  const auto slice = [&](const std::vector<bf16>& x, std::size_t n) { return std::vector<bf16>(x.begin() + bh * n, x.begin() + (bh + 1) * n); };
  Inputs one;
  one.shape = AttentionShape{1, 1, s.q_len, s.k_len, s.head_dim};
  one.layout = Layout::bhtd;
  one.q = slice(in.q, q_head), one.k = slice(in.k, kv_head), one.v = slice(in.v, kv_head), one.d_o = slice(in.d_o, q_head);
  const Outputs alone = run_gpu(one, opt, /*backward=*/false);
  std::int64_t differing = 0;
  for (std::size_t i = 0; i < q_head; ++i)
    differing += (alone.o[i].bits != all.o[bh * q_head + i].bits) + (alone.residual[i].bits != all.residual[bh * q_head + i].bits);
  for (int r = 0; r < s.q_len; ++r) differing += alone.lse[r] != all.lse[std::size_t(bh) * s.q_len + r];
  return differing;
}

// Every (b, h) is computed alone, so its outputs must not depend on the rest of the batch: a few
// heads of a 140-head batch (420 tiles of 128 rows at D = 128, more CTAs than SMs, several waves)
// must equal, bit for bit, the same heads run alone. Guards any state carried between a CTA's
// tiles or shared between CTAs (a persistent grid, a tile scheduler), and at D = 128 the plan's
// choice of consumers: alone, the head's 5 row blocks take the one-consumer build (64-row tiles
// spread over the SMs, ws_consumers_for), in the batch the two-consumer one, which must compute
// every row the same way.
TEST(FusedForwardGpu, EveryHeadGetsTheBitsItGetsAlone) {
  SF_REQUIRE_GPU();
  for (int dim : {64, 128}) {
    const AttentionShape s{2, 70, 300, 300, dim};
    const Inputs in = random_inputs(s, Layout::bhtd, 91 + dim);
    // standard: hashed_offset's shift depends on the row's (b, h), which differ when run alone
    const AttentionOptions opt = fused_causal_with_residual(ShiftPolicy::standard);
    const Outputs all = run_gpu(in, opt, /*backward=*/false);
    for (int bh : {0, 1, 69, 70, 101, 139}) {  // both batches, first and last heads
      EXPECT_EQ(outputs_differing_from_alone(in, all, opt, bh), 0) << "D = " << dim << ", (b, h) #" << bh << ": outputs in the batch vs alone";
    }
  }
}

// Full attention's last round as pieces (ws_tail_for, tail_pieces.hpp): a row walks the same steps
// in an item as in a tile, so the heads whose last tiles the split takes must get the bits they get
// alone (a head alone: the one-consumer build), every output element written (run_gpu's guards). The
// shapes are this device's: the fewest heads of 1,100 rows whose grid splits in items of one block
// (both head dims) and of two (three consumers at D = 64; 18 blocks a head, so no head ends in a
// lone one).
TEST(FusedForwardGpu, SplitLastRoundGivesEveryRowItsBitsAlone) {
  SF_REQUIRE_GPU();
  AttentionOptions opt = fused_causal_with_residual(ShiftPolicy::standard);
  opt.causal = false;
  for (const auto& [dim, group] : {std::pair{64, 1}, std::pair{64, 2}, std::pair{128, 1}}) {
    AttentionShape s{};
    cuda::ForwardPlan plan;
    for (int h = 1; h <= 400 && plan.ws_tail.group != group; ++h) plan = plan_on_this_device(s = AttentionShape{1, h, 1100, 1100, dim}, opt);
    ASSERT_EQ(plan.ws_tail.group, group) << "no grid of up to 400 heads splits in items of " << group << " at D = " << dim << " on "
                                         << plan.sms << " SMs";
    const cuda::WsTailSplit split = plan.ws_tail;
    const int head_tiles = (s.q_len + 64 * plan.ws_consumers - 1) / (64 * plan.ws_consumers);
    const Inputs in = random_inputs(s, Layout::bhtd, 7100 + dim + group);
    const Outputs all = run_gpu(in, opt, /*backward=*/false);
    const int split_heads = (split.tiles + head_tiles - 1) / head_tiles;  // the schedule's last tiles: the last heads'
    std::vector<int> checked{0};  // and the head before them, which no split touches
    for (int h = std::max(1, s.heads - split_heads - 1); h < s.heads; ++h) checked.push_back(h);
    for (int h : checked) {
      EXPECT_EQ(outputs_differing_from_alone(in, all, opt, h), 0) << "D = " << dim << ", " << s.heads << " heads (" << split.tiles
                                                                  << " tiles split in items of " << group << "), head " << h
                                                                  << ": outputs in the batch vs alone";
    }
  }
}

// Heads whose last tile holds one 64-row block, paired two heads a tile (ws_lone_pairs_for: consumer 1
// on the second head's rows with K/V of its own): every row walks the same steps as alone, so the
// paired heads, an odd last head alone in its tile and a head of the whole tiles must get the bits
// they get alone (a head alone: the one-consumer build), every output element written (run_gpu's
// guards). The shape is this device's: the fewest odd heads of 1,000 rows (16 blocks: 5 whole tiles
// and a lone block a head) that pair with two rounds of whole tiles or more, so that CTAs walk paired tiles
// between whole ones, the rings' positions carried across them (53 heads on 132 SMs:
// LaunchPlan.LoneLastBlocksArePairedAcrossHeads).
TEST(FusedForwardGpu, PairedLoneBlocksGiveEveryHeadItsBitsAlone) {
  SF_REQUIRE_GPU();
  AttentionOptions opt = fused_causal_with_residual(ShiftPolicy::standard);
  opt.causal = false;
  AttentionShape s{};
  bool paired = false;
  int sms = 0;
  for (int h = 3; h <= 401 && !paired; h += 2) {
    const cuda::ForwardPlan plan = plan_on_this_device(s = AttentionShape{1, h, 1000, 1000, 64}, opt);
    sms = plan.sms;
    paired = plan.ws_lone_pairs && 5 * h >= 2 * sms;  // two rounds of whole tiles or more
  }
  ASSERT_TRUE(paired) << "no grid of up to 401 heads of 1,000 rows pairs its lone blocks on " << sms << " SMs";
  const Inputs in = random_inputs(s, Layout::bhtd, 7300);
  const Outputs all = run_gpu(in, opt, /*backward=*/false);
  for (int h : {0, 1, 2, 3, s.heads / 2, s.heads - 2, s.heads - 1}) {  // pairs (0, 1), (2, 3), ...; the last head alone
    EXPECT_EQ(outputs_differing_from_alone(in, all, opt, h), 0) << s.heads << " heads of 1,000 rows, lone blocks paired, head " << h
                                                                << ": outputs in the batch vs alone";
  }
}

// The warp-specialized forward's dynamic tile schedule takes its counters in turn from 256 pairs
// per device, and each launch's last CTA zeroes its pair again (next_tile_counters): 300 launches
// reuse pairs, and each must still compute every tile (fresh poisoned outputs, every element
// written, bit for bit the first launch's).
TEST(FusedForwardGpu, EveryLaunchOfTheTileScheduleComputesEveryTile) {
  SF_REQUIRE_GPU();
  const AttentionShape s{1, 140, 256, 256, 128};  // 280 tiles of 128 rows, more than SMs
  const Inputs in = random_inputs(s, Layout::bhtd, 5150);
  AttentionOptions opt = fused_causal_with_residual(ShiftPolicy::standard);
  opt.device = Device::cuda;
  const auto nq = std::size_t(s.q_elements()), nk = std::size_t(s.k_elements());
  GuardedBuffer<bf16> q(nq, in.q), k(nk, in.k), v(nk, in.v);
  std::vector<bf16> first;
  for (int launch = 0; launch < 300; ++launch) {
    GuardedBuffer<bf16> o(nq), r(nq);
    GuardedBuffer<float> lse(std::size_t(s.rows()));
    ForwardArgs fa;
    fa.shape = s, fa.layout = in.layout, fa.q = q.get(), fa.k = k.get(), fa.v = v.get();
    fa.o = o.get(), fa.o_residual = r.get(), fa.lse = lse.get();
    attention_forward(fa, opt);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_TRUE(o.intact(true)) << "launch " << launch << ": every output element written";
    const std::vector<bf16> got = o.download();
    if (launch == 0) {
      first = got;
      continue;
    }
    std::int64_t differing = 0;
    for (std::size_t i = 0; i < nq; ++i) differing += got[i].bits != first[i].bits;
    ASSERT_EQ(differing, 0) << "launch " << launch << " vs the first";
  }
}

TEST(FusedForwardGpu, RoundBitsRoundTheOutput) {
  SF_REQUIRE_GPU();
  const AttentionShape s{1, 2, 150, 150, 64};
  const Inputs in = random_inputs(s, Layout::bhtd, 6);
  for (int bits : {2, 3, 6}) {
    AttentionOptions opt;
    opt.round_bits = bits, opt.delta_source = DeltaSource::compensated;
    const Outputs g = run_gpu(in, opt, /*backward=*/false);
    for (const bf16& x : g.o) ASSERT_EQ(round_to_bits_rne(x.to_float(), bits), x.to_float()) << "bits " << bits;
    // O + r recovers the unrounded output: |r| <= half an ulp at `bits`
    for (std::size_t i = 0; i < g.o.size(); ++i) {
      const float o = g.o[i].to_float(), r = g.residual[i].to_float();
      if (o == 0.0f) continue;
      ASSERT_LE(std::fabs(r), std::ldexp(std::fabs(o), -bits) * 1.0001) << "element " << i;
    }
  }
}

// Rows whose two largest scores are exactly equal (keys 0 and 1 identical and aligned with every
// query) count as repeated maxima and, with the standard shift, as tie events; the GPU counts as
// the CPU does.
TEST(FusedForwardGpu, EventCountersMatchTheCpu) {
  SF_REQUIRE_GPU();
  const AttentionShape s{1, 2, 128, 256, 64};
  Inputs in = exact_dot_inputs(s, Layout::bhtd, 8);
  for (int h = 0; h < 2; ++h) {
    for (int d = 0; d < 64; ++d) {
      const bf16 x = bf16::from_float(d == 0 ? 1.0f : 0.0f);
      in.k[(std::size_t(h) * 256 + 0) * 64 + d] = x;
      in.k[(std::size_t(h) * 256 + 1) * 64 + d] = x;
    }
    for (int i = 0; i < 128; ++i) in.q[(std::size_t(h) * 128 + i) * 64] = bf16::from_float(i % 3 == 0 ? 1.0f : 8.0f);
  }
  for (Numerics n : {Numerics::fused, Numerics::paper})
    for (ShiftPolicy p : {ShiftPolicy::standard, ShiftPolicy::paper, ShiftPolicy::hashed_offset}) {
      AttentionOptions opt;
      opt.numerics = n, opt.policy = p, opt.tile_k = 128;
      const Outputs g = run_gpu(in, opt, false, true), c = run_cpu(in, opt, false);
      EXPECT_EQ(g.ties.rows, c.ties.rows);
      EXPECT_EQ(g.ties.repeated_max_rows, c.ties.repeated_max_rows) << to_string(n) << " " << to_string(p);
      EXPECT_EQ(g.ties.tie_event_rows, c.ties.tie_event_rows) << to_string(n) << " " << to_string(p);
      EXPECT_EQ(g.ties.fallback_rows, c.ties.fallback_rows) << to_string(n) << " " << to_string(p);
      EXPECT_GT(c.ties.repeated_max_rows, 0) << "the input must contain repeated maxima";
    }
}

TEST(FusedForwardGpu, RejectsWhatItCannotRun) {
  SF_REQUIRE_GPU();
  const AttentionShape s{1, 1, 64, 64, 96};
  AttentionOptions opt;
  opt.device = Device::cuda;
  EXPECT_THROW(cuda::check_supported(s, opt), std::invalid_argument) << "head_dim 96 has no kernel";
  opt.tile_k = 100;
  EXPECT_THROW(cuda::check_supported({1, 1, 64, 64, 64}, opt), std::invalid_argument) << "tile must be a multiple of 64";
  opt.tile_k = 0;
  AttentionShape gqa{2, 8, 64, 64, 64};
  gqa.kv_heads = 2;  // grouped-query heads run (grouped_query_gpu_test.cpp)
  EXPECT_NO_THROW(cuda::check_supported(gqa, opt));
  gqa.kv_heads = 3;  // does not divide 8: AttentionOptions::validate names both fields
  try {
    cuda::check_supported(gqa, opt);
    ADD_FAILURE() << "kv_heads 3 of heads 8 accepted on the GPU";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("kv_heads (3) must divide heads (8)"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace stableflash::attention::gpu_test
