// The ZeRO-1 shard plan (stableflash/optim/sharding.hpp): every property the collectives and the
// sharded optimizer rely on, on the real GPT-2 layouts and on odd sizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "stableflash/model/gpt2.hpp"
#include "stableflash/optim/sharding.hpp"

namespace stableflash::optim {
namespace {

using model::ParamRole;
using model::ParamTensor;

std::vector<ParamTensor> gpt2_124m() {
  model::Gpt2Config c;
  c.n_layer = 12, c.n_head = 12, c.n_embd = 768, c.vocab_size = 50257, c.padded_vocab_size = 50304, c.block_size = 1024;
  return model::parameter_layout(c);
}

// Tensors of the given sizes back to back; `muon` marks hidden matrices.
std::vector<ParamTensor> layout(const std::vector<std::pair<std::int64_t, ParamRole>>& sizes) {
  std::vector<ParamTensor> out;
  std::int64_t at = 0;
  for (const auto& [n, role] : sizes) {
    out.push_back({"t" + std::to_string(out.size()), role == ParamRole::vector ? std::vector<std::int64_t>{n} : std::vector<std::int64_t>{1, n},
                   at, n, role});
    at += n;
  }
  return out;
}

// The invariants of any plan: buckets partition [0, total); sharded ones split evenly; the ranks'
// owned pieces cover every element (sharded: exactly once; replicated: on every rank); the norm
// slices count every element exactly once.
void expect_consistent(const ShardPlan& p) {
  const int W = p.world();
  ASSERT_FALSE(p.buckets().empty());
  EXPECT_EQ(p.buckets().front().range.begin, 0);
  EXPECT_EQ(p.buckets().back().range.end, p.total());
  for (std::size_t i = 0; i < p.buckets().size(); ++i) {
    const auto& b = p.buckets()[i];
    EXPECT_GT(b.range.size(), 0) << "bucket " << i;
    if (i > 0) {
      EXPECT_EQ(b.range.begin, p.buckets()[i - 1].range.end) << "bucket " << i;
    }
    if (!b.replicated) {
      EXPECT_EQ(b.range.size() % W, 0) << "bucket " << i << " cannot be reduce-scattered evenly";
    }
  }
  // Per bucket: the ranks' owned pieces tile a sharded bucket in rank order and are the whole of a
  // replicated one; the norm slices tile every bucket in rank order.
  for (std::size_t i = 0; i < p.buckets().size(); ++i) {
    const auto& b = p.buckets()[i];
    std::int64_t owned_at = b.range.begin, norm_at = b.range.begin;
    for (int r = 0; r < W; ++r) {
      const FlatRange o = b.owned(r, W), n = b.norm_slice(r, W);
      if (b.replicated) {
        EXPECT_EQ(o, b.range) << "bucket " << i << ", rank " << r;
      } else {
        EXPECT_EQ(o.begin, owned_at) << "bucket " << i << ", rank " << r;
        owned_at = o.end;
      }
      EXPECT_EQ(n.begin, norm_at) << "bucket " << i << ", rank " << r;
      norm_at = n.end;
    }
    if (!b.replicated) {
      EXPECT_EQ(owned_at, b.range.end) << "bucket " << i;
    }
    EXPECT_EQ(norm_at, b.range.end) << "bucket " << i;
  }
  // Each rank's owned ranges: ascending, adjacent ones merged, owned_count() values in all.
  for (int r = 0; r < W; ++r) {
    std::int64_t n = 0, last_end = -1;
    for (const FlatRange& o : p.owned(r)) {
      EXPECT_GT(o.begin, last_end) << "rank " << r;
      last_end = o.end;
      n += o.size();
    }
    EXPECT_EQ(n, p.owned_count()) << "rank " << r;
  }
}

TEST(ShardPlan, Gpt2AdamwShardsEverythingInBucketsOfTheAskedSize) {
  const auto t = gpt2_124m();
  const std::int64_t bucket = 25'000'000 / 4;
  for (int W : {1, 2, 3, 4, 8}) {
    const ShardPlan p = ShardPlan::make(t, OptimizerKind::adamw, W, bucket);
    SCOPED_TRACE("world " + std::to_string(W));
    expect_consistent(p);
    for (const auto& b : p.buckets()) {
      EXPECT_FALSE(b.replicated);  // 768 divides every tensor: no tail
      EXPECT_LE(b.range.size(), bucket);
    }
    // Cut from the top: only the lowest bucket may be short.
    for (std::size_t i = 1; i < p.buckets().size(); ++i) EXPECT_GT(p.buckets()[i].range.size(), bucket - W);
    // Optimizer state per rank is 1/world of the model.
    EXPECT_EQ(p.owned_count() * W, p.total());
  }
}

TEST(ShardPlan, MuonMatricesAreReplicatedWholeEmbeddingsSharded) {
  const auto t = gpt2_124m();
  const ShardPlan p = ShardPlan::make(t, OptimizerKind::muon, 2, 6'000'000);
  expect_consistent(p);
  for (const auto& x : t) {
    if (x.role != ParamRole::hidden_matrix) continue;
    const auto [first, last] = p.buckets_touching({x.offset, x.offset + x.size});
    for (int b = first; b < last; ++b) EXPECT_TRUE(p.buckets()[std::size_t(b)].replicated) << x.name;
  }
  // wte and wpe (the lowest 39.4M values, AdamW under Muon too) are sharded.
  const auto [first, last] = p.buckets_touching({0, t[1].offset + t[1].size});
  for (int b = first; b < last; ++b)
    if (p.buckets()[std::size_t(b)].range.end <= t[1].offset + t[1].size) {
      EXPECT_FALSE(p.buckets()[std::size_t(b)].replicated);
    }
  EXPECT_LT(p.owned_count(), p.total());
}

TEST(ShardPlan, OddTotalsGetAReplicatedTailAndEvenSharedBuckets) {
  // 1001 + 7 + 13 values over 4 ranks: 1021 = 4 * 255 + 1.
  const auto t = layout({{1001, ParamRole::embedding}, {7, ParamRole::vector}, {13, ParamRole::vector}});
  for (int W : {1, 2, 3, 4, 7}) {
    for (std::int64_t bucket : {std::int64_t(W), std::int64_t(10), std::int64_t(100), std::int64_t(5000)}) {
      if (bucket < W) continue;
      SCOPED_TRACE("world " + std::to_string(W) + ", bucket " + std::to_string(bucket));
      const ShardPlan p = ShardPlan::make(t, OptimizerKind::adamw, W, bucket);
      expect_consistent(p);
      EXPECT_EQ(p.buckets().back().replicated, 1021 % W != 0);
      if (1021 % W != 0) {
        EXPECT_EQ(p.buckets().back().range.size(), 1021 % W);
      }
    }
  }
}

TEST(ShardPlan, MuonSpanWidenedToWorldMultiples) {
  // A Muon matrix at an odd offset: the replicated region starts at the multiple of the world size
  // below it, so the AdamW values under it stay in even sharded buckets.
  const auto t = layout({{101, ParamRole::embedding}, {3, ParamRole::vector}, {30, ParamRole::hidden_matrix},
                         {5, ParamRole::vector}, {22, ParamRole::hidden_matrix}, {9, ParamRole::vector}});
  for (int W : {2, 3, 4}) {
    SCOPED_TRACE("world " + std::to_string(W));
    const ShardPlan p = ShardPlan::make(t, OptimizerKind::muon, W, 16);
    expect_consistent(p);
    for (const auto& x : t)
      if (x.role == ParamRole::hidden_matrix) {
        const auto [first, last] = p.buckets_touching({x.offset, x.offset + x.size});
        EXPECT_LT(first, last);
        for (int b = first; b < last; ++b) EXPECT_TRUE(p.buckets()[std::size_t(b)].replicated) << x.name;
      }
  }
}

TEST(ShardPlan, ReplicateAllIsPlainAllReduce) {
  const ShardPlan p = ShardPlan::make(gpt2_124m(), OptimizerKind::adamw, 2, 6'000'000, /*replicate_all=*/true);
  expect_consistent(p);
  for (const auto& b : p.buckets()) EXPECT_TRUE(b.replicated);
  EXPECT_EQ(p.owned_count(), p.total());
}

TEST(ShardPlan, BucketsTouching) {
  const auto t = layout({{100, ParamRole::embedding}});
  const ShardPlan p = ShardPlan::make(t, OptimizerKind::adamw, 2, 30);  // [0,10) [10,40) [40,70) [70,100)
  ASSERT_EQ(p.buckets().size(), 4u);
  EXPECT_EQ(p.buckets()[0].range, (FlatRange{0, 10}));
  EXPECT_EQ(p.buckets_touching({0, 10}), std::make_pair(0, 1));
  EXPECT_EQ(p.buckets_touching({9, 11}), std::make_pair(0, 2));
  EXPECT_EQ(p.buckets_touching({40, 70}), std::make_pair(2, 3));
  EXPECT_EQ(p.buckets_touching({0, 100}), std::make_pair(0, 4));
  EXPECT_EQ(p.buckets_touching({99, 100}), std::make_pair(3, 4));
  EXPECT_EQ(p.buckets_touching({50, 50}).first, p.buckets_touching({50, 50}).second);
}

TEST(ShardPlan, RangesTouchingAgreesWithBucketsTouching) {
  const auto t = layout({{100, ParamRole::embedding}});
  const ShardPlan p = ShardPlan::make(t, OptimizerKind::adamw, 2, 30);
  std::vector<FlatRange> ranges;
  for (const auto& b : p.buckets()) ranges.push_back(b.range);
  for (std::int64_t a = 0; a <= 100; a += 3)
    for (std::int64_t b = a; b <= 100; b += 7) EXPECT_EQ(ranges_touching(ranges, {a, b}), p.buckets_touching({a, b})) << a << ", " << b;
}

// The parts the one-GPU trainer updates one after the other while the next forward starts: in the
// order of the CUDA model's parameters-needed calls (embeddings, each layer, ln_f), contiguous.
TEST(ForwardOrderParts, EmbeddingsEachLayerThenLnF) {
  for (const bool bias : {false, true}) {
    model::Gpt2Config c;
    c.n_layer = 12, c.n_head = 12, c.n_embd = 768, c.vocab_size = 50257, c.padded_vocab_size = 50304, c.block_size = 1024, c.bias = bias;
    const auto tensors = model::parameter_layout(c);
    const auto parts = forward_order_parts(tensors);
    ASSERT_EQ(parts.size(), 14u);
    std::int64_t at = 0, total = 0;
    for (const auto& t : tensors) total = std::max(total, t.offset + t.size);
    for (const auto& r : parts) {
      EXPECT_EQ(r.begin, at);
      EXPECT_FALSE(r.empty());
      at = r.end;
    }
    EXPECT_EQ(at, total);
    const std::int64_t C = 768;
    EXPECT_EQ(parts[0].size(), (50304 + 1024) * C);  // wte, wpe
    const std::int64_t layer = 12 * C * C + (bias ? 13 * C : 2 * C);  // 4 matrices, 2 LayerNorm weights (+ their biases and 4 more: 11C)
    for (int l = 1; l <= 12; ++l) EXPECT_EQ(parts[std::size_t(l)].size(), layer) << "layer " << l - 1;
    EXPECT_EQ(parts[13].size(), bias ? 2 * C : C);  // ln_f
    for (const auto& t : tensors)  // every tensor lies in one part
      EXPECT_EQ(ranges_touching(parts, {t.offset, t.offset + t.size}).second - ranges_touching(parts, {t.offset, t.offset + t.size}).first, 1)
          << t.name;
  }
  // A layout without layers or ln_f is one part.
  const auto one = forward_order_parts(layout({{10, ParamRole::vector}}));
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0], (FlatRange{0, 10}));
}

