// Per-tensor strides (ForwardStrides / BackwardStrides): a run on strided views equals, bit for bit,
// the run on packed tensors, in every numerics (paper, fused, naive BF16, the FP64 reference) and
// for attention_delta. Strides only change where a value is read or written, never the arithmetic,
// so any difference is an addressing bug. Two arrangements:
// - interleaved: one [B, T, H + 2 H_kv, D] buffer holds q, k, v (a fused W_qkv product), another
//   dq, dk, dv the same way; o, o_residual and do are [B, T, H, D] while `layout` says bhtd;
// - transposed: every tensor a different permutation of its dimensions, some with padded rows
//   (a PyTorch .transpose / .split view), Tq != Tk.
// Every buffer starts filled with a poison pattern: elements no view covers must still hold it
// after the run (no write outside a view).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "attention_test_util.hpp"
#include "strided_arrangements.hpp"

namespace stableflash::attention {
namespace {

using namespace strided;

struct StridedRun {
  std::vector<bf16> o, residual, dq, dk, dv;
  std::vector<float> lse, delta, delta_only;
};

// Forward, backward and attention_delta on strided views; outputs gathered back to packed bhtd.
StridedRun run_strided(const testing::Problem& pr, const AttentionOptions& opt, const Arrangement& arr) {
  const AttentionShape& s = pr.shape;
  std::vector<Arena> arenas;
  std::vector<View> v;
  arr.make(s, arenas, v);
  auto arena = [&](int t) -> Arena& { return arenas[std::size_t(arena_of(t))]; };
  arena(kQ).place(v[kQ], pr.q), arena(kK).place(v[kK], pr.k), arena(kV).place(v[kV], pr.v);
  arena(kDo).place(v[kDo], pr.d_o);
  for (int t : {kO, kResidual, kDq, kDk, kDv}) arena(t).own(v[std::size_t(t)]);
  StridedRun r;
  r.lse.resize(std::size_t(s.rows())), r.delta.resize(r.lse.size()), r.delta_only.resize(r.lse.size());

  ForwardArgs fa;
  fa.shape = s, fa.layout = Layout::bhtd;
  fa.q = arena(kQ).at(v[kQ]), fa.k = arena(kK).at(v[kK]), fa.v = arena(kV).at(v[kV]);
  fa.o = arena(kO).at(v[kO]), fa.o_residual = arena(kResidual).at(v[kResidual]), fa.lse = r.lse.data();
  fa.strides = {v[kQ].st, v[kK].st, v[kV].st, v[kO].st};
  attention_forward(fa, opt);

  BackwardArgs ba;
  ba.shape = s, ba.layout = Layout::bhtd;
  ba.q = fa.q, ba.k = fa.k, ba.v = fa.v, ba.o = fa.o, ba.o_residual = fa.o_residual, ba.lse = r.lse.data();
  ba.d_o = arena(kDo).at(v[kDo]);
  ba.dq = arena(kDq).at(v[kDq]), ba.dk = arena(kDk).at(v[kDk]), ba.dv = arena(kDv).at(v[kDv]), ba.delta = r.delta.data();
  ba.strides = {v[kQ].st, v[kK].st, v[kV].st, v[kO].st, v[kDo].st, v[kDq].st, v[kDk].st, v[kDv].st};
  attention_backward(ba, opt);
  attention_delta(ba, opt, r.delta_only.data());

  r.o = arena(kO).gather(v[kO]), r.residual = arena(kResidual).gather(v[kResidual]);
  r.dq = arena(kDq).gather(v[kDq]), r.dk = arena(kDk).gather(v[kDk]), r.dv = arena(kDv).gather(v[kDv]);
  for (const Arena& a : arenas) EXPECT_TRUE(a.untouched_outside_views());
  return r;
}

using testing::same_bits;

struct Case {
  AttentionShape shape;
  Arrangement arrangement;
};

std::vector<Case> cases() {
  const Arrangement inter{"interleaved", interleaved}, trans{"transposed", transposed};
  return {{{2, 3, 37, 37, 32}, inter},
          {{2, 4, 33, 33, 32, 2}, inter},  // grouped-query: k, v with 2 heads in the qkv buffer
          {{2, 3, 29, 41, 32}, trans},
          {{1, 4, 41, 29, 32, 1}, trans}};  // multi-query, batch 1 (its strides are normalized)
}

std::string describe(const Case& c, bool causal) {
  const AttentionShape& s = c.shape;
  return c.arrangement.name + " B" + std::to_string(s.batch) + " H" + std::to_string(s.heads) + " Hkv" +
         std::to_string(s.resolved_kv_heads()) + " Tq" + std::to_string(s.q_len) + " Tk" + std::to_string(s.k_len) +
         (causal ? " causal" : " full");
}

TEST(StridedViews, FlashModesEqualThePackedRunBitForBit) {
  std::uint64_t seed = 700;
  for (const Case& c : cases())
    for (bool causal : {false, true})
      for (Numerics n : {Numerics::paper, Numerics::fused}) {
        SCOPED_TRACE(describe(c, causal) + " " + std::string(to_string(n)));
        const testing::Problem pr(c.shape, ++seed);
        AttentionOptions opt;
        opt.numerics = n, opt.causal = causal, opt.policy = ShiftPolicy::hashed_offset;
        opt.delta_source = DeltaSource::compensated, opt.tile_k = 16;  // several key tiles
        const testing::FlashRun packed = testing::run_flash(pr, opt);
        std::vector<float> packed_delta(packed.lse.size());
        BackwardArgs pa = pr.backward_args();
        pa.o = packed.o.data(), pa.o_residual = packed.residual.data(), pa.lse = packed.lse.data();
        attention_delta(pa, opt, packed_delta.data());
        const StridedRun r = run_strided(pr, opt, c.arrangement);
        EXPECT_TRUE(testing::bitwise_equal(r.o, packed.o));
        EXPECT_TRUE(testing::bitwise_equal(r.residual, packed.residual));
        EXPECT_TRUE(same_bits(r.lse, packed.lse));
        EXPECT_TRUE(same_bits(r.delta, packed.delta));
        EXPECT_TRUE(same_bits(r.delta_only, packed_delta));
        EXPECT_TRUE(testing::bitwise_equal(r.dq, packed.dq));
        EXPECT_TRUE(testing::bitwise_equal(r.dk, packed.dk));
        EXPECT_TRUE(testing::bitwise_equal(r.dv, packed.dv));
      }
}

TEST(StridedViews, NaiveAndReferenceEqualThePackedRunBitForBit) {
  std::uint64_t seed = 800;
  for (const Case& c : cases()) {
    SCOPED_TRACE(describe(c, true));
    const testing::Problem pr(c.shape, ++seed);
    const AttentionShape& s = c.shape;
    AttentionOptions opt;
    opt.causal = true;
    std::vector<Arena> arenas;
    std::vector<View> v;
    c.arrangement.make(s, arenas, v);
    auto arena = [&](int t) -> Arena& { return arenas[std::size_t(arena_of(t))]; };
    arena(kQ).place(v[kQ], pr.q), arena(kK).place(v[kK], pr.k), arena(kV).place(v[kV], pr.v);
    arena(kDo).place(v[kDo], pr.d_o);

    // naive BF16: o, dq, dk, dv
    const testing::FlashRun packed = testing::run_naive_bf16(pr, opt);

    ForwardArgs fs;
    fs.shape = s, fs.q = arena(kQ).at(v[kQ]), fs.k = arena(kK).at(v[kK]), fs.v = arena(kV).at(v[kV]);
    fs.o = arena(kO).at(v[kO]);
    fs.strides = {v[kQ].st, v[kK].st, v[kV].st, v[kO].st};
    naive_bf16_forward(fs, opt);
    BackwardArgs bs;
    bs.shape = s, bs.q = fs.q, bs.k = fs.k, bs.v = fs.v, bs.d_o = arena(kDo).at(v[kDo]);
    bs.dq = arena(kDq).at(v[kDq]), bs.dk = arena(kDk).at(v[kDk]), bs.dv = arena(kDv).at(v[kDv]);
    bs.strides = {v[kQ].st, v[kK].st, v[kV].st, v[kO].st, v[kDo].st, v[kDq].st, v[kDk].st, v[kDv].st};
    naive_bf16_backward(bs, opt);
    EXPECT_TRUE(testing::bitwise_equal(arena(kO).gather(v[kO]), packed.o));
    EXPECT_TRUE(testing::bitwise_equal(arena(kDq).gather(v[kDq]), packed.dq));
    EXPECT_TRUE(testing::bitwise_equal(arena(kDk).gather(v[kDk]), packed.dk));
    EXPECT_TRUE(testing::bitwise_equal(arena(kDv).gather(v[kDv]), packed.dv));

    // the FP64 oracle reads the views; its outputs are packed in `layout` either way
    opt.numerics = Numerics::reference;
    const ReferenceForward rf = reference_forward(fs, opt), rp = reference_forward(pr.forward_args(), opt);
    EXPECT_TRUE(same_bits(rf.o, rp.o));
    EXPECT_TRUE(same_bits(rf.lse, rp.lse));
    const ReferenceBackward gf = reference_backward(bs, opt), gp = reference_backward(pr.backward_args(), opt);
    EXPECT_TRUE(same_bits(gf.dq, gp.dq));
    EXPECT_TRUE(same_bits(gf.dk, gp.dk));
    EXPECT_TRUE(same_bits(gf.dv, gp.dv));
    EXPECT_TRUE(same_bits(gf.delta, gp.delta));
  }
}

TEST(StridedViews, UnsetStridesAreThePackedLayoutAndExtentOneDimensionsAreNormalized) {
  const AttentionShape s{2, 3, 5, 7, 16, 1};
  ForwardArgs a;
  a.shape = s, a.layout = Layout::bthd;
  EXPECT_EQ(a.q_strides(), HeadStrides::of(Layout::bthd, 3, 5, 16));
  EXPECT_EQ(a.k_strides(), HeadStrides::of(Layout::bthd, 1, 7, 16));
  a.strides.k = HeadStrides{1000, 12345, 64};  // one KV head: its head stride is never used
  EXPECT_EQ(a.k_strides(), (HeadStrides{1000, 16, 64}));
  a.strides.q = HeadStrides{999, 48, 16};
  EXPECT_EQ(a.q_strides(), (HeadStrides{999, 48, 16}));
  EXPECT_EQ(a.o_strides(), HeadStrides::of(Layout::bthd, 3, 5, 16));
}

}  // namespace
}  // namespace stableflash::attention
