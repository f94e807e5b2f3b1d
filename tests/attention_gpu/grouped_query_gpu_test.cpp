// Grouped-query (GQA) and multi-query (MQA) attention on the GPU (numerics-contract.md "Grouped-query"):
// - bit for bit the GPU's multi-head run on K/V repeated per group, with dK, dV summed per group in
//   ascending query-head order in FP32 and rounded once (deterministic mode, so dQ's order is fixed
//   too): the kernels read K/V head h / group and change nothing else, and the group sum is the
//   contract's;
// - against the CPU oracle: `fused` within the error-bound helper's 2x (forward) / 3x (gradients)
//   the naive BF16 error + one ulp; `paper` per query head (o, lse, dq) by the paper tests' rule (at
//   most 2 BF16 ulps of max|CPU|, rare), and dK, dV by what that rule gives a sum of `group` heads:
//   each head's term differs by at most 2 ulps of the largest per-head |dK| (the CPU's multi-head
//   run on repeated K/V), and both sides round the FP32 sum once more (1 ulp of max|dK|);
// - deterministic mode bitwise reproducible.
// Shapes: Llama's 64 query / 8 KV heads at D = 128, MQA (one KV head) at D = 64 with 8 and 64 heads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_support.hpp"
#include "stableflash/numerics/exact_ops.hpp"

namespace stableflash::attention::gpu_test {
namespace {

// K or V [B, H_kv, Tk, D] repeated to [B, H, Tk, D] (head h reads KV head h / group); bhtd.
std::vector<bf16> repeat_heads(const std::vector<bf16>& x, const AttentionShape& s) {
  const std::size_t head = std::size_t(s.k_len) * s.head_dim;
  std::vector<bf16> y;
  y.reserve(std::size_t(s.batch) * s.heads * head);
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.heads; ++h) {
      const auto* src = x.data() + (std::size_t(b) * s.resolved_kv_heads() + s.kv_head_of(h)) * head;
      y.insert(y.end(), src, src + head);
    }
  return y;
}

// The MHA gradient [B, H, Tk, D] summed per group as numerics-contract.md says: FP32 additions in ascending
// head order, the first taken as is, one rounding to BF16.
std::vector<bf16> group_sum(const std::vector<bf16>& mha, const AttentionShape& s) {
  const int group = s.group_size(), kvh = s.resolved_kv_heads();
  const std::size_t head = std::size_t(s.k_len) * s.head_dim;
  std::vector<bf16> y(std::size_t(s.batch) * kvh * head);
  for (int b = 0; b < s.batch; ++b)
    for (int kh = 0; kh < kvh; ++kh)
      for (std::size_t e = 0; e < head; ++e) {
        const std::size_t first = (std::size_t(b) * s.heads + std::size_t(kh) * group) * head + e;
        float acc = mha[first].to_float();
        for (int g = 1; g < group; ++g) acc = acc + mha[first + std::size_t(g) * head].to_float();
        y[(std::size_t(b) * kvh + kh) * head + e] = bf16::from_float(acc);
      }
  return y;
}

Inputs multi_head_twin(const Inputs& gqa) {
  Inputs mha = gqa;
  mha.shape.kv_heads = 0;
  mha.k = repeat_heads(gqa.k, gqa.shape), mha.v = repeat_heads(gqa.v, gqa.shape);
  return mha;
}

struct GqaCase {
  AttentionShape shape;
  bool causal;
};

std::vector<GqaCase> gqa_cases() {
  return {{{1, 64, 384, 384, 128, 8}, true},   // Llama: 64 query heads, 8 KV heads
          {{2, 8, 300, 300, 64, 1}, false},    // MQA
          {{1, 64, 200, 333, 64, 1}, true},    // MQA with 64 query heads, Tq != Tk
          {{2, 6, 97, 130, 128, 3}, true},     // groups of 2, odd lengths
          {{2, 8, 100, 120, 64, 2}, true}};    // one key block: the exact delta inside the backward (auto's)
}

std::string describe(const GqaCase& c, Numerics n) {
  const AttentionShape& s = c.shape;
  return "B" + std::to_string(s.batch) + " H" + std::to_string(s.heads) + " Hkv" + std::to_string(s.resolved_kv_heads()) +
         " Tq" + std::to_string(s.q_len) + " Tk" + std::to_string(s.k_len) + " D" + std::to_string(s.head_dim) +
         (c.causal ? " causal " : " full ") + std::string(to_string(n));
}

TEST(GroupedQueryGpu, EqualsMultiHeadOnRepeatedKvWithGroupSummedGradients) {
  SF_REQUIRE_GPU();
  for (const GqaCase& c : gqa_cases())
    for (Numerics n : {Numerics::fused, Numerics::paper})
      for (DeltaSource src : {DeltaSource::compensated, DeltaSource::exact}) {
        SCOPED_TRACE(describe(c, n) + " " + std::string(to_string(src)));
        const Inputs gqa = random_inputs(c.shape, Layout::bhtd, 6100 + c.shape.q_len);
        AttentionOptions opt;
        opt.numerics = n, opt.causal = c.causal, opt.deterministic = true;  // dQ in a fixed order on both sides
        opt.policy = ShiftPolicy::hashed_offset, opt.delta_source = src;
        const Outputs g = run_gpu(gqa, opt, /*backward=*/true), m = run_gpu(multi_head_twin(gqa), opt, /*backward=*/true);
        EXPECT_TRUE(same_bits(g.o, m.o)) << "o";
        EXPECT_TRUE(same_bits(g.residual, m.residual)) << "o_residual";
        EXPECT_TRUE(same_bits(g.lse, m.lse)) << "lse";
        EXPECT_TRUE(same_bits(g.delta, m.delta)) << "delta";
        EXPECT_TRUE(same_bits(g.dq, m.dq)) << "dq";
        EXPECT_TRUE(same_bits(g.dk, group_sum(m.dk, c.shape))) << "dk";
        EXPECT_TRUE(same_bits(g.dv, group_sum(m.dv, c.shape))) << "dv";
      }
}

TEST(GroupedQueryGpu, FusedWithinTheNaiveErrorBound) {
  SF_REQUIRE_GPU();
  for (const GqaCase& c : gqa_cases())
    for (DeltaSource src : {DeltaSource::rounded, DeltaSource::compensated}) {
      SCOPED_TRACE(describe(c, Numerics::fused) + " " + std::string(to_string(src)));
      const Inputs in = random_inputs(c.shape, Layout::bhtd, 6200 + c.shape.q_len);
      AttentionOptions opt;
      opt.causal = c.causal, opt.delta_source = src, opt.policy = ShiftPolicy::hashed_offset;
      const Outputs g = run_gpu(in, opt, /*backward=*/true);
      const Bounds b = fused_bounds(in, opt, /*backward=*/true);
      std::int64_t nonfinite = 0;
      EXPECT_LE(max_err(g.o, b.ref_o, &nonfinite), b.o) << "o";
      EXPECT_LE(max_err(g.dq, b.ref_dq, &nonfinite), b.dq) << "dq";
      EXPECT_LE(max_err(g.dk, b.ref_dk, &nonfinite), b.dk) << "dk";
      EXPECT_LE(max_err(g.dv, b.ref_dv, &nonfinite), b.dv) << "dv";
      EXPECT_EQ(nonfinite, 0);
    }
}

// max |a - c| over the elements, for BF16 tensors.
double max_diff(const std::vector<bf16>& a, const std::vector<bf16>& c) {
  double m = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i].to_float()) - c[i].to_float()));
  return m;
}
double max_abs_bf16(const std::vector<bf16>& x) {
  double m = 0.0;
  for (bf16 e : x) m = std::max(m, std::fabs(double(e.to_float())));
  return m;
}

