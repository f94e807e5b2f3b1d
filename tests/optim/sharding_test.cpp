// The ZeRO-1 shard plan (stableflash/optim/sharding.hpp): every property the collectives and the
// sharded optimizer rely on, on the real GPT-2 layouts and on odd sizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
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


// ---------------------------------------------------------------------------------------------
// Token embedding split (the trainer's data_parallel_sync.hpp follows it).

TEST(ShardPlan, TokenEmbeddingSplitIsOneBucketOfWholeRowsPerRank) {
  const auto t = gpt2_124m();
  const std::int64_t Vp = 50304, C = 768, bucket = 25'000'000 / 4;
  for (bool replicate_all : {false, true})
    for (int W : {1, 2, 3, 4, 8}) {  // divisors of 50304 = 2^7 3 131
      SCOPED_TRACE("world " + std::to_string(W) + (replicate_all ? ", all-reduce" : ", ZeRO-1"));
      const ShardPlan p = ShardPlan::make(t, OptimizerKind::adamw, W, bucket, replicate_all, /*split_token_embedding=*/true);
      expect_consistent(p);
      ASSERT_NE(p.token_embedding(), nullptr);
      EXPECT_EQ(p.token_embedding()->rows, Vp);
      EXPECT_EQ(p.token_embedding()->row_size, C);
      EXPECT_EQ(p.buckets().front().range, (FlatRange{0, Vp * C}));
      EXPECT_EQ(p.buckets().front().replicated, replicate_all);
      // Above wte: the usual buckets, cut from the top.
      for (std::size_t i = 1; i < p.buckets().size(); ++i) EXPECT_LE(p.buckets()[i].range.size(), bucket);
      for (std::size_t i = 2; i < p.buckets().size(); ++i) EXPECT_GT(p.buckets()[i].range.size(), bucket - W);
      std::int64_t at = 0;
      for (int q = 0; q < W; ++q) {
        const FlatRange rows = p.owned_token_rows(q);
        if (replicate_all) {
          EXPECT_EQ(rows, (FlatRange{0, Vp}));
        } else {
          // Whole rows, rank q's piece of bucket 0: Vp / W rows in rank order.
          EXPECT_EQ(rows, (FlatRange{at, at + Vp / W}));
          EXPECT_EQ(p.buckets().front().owned(q, W), (FlatRange{rows.begin * C, rows.end * C}));
          at = rows.end;
        }
      }
      if (!replicate_all) {
        EXPECT_EQ(p.owned_count() * W, p.total());
      }
    }
  // 50304 % 5 != 0: no split, the plan without it.
  const ShardPlan five = ShardPlan::make(t, OptimizerKind::adamw, 5, bucket, false, true);
  EXPECT_EQ(five.token_embedding(), nullptr);
  const ShardPlan plain = ShardPlan::make(t, OptimizerKind::adamw, 5, bucket);
  ASSERT_EQ(five.buckets().size(), plain.buckets().size());
  for (std::size_t i = 0; i < plain.buckets().size(); ++i) EXPECT_EQ(five.buckets()[i].range, plain.buckets()[i].range);
  // Muon: wte (AdamW) split, the hidden matrices still replicated whole.
  const ShardPlan muon = ShardPlan::make(t, OptimizerKind::muon, 2, bucket, false, true);
  expect_consistent(muon);
  ASSERT_NE(muon.token_embedding(), nullptr);
  for (const auto& x : t) {
    if (x.role != ParamRole::hidden_matrix) continue;
    const auto [first, last] = muon.buckets_touching({x.offset, x.offset + x.size});
    for (int b = first; b < last; ++b) EXPECT_TRUE(muon.buckets()[std::size_t(b)].replicated) << x.name;
  }
}

TEST(ShardPlan, TokenRowsByOwnerSplitsAscendingIdsAtTheOwnersRows) {
  const auto t = gpt2_124m();
  const ShardPlan p = ShardPlan::make(t, OptimizerKind::adamw, 4, 6'250'000, false, true);
  const int Q = 50304 / 4;  // rows per rank
  const std::vector<int> ids = {0, 5, Q - 1, 2 * Q, 2 * Q + 1, 4 * Q - 1};
  const auto runs = p.token_rows_by_owner(ids);
  ASSERT_EQ(runs.size(), 4u);
  EXPECT_EQ(runs[0], (FlatRange{0, 3}));
  EXPECT_EQ(runs[1], (FlatRange{3, 3}));  // none of rank 1's rows
  EXPECT_EQ(runs[2], (FlatRange{3, 5}));
  EXPECT_EQ(runs[3], (FlatRange{5, 6}));
  EXPECT_TRUE(p.token_rows_by_owner({})[2].empty());
  const ShardPlan all = ShardPlan::make(t, OptimizerKind::adamw, 4, 6'250'000, /*replicate_all=*/true, true);
  for (const FlatRange& r : all.token_rows_by_owner(ids)) EXPECT_EQ(r, (FlatRange{0, 6}));  // everyone needs every row
  EXPECT_THROW(ShardPlan::make(t, OptimizerKind::adamw, 4, 6'250'000).owned_token_rows(0), std::logic_error);
}

