// Grouped-query (GQA) and multi-query (MQA) attention on the CPU: every numerics equals, bit for
// bit, multi-head attention (MHA) on K and V repeated per group, with dK and dV summed per group in
// ascending query-head order.
//
// What is compared, and why it is bitwise:
// - o, lse, o_residual, dq, delta of query head h depend only on q, dO of head h and on K/V head
//   h / group. The MHA run reads the repeated copy of that same K/V head, and the per-row
//   computation (and the shift policy's RowId, which names the query head) is the same code on
//   the same values, so every output of a query head is the same bits.
// - dK, dV of a KV head: the BF16 paths (paper, fused, naive) define them as the BF16 dK/dV of the
//   group's query heads (each exactly the MHA's BF16 output of that head, by the point above),
//   summed in FP32 in ascending head order (the first head's value taken as is, then one
//   round-to-nearest FP32 addition per further head) and rounded once to BF16. The test forms the
//   same sum from the MHA's BF16 dK/dV with the same FP32 additions in the same order, so the
//   results agree bitwise. The FP64 `reference` does the same with FP64 additions of the MHA's FP64
//   per-head dK/dV. A group of one (MHA) keeps the per-head values unchanged, signed zeros included.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "attention_test_util.hpp"

namespace stableflash::attention {
namespace {

// K or V of `kv_heads` heads repeated to `heads` heads (head h reads KV head h / group), in layout.
template <class T>
std::vector<T> repeat_heads(const std::vector<T>& x, Layout layout, const AttentionShape& s) {
  const int kvh = s.resolved_kv_heads(), group = s.group_size();
  const HeadStrides src = HeadStrides::of(layout, kvh, s.k_len, s.head_dim);
  const HeadStrides dst = HeadStrides::of(layout, s.heads, s.k_len, s.head_dim);
  std::vector<T> y(std::size_t(s.batch) * s.heads * s.k_len * s.head_dim);
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.heads; ++h)
      for (int t = 0; t < s.k_len; ++t)
        for (int d = 0; d < s.head_dim; ++d) y[dst.at(b, h, t) + d] = x[src.at(b, h / group, t) + d];
  return y;
}

// The MHA gradient of `heads` heads summed per group in ascending head order: `add(acc, x)` is the
// path's addition, `finish` its final rounding.
template <class T, class Acc, class Add, class Finish>
std::vector<T> group_sum(const std::vector<T>& mha, Layout layout, const AttentionShape& s, Acc widen, Add add, Finish finish) {
  const int kvh = s.resolved_kv_heads(), group = s.group_size();
  const HeadStrides src = HeadStrides::of(layout, s.heads, s.k_len, s.head_dim);
  const HeadStrides dst = HeadStrides::of(layout, kvh, s.k_len, s.head_dim);
  std::vector<T> y(std::size_t(s.k_elements()));
  for (int b = 0; b < s.batch; ++b)
    for (int kh = 0; kh < kvh; ++kh)
      for (int t = 0; t < s.k_len; ++t)
        for (int d = 0; d < s.head_dim; ++d) {
          auto acc = widen(mha[src.at(b, kh * group, t) + d]);
          for (int g = 1; g < group; ++g) acc = add(acc, widen(mha[src.at(b, kh * group + g, t) + d]));
          y[dst.at(b, kh, t) + d] = finish(acc);
        }
  return y;
}

std::vector<bf16> bf16_group_sum(const std::vector<bf16>& mha, Layout layout, const AttentionShape& s) {
  return group_sum(
      mha, layout, s, [](bf16 x) { return x.to_float(); }, [](float a, float b) { return a + b; },  // FP32 round-to-nearest
      [](float a) { return bf16::from_float(a); });
}

std::vector<double> fp64_group_sum(const std::vector<double>& mha, Layout layout, const AttentionShape& s) {
  return group_sum(
      mha, layout, s, [](double x) { return x; }, [](double a, double b) { return a + b; }, [](double a) { return a; });
}

using testing::same_bits;

// The GQA problem and its MHA twin (same q, dO; K, V repeated per group).
struct Twin {
  testing::Problem gqa, mha;
  Twin(AttentionShape s, std::uint64_t seed, Layout layout) : gqa(s, seed, 1.0, layout), mha(gqa) {
    mha.shape.kv_heads = 0;
    mha.k = repeat_heads(gqa.k, layout, s), mha.v = repeat_heads(gqa.v, layout, s);
  }
};

struct Case {
  AttentionShape shape;
  Layout layout;
};

std::vector<Case> cases() {
  return {
      {{2, 8, 17, 17, 32, 2}, Layout::bhtd},   // GQA 8 / 2
      {{1, 8, 97, 97, 32, 1}, Layout::bhtd},   // MQA
      {{2, 8, 17, 97, 16, 2}, Layout::bthd},   // Tq != Tk, token-major
      {{1, 8, 97, 17, 16, 1}, Layout::bthd},   // Tq > Tk: causal rows with no key
      {{1, 4, 33, 33, 16, 4}, Layout::bhtd},   // kv_heads = heads: MHA itself
  };
}

std::string name(const Case& c, bool causal) {
  return "B" + std::to_string(c.shape.batch) + " H" + std::to_string(c.shape.heads) + "/" + std::to_string(c.shape.kv_heads) +
         " Tq" + std::to_string(c.shape.q_len) + " Tk" + std::to_string(c.shape.k_len) + " " +
         std::string(to_string(c.layout)) + (causal ? " causal" : " full");
}

TEST(GroupedQuery, FlashModesEqualRepeatedKvMhaBitwiseWithGroupSummedGradients) {
  struct Mode {
    Numerics numerics;
    ShiftPolicy policy;
    DeltaSource delta;
  };
  const Mode modes[] = {{Numerics::fused, ShiftPolicy::standard, DeltaSource::rounded},
                        {Numerics::fused, ShiftPolicy::hashed_offset, DeltaSource::compensated},
                        {Numerics::paper, ShiftPolicy::paper, DeltaSource::rounded},
                        {Numerics::paper, ShiftPolicy::standard, DeltaSource::exact}};
  std::uint64_t seed = 100;
  for (const Case& c : cases())
    for (bool causal : {false, true})
      for (const Mode& m : modes) {
        SCOPED_TRACE(name(c, causal) + " " + std::string(to_string(m.numerics)) + " " + std::string(to_string(m.policy)) + " " +
                     std::string(to_string(m.delta)));
        const Twin tw(c.shape, ++seed, c.layout);
        AttentionOptions opt;
        opt.numerics = m.numerics, opt.policy = m.policy, opt.delta_source = m.delta, opt.causal = causal;
        opt.tile_k = 16;  // several key tiles at these lengths
        const testing::FlashRun g = testing::run_flash(tw.gqa, opt), h = testing::run_flash(tw.mha, opt);
        EXPECT_EQ(g.dk.size(), std::size_t(c.shape.k_elements()));
        EXPECT_TRUE(testing::bitwise_equal(g.o, h.o));
        EXPECT_TRUE(testing::bitwise_equal(g.residual, h.residual));
        EXPECT_TRUE(same_bits(g.lse, h.lse));
        EXPECT_TRUE(testing::bitwise_equal(g.dq, h.dq));
        EXPECT_TRUE(same_bits(g.delta, h.delta));
        EXPECT_TRUE(testing::bitwise_equal(g.dk, bf16_group_sum(h.dk, c.layout, c.shape)));
        EXPECT_TRUE(testing::bitwise_equal(g.dv, bf16_group_sum(h.dv, c.layout, c.shape)));
        EXPECT_EQ(g.ties.tie_event_rows, h.ties.tie_event_rows);
        EXPECT_EQ(g.ties.fallback_rows, h.ties.fallback_rows);
        EXPECT_EQ(g.ties.masked_rows, h.ties.masked_rows);

        // attention_delta alone: the same delta per query row
        std::vector<float> dg(g.delta.size()), dh(h.delta.size());
        BackwardArgs bg = tw.gqa.backward_args(), bh = tw.mha.backward_args();
        bg.o = g.o.data(), bg.lse = g.lse.data(), bg.o_residual = g.residual.data();
        bh.o = h.o.data(), bh.lse = h.lse.data(), bh.o_residual = h.residual.data();
        attention_delta(bg, opt, dg.data());
        attention_delta(bh, opt, dh.data());
        EXPECT_TRUE(same_bits(dg, dh));
        EXPECT_TRUE(same_bits(dg, g.delta));
      }
}

TEST(GroupedQuery, ReferenceEqualsRepeatedKvMhaBitwiseWithGroupSummedGradients) {
  std::uint64_t seed = 200;
  for (const Case& c : cases())
    for (bool causal : {false, true}) {
      SCOPED_TRACE(name(c, causal));
      const Twin tw(c.shape, ++seed, c.layout);
      AttentionOptions opt;
      opt.numerics = Numerics::reference, opt.causal = causal;
      const ReferenceForward fg = reference_forward(tw.gqa.forward_args(), opt), fh = reference_forward(tw.mha.forward_args(), opt);
      EXPECT_TRUE(same_bits(fg.o, fh.o));
      EXPECT_TRUE(same_bits(fg.lse, fh.lse));
      const ReferenceBackward bg = reference_backward(tw.gqa.backward_args(), opt),
                              bh = reference_backward(tw.mha.backward_args(), opt);
      EXPECT_EQ(bg.dk.size(), std::size_t(c.shape.k_elements()));
      EXPECT_TRUE(same_bits(bg.dq, bh.dq));
      EXPECT_TRUE(same_bits(bg.delta, bh.delta));
      EXPECT_TRUE(same_bits(bg.dk, fp64_group_sum(bh.dk, c.layout, c.shape)));
      EXPECT_TRUE(same_bits(bg.dv, fp64_group_sum(bh.dv, c.layout, c.shape)));
    }
}

TEST(GroupedQuery, NaiveBf16EqualsRepeatedKvMhaBitwiseWithGroupSummedGradients) {
  std::uint64_t seed = 300;
  for (const Case& c : cases())
    for (bool causal : {false, true}) {
      SCOPED_TRACE(name(c, causal));
      const Twin tw(c.shape, ++seed, c.layout);
      AttentionOptions opt;
      opt.causal = causal;
      const testing::FlashRun g = testing::run_naive_bf16(tw.gqa, opt), h = testing::run_naive_bf16(tw.mha, opt);
      EXPECT_TRUE(testing::bitwise_equal(g.o, h.o));
      EXPECT_TRUE(testing::bitwise_equal(g.dq, h.dq));
      EXPECT_TRUE(testing::bitwise_equal(g.dk, bf16_group_sum(h.dk, c.layout, c.shape)));
      EXPECT_TRUE(testing::bitwise_equal(g.dv, bf16_group_sum(h.dv, c.layout, c.shape)));
    }
}

TEST(GroupedQuery, GradientsAreTheGroupSumsNotOneHead) {
  // Guards the bitwise tests against a vacuous pass: with a group of 4 the summed dK differs from
  // any single query head's.
  const Twin tw({1, 8, 17, 17, 16, 2}, 7, Layout::bhtd);
  AttentionOptions opt;
  const testing::FlashRun g = testing::run_flash(tw.gqa, opt), h = testing::run_flash(tw.mha, opt);
  const std::vector<bf16> first_heads(h.dk.begin(), h.dk.begin() + std::ptrdiff_t(g.dk.size()));
  EXPECT_FALSE(testing::bitwise_equal(g.dk, first_heads));
  double mag = 0.0;
  for (bf16 x : g.dk) mag += std::fabs(x.to_float());
  EXPECT_GT(mag, 0.0);
}

TEST(GroupedQuery, KvHeadsThatDoNotDivideHeadsAreRejectedNamingTheFields) {
  for (int kv : {3, 5, 16, -1}) {
    SCOPED_TRACE(kv);
    AttentionShape s{1, 8, 17, 17, 32};
    s.kv_heads = kv;
    AttentionOptions opt;
    try {
      opt.validate(s);
      ADD_FAILURE() << "kv_heads " << kv << " accepted";
    } catch (const std::invalid_argument& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("kv_heads (" + std::to_string(kv) + ")"), std::string::npos) << what;
      EXPECT_NE(what.find("heads (8)"), std::string::npos) << what;
    }
    // the entry points check it too
    const std::vector<bf16> x(std::size_t(8) * 17 * 32);
    std::vector<bf16> o(x.size());
    std::vector<float> lse(8 * 17);
    ForwardArgs fa;
    fa.shape = s, fa.q = fa.k = fa.v = x.data(), fa.o = o.data(), fa.lse = lse.data();
    EXPECT_THROW(attention_forward(fa, opt), std::invalid_argument);
    opt.numerics = Numerics::reference;
    EXPECT_THROW(reference_forward(fa, opt), std::invalid_argument);
  }
  AttentionShape ok{1, 8, 17, 17, 32};
  for (int kv : {0, 1, 2, 4, 8}) {
    ok.kv_heads = kv;
    EXPECT_NO_THROW(AttentionOptions{}.validate(ok));
  }
}

}  // namespace
}  // namespace stableflash::attention