TEST(GroupedQueryGpu, PaperMatchesTheCpuOracle) {
  SF_REQUIRE_GPU();
  for (const GqaCase& c : gqa_cases()) {
    SCOPED_TRACE(describe(c, Numerics::paper));
    // exact dot products: S is bitwise the CPU's (paper_gpu_test.cpp)
    const Inputs in = exact_dot_inputs(c.shape, Layout::bhtd, 6300 + c.shape.q_len);
    AttentionOptions opt;
    opt.numerics = Numerics::paper, opt.causal = c.causal, opt.tile_k = 128, opt.delta_source = DeltaSource::rounded;
    const Outputs g = run_gpu(in, opt, /*backward=*/true), cpu = run_cpu(in, opt, /*backward=*/true);
    for (const auto& [name, gpu_t, cpu_t] : {std::tuple<const char*, const std::vector<bf16>*, const std::vector<bf16>*>{
                                                 "o", &g.o, &cpu.o},
                                             {"dq", &g.dq, &cpu.dq}}) {
      const Agreement a = agreement(*gpu_t, *cpu_t);
      std::printf("    %-3s %s\n", name, a.str().c_str());
      EXPECT_EQ(a.nonfinite, 0) << name;
      EXPECT_LE(a.max_ulps, 2.0) << name;
      EXPECT_LE(double(a.differing), 0.2 * double(a.elements)) << name;
    }
    // dK, dV: per-head terms within 2 ulps of the largest per-head |gradient| (the CPU's MHA run on
    // repeated K/V), `group` of them, plus the final rounding
    const Outputs per_head = run_cpu(multi_head_twin(in), opt, /*backward=*/true);
    const int group = c.shape.group_size();
    for (const auto& [name, gpu_t, cpu_t, heads_t] :
         {std::tuple<const char*, const std::vector<bf16>*, const std::vector<bf16>*, const std::vector<bf16>*>{
              "dk", &g.dk, &cpu.dk, &per_head.dk},
          {"dv", &g.dv, &cpu.dv, &per_head.dv}}) {
      const double bound = 2.0 * group * bf16_ulp(max_abs_bf16(*heads_t)) + bf16_ulp(max_abs_bf16(*cpu_t));
      const double diff = max_diff(*gpu_t, *cpu_t);
      std::printf("    %-3s max |GPU - CPU| %.3g (bound %.3g)\n", name, diff, bound);
      EXPECT_LE(diff, bound) << name;
    }
  }
}

TEST(GroupedQueryGpu, DeterministicModeIsBitwiseReproducible) {
  SF_REQUIRE_GPU();
  const AttentionShape s{1, 64, 300, 300, 128, 8};
  const Inputs in = random_inputs(s, Layout::bhtd, 6400);
  for (Numerics n : {Numerics::fused, Numerics::paper}) {
    AttentionOptions opt;
    opt.numerics = n, opt.causal = true, opt.deterministic = true;
    EXPECT_EQ(runs_differing_from_first(in, opt, 20), 0) << to_string(n) << ": runs whose outputs differ from the first";
  }
}

}  // namespace
}  // namespace stableflash::attention::gpu_test