// W simulated ranks, each with a dense wte gradient (the classifier's) and lookup rows for its
// batch's distinct ids. What the trainer computes with the split: the dense parts summed (NCCL:
// ascending ranks here), then each owner adds the rows the other ranks sent it (the runs of
// token_rows_by_owner, which is what they send) and its own, in rank order. Against the dense
// reduction (every rank adds its rows first, then the sum over ranks), both in FP32, and the FP64
// sum: each is a recursive FP32 sum of at most 2W terms, so it errs by at most
// (2W - 1) u sum|terms| (first order, u = 2^-24). A row lost, sent twice or sent to the wrong
// owner is off by a whole row, far outside that.
TEST(ShardPlan, SplitEmbeddingReductionMatchesTheDenseOneWithinTheSummationBound) {
  constexpr int Vp = 48, C = 5, N = 40;
  std::vector<ParamTensor> t = {{"transformer.wte.weight", {Vp, C}, 0, Vp * C, ParamRole::embedding},
                                {"rest", {1, 70}, Vp * C, 70, ParamRole::hidden_matrix}};
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (bool replicate_all : {false, true})
    for (int W : {1, 2, 3, 4}) {
      SCOPED_TRACE("world " + std::to_string(W) + (replicate_all ? ", all-reduce" : ", ZeRO-1"));
      const ShardPlan p = ShardPlan::make(t, OptimizerKind::adamw, W, 64, replicate_all, true);
      ASSERT_NE(p.token_embedding(), nullptr);
      std::vector<std::vector<float>> dense(W, std::vector<float>(Vp * C));
      std::vector<std::vector<int>> ids(W);             // distinct, ascending
      std::vector<std::vector<float>> rows(W);          // [ids, C]
      for (int r = 0; r < W; ++r) {
        for (float& x : dense[r]) x = normal(gen);
        std::set<int> batch;
        for (int n = 0; n < N; ++n) batch.insert(int(gen() % (Vp / 2)) * (r % 2 ? 2 : 1));  // overlapping, uneven over owners
        ids[r].assign(batch.begin(), batch.end());
        for (std::size_t u = 0; u < ids[r].size() * C; ++u) rows[r].push_back(normal(gen) * 4.0f);
      }
      auto row_of = [&](int r, int v, int c, float& out) {
        const auto it = std::lower_bound(ids[r].begin(), ids[r].end(), v);
        if (it == ids[r].end() || *it != v) return false;
        out = rows[r][std::size_t(it - ids[r].begin()) * C + std::size_t(c)];
        return true;
      };
      // The dense reduction and the exact sum, with sum|terms| for the bound.
      std::vector<float> plain(Vp * C, 0.0f);
      std::vector<double> exact(Vp * C, 0.0), magnitude(Vp * C, 0.0);
      for (int v = 0; v < Vp; ++v)
        for (int c = 0; c < C; ++c) {
          const std::size_t i = std::size_t(v) * C + std::size_t(c);
          for (int r = 0; r < W; ++r) {
            float local = dense[r][i], s = 0.0f;
            exact[i] += dense[r][i], magnitude[i] += std::fabs(dense[r][i]);
            if (row_of(r, v, c, s)) local += s, exact[i] += s, magnitude[i] += std::fabs(s);
            plain[i] = r == 0 ? local : plain[i] + local;
          }
        }
      // The split, owner by owner, from what each rank sends it.
      int covered = 0;
      for (int q = 0; q < W; ++q) {
        const FlatRange own = p.owned_token_rows(q);
        std::vector<float> g(Vp * C, 0.0f);
        for (std::int64_t i = own.begin * C; i < own.end * C; ++i)
          for (int r = 0; r < W; ++r) g[std::size_t(i)] = r == 0 ? dense[r][std::size_t(i)] : g[std::size_t(i)] + dense[r][std::size_t(i)];
        for (int r = 0; r < W; ++r) {
          const FlatRange run = p.token_rows_by_owner(ids[r])[std::size_t(q)];
          for (std::int64_t u = run.begin; u < run.end; ++u) {
            const int v = ids[r][std::size_t(u)];
            ASSERT_TRUE(v >= own.begin && v < own.end) << "rank " << r << " sends row " << v << " to rank " << q;
            for (int c = 0; c < C; ++c) g[std::size_t(v) * C + std::size_t(c)] += rows[r][std::size_t(u) * C + std::size_t(c)];
          }
        }
        for (std::int64_t i = own.begin * C; i < own.end * C; ++i) {
          const double bound = (2 * W - 1) * std::ldexp(1.0, -24) * magnitude[std::size_t(i)] * (1 + 1e-6);
          EXPECT_LE(std::fabs(double(g[std::size_t(i)]) - exact[std::size_t(i)]), bound) << "owner " << q << ", element " << i;
          EXPECT_LE(std::fabs(double(plain[std::size_t(i)]) - exact[std::size_t(i)]), bound) << "element " << i;
          ++covered;
        }
      }
      EXPECT_EQ(covered, (replicate_all ? W : 1) * Vp * C);  // every row has an owner (every rank's, all-reduce)
    }
}
}  // namespace
}  // namespace stableflash::optim