TEST(ShardPlan, StateRoundTripsThroughShardsForAnyWorld) {
  const auto t = layout({{1001, ParamRole::embedding}, {40, ParamRole::hidden_matrix}, {7, ParamRole::vector}, {13, ParamRole::vector}});
  std::vector<float> full(1061);
  std::iota(full.begin(), full.end(), 1.0f);
  for (auto kind : {OptimizerKind::adamw, OptimizerKind::muon})
    for (int W : {1, 2, 3, 4, 8}) {
      SCOPED_TRACE("world " + std::to_string(W));
      const ShardPlan p = ShardPlan::make(t, kind, W, 64);
      std::vector<float> back(full.size(), -1.0f);
      // Gathering in any rank order gives the full vector back (replicated parts agree).
      for (int r = W - 1; r >= 0; --r) {
        std::vector<float> shard(std::size_t(p.owned_count()));
        take_shard(p, r, full, shard);
        put_shard(p, r, shard, back);
      }
      EXPECT_EQ(back, full);
    }
}

TEST(ShardPlan, ErrorsNameTheRankAndSizes) {
  const auto t = layout({{100, ParamRole::embedding}});
  EXPECT_THROW(ShardPlan::make(t, OptimizerKind::adamw, 0, 10), std::invalid_argument);
  EXPECT_THROW(ShardPlan::make(t, OptimizerKind::adamw, 4, 3), std::invalid_argument);
  const ShardPlan p = ShardPlan::make(t, OptimizerKind::adamw, 2, 30);
  std::vector<float> full(100), shard(49);
  try {
    take_shard(p, 1, full, shard);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("50 per rank"), std::string::npos) << e.what();
  }
  std::vector<float> ok(50);
  EXPECT_THROW(put_shard(p, 2, ok, full), std::invalid_argument);
}

}  // namespace
}  // namespace stableflash::optim
