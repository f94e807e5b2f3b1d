// The `fused` backward on the GPU against docs/numerics-contract.md's bound (3 x the naive BF16 gradients' error
// + one BF16 ulp at max|reference|), bitwise determinism of the deterministic mode, a caller's
// workspace that holds garbage, and the three delta sources against the CPU's.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <string>

#include "gpu_support.hpp"
#include "launch.hpp"  // cuda::multiprocessors
#include "plan.hpp"    // cuda::kBackwardBlockK, cuda::plan_backward

namespace stableflash::attention::gpu_test {
namespace {

struct BwdCase {
  int batch, heads, q_len, k_len, dim;
  bool causal;
  Layout layout;
  DeltaSource delta_source;
  bool deterministic;
  double logit_scale;
};

std::string name_of(const ::testing::TestParamInfo<BwdCase>& info) {
  const BwdCase& c = info.param;
  return "B" + std::to_string(c.batch) + "H" + std::to_string(c.heads) + "Tq" + std::to_string(c.q_len) + "Tk" +
         std::to_string(c.k_len) + "D" + std::to_string(c.dim) + (c.causal ? "causal" : "full") + "_" +
         std::string(to_string(c.layout)) + "_" + std::string(to_string(c.delta_source)) + (c.deterministic ? "_det" : "") +
         "_x" + std::to_string(int(c.logit_scale));
}

class FusedBackward : public ::testing::TestWithParam<BwdCase> {};

TEST_P(FusedBackward, WithinThreeTimesNaiveBf16Error) {
  SF_REQUIRE_GPU();
  const BwdCase& c = GetParam();
  const AttentionShape s{c.batch, c.heads, c.q_len, c.k_len, c.dim};
  const Inputs in = random_inputs(s, c.layout, 2000 + c.q_len * 3 + c.k_len, c.logit_scale);
  AttentionOptions opt;
  opt.causal = c.causal, opt.delta_source = c.delta_source, opt.deterministic = c.deterministic;
  const Outputs g = run_gpu(in, opt, /*backward=*/true);
  const Bounds b = fused_bounds(in, opt, /*backward=*/true);
  std::int64_t nonfinite = 0;
  EXPECT_LE(max_err(g.o, b.ref_o, &nonfinite), b.o) << "o";
  EXPECT_LE(max_err(g.dq, b.ref_dq, &nonfinite), b.dq) << "dq";
  EXPECT_LE(max_err(g.dk, b.ref_dk, &nonfinite), b.dk) << "dk";
  EXPECT_LE(max_err(g.dv, b.ref_dv, &nonfinite), b.dv) << "dv";
  EXPECT_EQ(nonfinite, 0);
}

std::vector<BwdCase> backward_cases() {
  std::vector<BwdCase> out;
  const auto bhtd = Layout::bhtd, bthd = Layout::bthd;
  const auto rounded = DeltaSource::rounded;
  for (int t : {1, 17, 97, 1000, 1025})
    for (bool causal : {false, true}) out.push_back({1, 2, t, t, 64, causal, bhtd, rounded, false, 1.0});
  for (int t : {97, 1025}) out.push_back({2, 1, t, t, 128, true, bthd, rounded, false, 1.0});
  out.push_back({1, 1, 4097, 4097, 128, true, bhtd, rounded, false, 1.0});
  out.push_back({2, 3, 97, 300, 64, true, bthd, DeltaSource::compensated, false, 1.0});
  out.push_back({2, 3, 300, 97, 128, true, bhtd, DeltaSource::exact, false, 1.0});
  out.push_back({1, 2, 200, 333, 64, false, bhtd, DeltaSource::exact, true, 1.0});
  out.push_back({2, 3, 200, 77, 64, true, bthd, DeltaSource::exact, false, 1.0});  // Tq > Tk: rows without keys
  // exact at D = 128 over many K/V tiles (the pass refills its two slots: 1,000 and 700 keys)
  out.push_back({1, 2, 200, 1000, 128, false, bthd, DeltaSource::exact, false, 1.0});
  out.push_back({1, 2, 700, 700, 128, true, bhtd, DeltaSource::exact, true, 1.0});
  out.push_back({1, 2, 513, 513, 128, false, bthd, DeltaSource::compensated, true, 1.0});
  out.push_back({1, 2, 300, 300, 64, true, bhtd, rounded, false, 5.0});
  out.push_back({1, 2, 300, 300, 128, true, bhtd, DeltaSource::compensated, false, 3000.0});
  // Full attention with more items (pairs x 128-key blocks) than an H100's or H200's 132 SMs: at
  // D = 128 the persistent grid (BackwardPlan::main_ctas), each CTA taking two or three items, so the
  // slots' and dS^T buffers' rings, the K/V reloads and the dQ hand-over run on from one item to the
  // next; at D = 64 (a CTA per item) the same shape as the contrast; five query blocks a walk (odd:
  // at D = 64 the consumers alternate blocks), both modes
  out.push_back({2, 50, 300, 300, 64, false, bhtd, DeltaSource::compensated, false, 1.0});
  out.push_back({1, 100, 260, 260, 128, false, bthd, DeltaSource::compensated, false, 1.0});
  out.push_back({2, 50, 300, 300, 128, false, bhtd, rounded, true, 1.0});
  // ... with Tq != Tk: a one-block walk (both consumers' stagger and dQ hand-over each item), and
  // eleven blocks over two key blocks (200 items)
  out.push_back({1, 100, 64, 300, 128, false, bthd, DeltaSource::compensated, false, 1.0});
  out.push_back({1, 100, 700, 200, 128, false, bhtd, DeltaSource::compensated, false, 1.0});
  // Small grids at head dim 128 take 64-key CTAs (BackwardPlan::key_groups), as
  // the D = 128 cases above do outside deterministic mode; these with a partial last key block and
  // Tq < Tk causal, walks of three query blocks (the slots reused) and of two (in the sanitizers'
  // set: racecheck reports the slots' hand-over by one lane a warp as a race, docs/benchmarks.md).
  // 128-key CTAs at D = 128 outside deterministic mode, causal (the first block left out on the
  // diagonal by consumer 1): a grid of more than one 64-key CTA an SM.
  out.push_back({1, 2, 190, 260, 128, true, bhtd, DeltaSource::compensated, false, 1.0});
  out.push_back({1, 2, 128, 260, 128, true, bthd, DeltaSource::compensated, false, 1.0});
  out.push_back({2, 40, 300, 300, 128, true, bhtd, DeltaSource::compensated, false, 1.0});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Shapes, FusedBackward, ::testing::ValuesIn(backward_cases()), name_of);

TEST(BackwardGpu, DeterministicModeIsBitwiseReproducibleOver50Runs) {
  SF_REQUIRE_GPU();
  const AttentionShape s{2, 4, 1000, 1000, 64};
  const Inputs in = random_inputs(s, Layout::bhtd, 77);
  for (Numerics n : {Numerics::fused, Numerics::paper}) {
    AttentionOptions opt;
    opt.numerics = n, opt.causal = true, opt.deterministic = true;
    EXPECT_EQ(runs_differing_from_first(in, opt, 50), 0) << to_string(n) << ": runs whose outputs differ from the first";
  }
}

// Deterministic mode on the persistent grid (full attention, 300 items on 132 SMs or so; D = 128,
// with D = 64's CTA per item beside it): a CTA's later items wait on key blocks that other CTAs took
// in earlier rounds, never on a later one
TEST(BackwardGpu, DeterministicModeOnThePersistentGridIsBitwiseReproducible) {
  SF_REQUIRE_GPU();
  for (int dim : {64, 128}) {
    const AttentionShape s{2, 50, 300, 300, dim};
    const Inputs in = random_inputs(s, Layout::bhtd, 78 + dim);
    AttentionOptions opt;
    opt.deterministic = true;
    EXPECT_EQ(runs_differing_from_first(in, opt, 10), 0) << "D " << dim << ": runs whose outputs differ from the first";
  }
}

// One key block with the exact delta (DeltaPass::in_main): the main kernel forms delta in a fixed
// order and stores dQ itself, so delta and every gradient are the same bits run after run, in the
// default (not deterministic) mode, both numerics and head dims, causal with Tq > Tk (rows without keys).
TEST(BackwardGpu, ExactDeltaOfOneKeyBlockIsBitwiseReproducible) {
  SF_REQUIRE_GPU();
  for (const AttentionShape& s : {AttentionShape{2, 3, 128, 128, 128}, AttentionShape{2, 3, 150, 100, 64}})
    for (Numerics n : {Numerics::fused, Numerics::paper}) {
      SCOPED_TRACE("D " + std::to_string(s.head_dim) + " " + std::string(to_string(n)));
      const Inputs in = random_inputs(s, Layout::bhtd, 4400 + s.head_dim);
      AttentionOptions opt;
      opt.numerics = n, opt.causal = true, opt.delta_source = DeltaSource::exact;
      EXPECT_EQ(runs_differing_from_first(in, opt, 10), 0) << "runs whose outputs differ from the first";
    }
}

// delta_source auto (the recommended attention's) resolves per call on the GPU as on the CPU: the
// bits of the source it names (exact up to one key block in fused numerics, compensated above it and
// in paper numerics), the forward's residual written only where that source reads it.
TEST(BackwardGpu, AutoGivesTheBitsOfTheSourceItResolvesTo) {
  SF_REQUIRE_GPU();
  for (const AttentionShape& s : {AttentionShape{2, 3, 150, 100, 64}, AttentionShape{1, 2, 128, 128, 128},
                                  AttentionShape{1, 2, 200, 129, 64}, AttentionShape{1, 2, 300, 300, 128}})
    for (Numerics n : {Numerics::fused, Numerics::paper}) {
      AttentionOptions automatic;
      automatic.numerics = n, automatic.causal = true, automatic.deterministic = true;
      automatic.delta_source = DeltaSource::automatic;
      AttentionOptions named = automatic;
      named.delta_source = automatic.resolved_delta_source(s);
      SCOPED_TRACE("Tk " + std::to_string(s.k_len) + " D " + std::to_string(s.head_dim) + " " + std::string(to_string(n)) + " -> " +
                   std::string(to_string(named.delta_source)));
      const Inputs in = random_inputs(s, Layout::bhtd, 4500 + s.k_len);
      const Outputs a = run_gpu(in, automatic, /*backward=*/true), b = run_gpu(in, named, /*backward=*/true);
      EXPECT_EQ(a.residual.size(), b.residual.size());
      EXPECT_TRUE(same_bits(a.o, b.o) && same_bits(a.lse, b.lse) && same_bits(a.residual, b.residual)) << "forward";
      EXPECT_TRUE(same_bits(a.delta, b.delta)) << "delta";
      EXPECT_TRUE(same_bits(a.dq, b.dq) && same_bits(a.dk, b.dk) && same_bits(a.dv, b.dv)) << "gradients";
    }
}

// The 64-key groups per CTA the plan gives a backward of `s` on this device (plan_backward with the
// device's SM count, as attention_backward asks it).
int key_groups_of(const AttentionShape& s, const AttentionOptions& opt) {
  BackwardArgs a;
  a.shape = s;
  return cuda::plan_backward(a, opt.for_shape(s), /*with_gradients=*/true, cuda::multiprocessors()).key_groups;
}

// A head's dK and dV do not depend on its batch: alone (a small grid, head dim 128) its CTAs take 64
// keys, both consumers on the same keys with half the dims each; in a batch of 140 heads a CTA takes
// 128 keys, a consumer's 64 with all dims. Each dK, dV element sums the same products over the same
// query blocks in the same order either way. dQ adds the two 64-key halves of a key block
// separately then (its bits depend on the arrival order of key blocks anyway): checked against the
// bound. Causal and full, a partial last key block.
TEST(BackwardGpu, KeyGradientsOfAHeadAreTheBitsItGetsAlone) {
  SF_REQUIRE_GPU();
  const int dim = 128;
  for (bool causal : {true, false}) {
    const AttentionShape s{2, 70, 300, 300, dim};
    const Inputs in = random_inputs(s, Layout::bhtd, 4400 + dim + causal);
    AttentionOptions opt;
    opt.causal = causal, opt.delta_source = DeltaSource::compensated;
    const std::string name = causal ? "causal" : "full";
    const AttentionShape alone_shape{1, 1, s.q_len, s.k_len, dim};
    ASSERT_EQ(key_groups_of(s, opt), 2) << name << ": the batch's plan";
    ASSERT_EQ(key_groups_of(alone_shape, opt), 1) << name << ": one head's plan";
    const Outputs all = run_gpu(in, opt, /*backward=*/true);
    const std::size_t head = std::size_t(s.q_len) * dim;
    for (int bh : {0, 69, 70, 139}) {  // both batches, first and last heads
      Inputs one;
      one.shape = alone_shape, one.layout = Layout::bhtd;
      const auto slice = [&](const std::vector<bf16>& x) { return std::vector<bf16>(x.begin() + bh * head, x.begin() + (bh + 1) * head); };
      one.q = slice(in.q), one.k = slice(in.k), one.v = slice(in.v), one.d_o = slice(in.d_o);
      const Outputs alone = run_gpu(one, opt, /*backward=*/true);
      ASSERT_TRUE(same_bits(alone.o, slice(all.o))) << name << ", (b, h) #" << bh << ": the forward's o (FusedForwardGpu)";
      EXPECT_TRUE(same_bits(alone.dk, slice(all.dk))) << name << ", (b, h) #" << bh << ": dk alone vs in the batch";
      EXPECT_TRUE(same_bits(alone.dv, slice(all.dv))) << name << ", (b, h) #" << bh << ": dv alone vs in the batch";
      const Bounds b = fused_bounds(one, opt, /*backward=*/true);
      std::int64_t nonfinite = 0;
      EXPECT_LE(max_err(alone.dq, b.ref_dq, &nonfinite), b.dq) << name << ", (b, h) #" << bh << ": dq alone";
      EXPECT_EQ(nonfinite, 0) << name;
    }
  }
}

// A caller's workspace (BackwardArgs::workspace) need not be zero: the backward clears the dQ tile
// claims and the turn counters itself (the δ pass, from the output or the exact one, clears them
// beside its own work), and never reads an accumulator tile before its first key block
// stored it (a tile no key block reaches, causal with Tq > Tk, converts to 0). A workspace of 0xff
// bytes (NaN floats; turn counters and claims of -1, which a missed clear would leave deterministic
// mode waiting on forever, so the suite's timeout fails it) must give the gradients of a call on a
// fresh pool allocation: dK, dV and deterministic
// dQ bit for bit; non-deterministic dQ (its FP32 parts added in arrival order, so its last bits vary
// between runs) within the fused bound of the FP64 reference. Twice on the same workspace, so the
// second call also starts from what the first left.
TEST(BackwardGpu, WorkspaceNeedNotBeZero) {
  SF_REQUIRE_GPU();
  struct Case {
    AttentionShape shape;
    bool causal, deterministic;
    DeltaSource delta;
  };
  const Case cases[] = {{{2, 3, 300, 97, 64}, true, false, DeltaSource::compensated},
                        {{1, 2, 97, 300, 128}, true, true, DeltaSource::compensated},
                        {{1, 2, 200, 333, 64}, false, false, DeltaSource::rounded},
                        {{2, 2, 130, 130, 128}, true, false, DeltaSource::exact},
                        {{2, 2, 600, 300, 64}, true, false, DeltaSource::compensated},
                        {{1, 2, 600, 300, 128}, true, true, DeltaSource::rounded},
                        // the exact pass clears the counters too: several key blocks, both modes
                        {{1, 2, 300, 600, 64}, true, true, DeltaSource::exact},
                        {{1, 2, 257, 400, 128}, false, false, DeltaSource::exact}};
  for (const Case& c : cases) {
    const AttentionShape& s = c.shape;
    const std::string name = std::to_string(s.q_len) + "x" + std::to_string(s.k_len) + " D" + std::to_string(s.head_dim) +
                             (c.causal ? " causal " : " full ") + std::string(to_string(c.delta)) + (c.deterministic ? " det" : "");
    const Inputs in = random_inputs(s, Layout::bhtd, 8100 + s.q_len + s.head_dim);
    AttentionOptions opt;
    opt.causal = c.causal, opt.deterministic = c.deterministic, opt.delta_source = c.delta;
    const Outputs fresh = run_gpu(in, opt, /*backward=*/true);
    const Bounds bounds = fused_bounds(in, opt, /*backward=*/true);
    opt.device = Device::cuda;
    const auto nq = in.q.size(), nk = in.k.size();
    const BackwardInputsOnDevice dev(in, fresh);
    BackwardArgs ba = dev.args();
    ASSERT_EQ(ba.o_residual != nullptr, c.delta == DeltaSource::compensated) << name;
    const std::size_t bytes = cuda::backward_workspace_bytes(ba, opt);
    void* workspace = nullptr;
    ASSERT_EQ(cudaMalloc(&workspace, bytes), cudaSuccess);
    ASSERT_EQ(cudaMemset(workspace, 0xff, bytes), cudaSuccess);
    ba.workspace = workspace, ba.workspace_bytes = bytes;
    for (int call = 0; call < 2; ++call) {
      GuardedBuffer<bf16> dq(nq), dk(nk), dv(nk);
      ba.dq = dq.get(), ba.dk = dk.get(), ba.dv = dv.get();
      attention_backward(ba, opt);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << name;
      EXPECT_TRUE(dq.intact(true) && dk.intact(true) && dv.intact(true)) << name << ", call " << call;
      const std::vector<bf16> dq_h = dq.download(), dk_h = dk.download(), dv_h = dv.download();
      EXPECT_EQ(std::memcmp(dk_h.data(), fresh.dk.data(), nk * sizeof(bf16)), 0) << name << ", call " << call << ": dk";
      EXPECT_EQ(std::memcmp(dv_h.data(), fresh.dv.data(), nk * sizeof(bf16)), 0) << name << ", call " << call << ": dv";
      if (c.deterministic) {
        EXPECT_EQ(std::memcmp(dq_h.data(), fresh.dq.data(), nq * sizeof(bf16)), 0) << name << ", call " << call << ": dq";
      } else {
        std::int64_t nonfinite = 0;
        EXPECT_LE(max_err(dq_h, bounds.ref_dq, &nonfinite), bounds.dq) << name << ", call " << call << ": dq";
        EXPECT_EQ(nonfinite, 0) << name << ", call " << call << ": dq";
      }
    }
    cudaFree(workspace);
  }
}

// The GPU's delta for each source equals the CPU's on the same O (and residual): the CPU sums
// exactly and rounds once, the GPU sums in FP32, so they agree to 2^-16 of sum|dO * O| (far below
// the compensation's own effect, which is at O's BF16 rounding, 2^-9). Several key blocks (the
// exact pass) and one (the exact delta formed inside the main kernel, DeltaPass::in_main), there
// with Tq > Tk causal at both head dims: rows without keys (delta 0), a first query block the main
// kernel never walks.
TEST(BackwardGpu, DeltaSourcesMatchTheCpu) {
  SF_REQUIRE_GPU();
  for (const AttentionShape& s : {AttentionShape{1, 3, 257, 257, 128}, AttentionShape{1, 3, 200, 77, 64}, AttentionShape{1, 3, 190, 120, 128}})
    for (Numerics n : {Numerics::fused, Numerics::paper})
    for (DeltaSource src : {DeltaSource::rounded, DeltaSource::compensated, DeltaSource::exact}) {
      SCOPED_TRACE("D " + std::to_string(s.head_dim) + " Tq " + std::to_string(s.q_len) + " Tk " + std::to_string(s.k_len));
      const Inputs in = random_inputs(s, Layout::bthd, 99 + s.k_len);
      AttentionOptions opt;
      opt.numerics = n, opt.delta_source = src, opt.causal = true;
      const Outputs g = run_gpu(in, opt, true);
      // the CPU's delta on the GPU's forward outputs
      std::vector<float> cpu_delta(g.delta.size());
      BackwardArgs ba;
      ba.shape = s, ba.layout = in.layout, ba.q = in.q.data(), ba.k = in.k.data(), ba.v = in.v.data();
      ba.o = g.o.data(), ba.lse = g.lse.data(), ba.o_residual = g.residual.empty() ? nullptr : g.residual.data();
      ba.d_o = in.d_o.data();
      AttentionOptions cpu = opt;
      cpu.device = Device::cpu;
      attention_delta(ba, cpu, cpu_delta.data());
      const HeadStrides st = HeadStrides::of(in.layout, s.heads, s.q_len, s.head_dim);
      for (int h = 0; h < s.heads; ++h)
        for (int i = 0; i < s.q_len; ++i) {
          double mag = 0.0;
          for (int d = 0; d < s.head_dim; ++d)
            mag += std::fabs(double(in.d_o[st.at(0, h, i) + d].to_float()) * g.o[st.at(0, h, i) + d].to_float());
          const std::size_t row = std::size_t(h) * s.q_len + i;
          // paper rounds the rounded-source delta to BF16: a different FP32 sum may round the other way
          const double tol = (n == Numerics::paper && src == DeltaSource::rounded)
                                 ? std::ldexp(std::fabs(double(cpu_delta[row])), -8) + std::ldexp(mag, -16)
                                 : std::ldexp(mag, -16) + (src == DeltaSource::exact ? std::ldexp(std::fabs(double(cpu_delta[row])), -12) : 0.0);
          ASSERT_LE(std::fabs(double(g.delta[row]) - cpu_delta[row]), tol)
              << to_string(n) << " " << to_string(src) << " row " << row;
        }
    }
}

// attention_delta alone on the GPU (its own launch of the delta pass, with the tensor maps the exact
// pass reads) writes the same bits as the backward's delta on the same forward outputs, for every
// source and numerics; Tq != Tk causal in both directions, [B, T, H, D] tensors. That includes the
// exact delta of one key block (Tk <= 128), which the backward forms inside its main kernel from its
// transposed products (K Q^T, V dO^T; DeltaPass::in_main) and the pass from Q K^T and dO V^T, both
// in exact_delta_order.cuh's order: the same products of the same operands, so the same bits.
TEST(BackwardGpu, DeltaAloneEqualsTheBackwardsDeltaBitForBit) {
  SF_REQUIRE_GPU();
  for (const AttentionShape& s : {AttentionShape{1, 3, 200, 77, 64}, AttentionShape{2, 2, 97, 300, 128}, AttentionShape{2, 2, 97, 120, 128}})
    for (Numerics n : {Numerics::fused, Numerics::paper})
      for (DeltaSource src : {DeltaSource::rounded, DeltaSource::compensated, DeltaSource::exact}) {
        SCOPED_TRACE("D " + std::to_string(s.head_dim) + " Tq " + std::to_string(s.q_len) + " Tk " + std::to_string(s.k_len) + " " +
                     std::string(to_string(n)) + " " + std::string(to_string(src)));
        const Inputs in = random_inputs(s, Layout::bthd, 310 + s.q_len);
        AttentionOptions opt;
        opt.numerics = n, opt.delta_source = src, opt.causal = true;
        const Outputs g = run_gpu(in, opt, /*backward=*/true);
        const BackwardInputsOnDevice dev(in, g);
        const BackwardArgs ba = dev.args();
        ASSERT_EQ(ba.o_residual != nullptr, src == DeltaSource::compensated);
        GuardedBuffer<float> delta(g.delta.size());
        opt.device = Device::cuda;
        attention_delta(ba, opt, delta.get());
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        EXPECT_TRUE(delta.intact(true)) << "delta";
        const std::vector<float> alone = delta.download();
        ASSERT_EQ(alone.size(), g.delta.size());
        std::size_t differing = 0, first = alone.size();
        for (std::size_t row = 0; row < alone.size(); ++row)
          if (std::memcmp(&alone[row], &g.delta[row], sizeof(float)) != 0) first = std::min(first, row), ++differing;
        if (differing > 0)
          ADD_FAILURE() << differing << " rows with other bits, the first " << first << ": alone " << alone[first] << ", backward "
                        << g.delta[first];
      }
}

// docs/numerics-contract.md keeps subnormals. With dO scaled into FP32's subnormal range (2^-128), most
// of dQ, dK, dV are subnormal. The GPU and the CPU oracle in the same `fused` numerics each round an
// FP32 result to BF16 once, from FP32 values that differ by their accumulation order only (far
// below a BF16 step), so they agree within one BF16 step at max|CPU| (2^-133 here: the subnormal
// grid's); a flush to zero anywhere on the way (the tensor cores' products, the bulk FP32
// adds, the BF16 conversions) zeroes values up to 2^-126, 128 of those steps. Where the main
// kernel stores dQ itself (one key block, T = 128), where bulk reductions add it up (T = 384) and
// where the CTAs add it in turns (deterministic). (The error bound against the FP64 reference
// cannot tell: the naive BF16 implementation it scales with loses its subnormals' bits too.)
TEST(BackwardGpu, GradientsKeepSubnormals) {
  SF_REQUIRE_GPU();
  constexpr float kSmallestNormal = 0x1p-126f;
  for (int t : {128, 384})
    for (bool deterministic : {false, true}) {
      SCOPED_TRACE("T " + std::to_string(t) + (deterministic ? " deterministic" : ""));
      Inputs in = random_inputs(AttentionShape{1, 2, t, t, 64}, Layout::bhtd, 4100 + t);
      for (bf16& x : in.d_o) x = bf16::from_float(x.to_float() * 0x1p-128f);
      AttentionOptions opt;
      opt.deterministic = deterministic;
      const Outputs g = run_gpu(in, opt, /*backward=*/true), c = run_cpu(in, opt, /*backward=*/true);
      const auto check = [&](const char* name, const std::vector<bf16>& gpu, const std::vector<bf16>& cpu) {
        std::int64_t subnormal = 0;
        for (const bf16& x : cpu) subnormal += x.to_float() != 0.0f && std::fabs(x.to_float()) < kSmallestNormal;
        EXPECT_GT(subnormal, std::int64_t(cpu.size()) / 2) << name << ": the inputs no longer make most of it subnormal";
        // one BF16 step at max|CPU|, and no finer than the subnormal grid's 2^-133
        double largest = 0.0, worst = 0.0;
        for (const bf16& x : cpu) largest = std::max(largest, double(std::fabs(x.to_float())));
        const double step = std::max(std::ldexp(1.0, std::ilogb(largest) - 7), 0x1p-133);
        for (std::size_t i = 0; i < cpu.size(); ++i) worst = std::max(worst, std::fabs(double(gpu[i].to_float()) - cpu[i].to_float()));
        std::printf("subnormal-gradients T %d%s %s: %lld of %zu subnormal, |GPU - CPU| <= %.3f BF16 steps\n", t,
                    deterministic ? " deterministic" : "", name, (long long)subnormal, cpu.size(), worst / step);
        EXPECT_LE(worst, step) << name << ": |GPU - CPU| up to " << worst / step << " BF16 steps at max|CPU| = " << largest;
      };
      check("dq", g.dq, c.dq);
      check("dk", g.dk, c.dk);
      check("dv", g.dv, c.dv);
    }
}

}  // namespace
}  // namespace stableflash::attention::gpu_test
