// ZeRO-1 sharding of the flat parameter vector over the ranks of a data-parallel run: which
// collective reduces which part of the gradient, which rank updates which parameters (and keeps
// their optimizer state), and the arithmetic that moves optimizer state between one full vector
// (checkpoints) and the ranks' shards. Host arithmetic only: the CUDA optimizer and the trainer's
// collectives follow the plan; CPU tests check it.
//
// The plan cuts [0, total) into gradient buckets of about `bucket_elements`, from the top down
// (the backward finishes the gradients from the last layer to the embeddings, so the top bucket
// is reduced first). A bucket is
//   - sharded: its length is a multiple of the world size; ncclReduceScatter leaves rank r the
//     summed gradient of the r-th equal piece, rank r updates that piece alone (AdamW is
//     element-wise) and ncclAllGather hands the updated piece to every rank; or
//   - replicated: all-reduced, and every rank updates all of it (Muon's hidden matrices, whose
//     Newton-Schulz iteration needs the whole matrix, and the < world elements at the very end
//     when the total is not a multiple of the world size).
// Each rank's shard is therefore one contiguous piece of every sharded bucket, not one contiguous
// range of the whole vector: a contiguous range per rank would make the embeddings' bucket (ready
// last) a reduction to one rank over one link direction, twice the exposed time of a
// reduce-scatter on two GPUs (docs/benchmarks.md, "Data parallel").
//
// Token embedding split (split_token_embedding): the tied wte's gradient is the classifier's dense
// product, complete before the layers' backward, plus the embedding lookup's rows, known only at
// its very end. The plan then makes wte [0, Vp·C) one bucket of its own whose W pieces are whole
// rows (Vp % W == 0): rank q owns the rows owned_token_rows(q). The trainer reduces that bucket's
// dense part as soon as the classifier is done, overlapped with the whole backward, and at the end
// sends each rank only the lookup rows it owns (train/data_parallel_sync.hpp). Without wte at
// offset 0, with Vp % W != 0 or with a single bucket's worth of parameters, no split.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "stableflash/model/gpt2.hpp"
#include "stableflash/optim/optimizer.hpp"

namespace stableflash::optim {

// [begin, end) of the flat parameter vector.
struct FlatRange {
  std::int64_t begin = 0, end = 0;
  std::int64_t size() const { return end - begin; }
  bool empty() const { return end <= begin; }
  bool operator==(const FlatRange&) const = default;
};

struct GradientBucket {
  FlatRange range;
  bool replicated = false;

  // The part rank `rank` updates: the rank-th of `world` equal pieces (sharded), the whole range
  // (replicated).
  FlatRange owned(int rank, int world) const;
  // The part whose squares rank `rank` adds to the global gradient norm, so that every element
  // counts exactly once over the ranks: its owned piece (sharded), a balanced 1/world slice
  // (replicated; every rank holds the whole summed gradient there).
  FlatRange norm_slice(int rank, int world) const;
};

// The token embedding bucket of a split plan: wte [0, rows · row_size), bucket 0.
struct TokenEmbeddingSplit {
  std::int64_t rows = 0, row_size = 0;  // Vp, C
};

class ShardPlan {
 public:
  // `tensors`: the model's flat layout. Muon's hidden matrices (kind == muon) land in replicated
  // buckets; `replicate_all` makes every bucket replicated (plain all-reduce data parallelism,
  // every rank keeps the whole optimizer state). Throws std::invalid_argument for world < 1 or
  // bucket_elements < world.
  // split_token_embedding: the token embedding bucket above, where the layout allows it.
  static ShardPlan make(const std::vector<model::ParamTensor>& tensors, OptimizerKind kind, int world, std::int64_t bucket_elements,
                        bool replicate_all = false, bool split_token_embedding = false);

  int world() const { return world_; }
  std::int64_t total() const { return total_; }
  // Ascending and contiguous: buckets()[0].range.begin == 0, the last ends at total().
  const std::vector<GradientBucket>& buckets() const { return buckets_; }

  // What `rank` updates, ascending; its optimizer state is these ranges concatenated (the
  // "compact" layout of take_shard / put_shard).
  std::vector<FlatRange> owned(int rank) const;
  // The same count for every rank (sharded pieces are equal; replicated buckets are everyone's).
  std::int64_t owned_count() const;
  std::vector<FlatRange> norm_slices(int rank) const;
  // Indices [first, last) of the buckets that intersect `r` (empty r: first == last).
  std::pair<int, int> buckets_touching(FlatRange r) const;

  // The token embedding split, if this plan has one (bucket 0 is then wte).
  const TokenEmbeddingSplit* token_embedding() const { return embedding_.rows > 0 ? &embedding_ : nullptr; }
  // Rows [begin, end) of wte whose summed gradient `rank` needs: its piece of bucket 0 (sharded),
  // every row (replicated). Requires token_embedding().
  FlatRange owned_token_rows(int rank) const;
  // For each rank q, the index range [first, last) of `ascending_ids` (distinct token ids,
  // ascending, as the batch staging groups them) that falls in owned_token_rows(q): what this
  // rank sends to q. Requires token_embedding().
  std::vector<FlatRange> token_rows_by_owner(std::span<const int> ascending_ids) const;

 private:
  int world_ = 1;
  std::int64_t total_ = 0;
  std::vector<GradientBucket> buckets_;
  TokenEmbeddingSplit embedding_;
};

// Indices [first, last) of the ranges of `ascending` (sorted, non-overlapping) that intersect `r`
// (empty r: first == last).
std::pair<int, int> ranges_touching(const std::vector<FlatRange>& ascending, FlatRange r);

// The parts of a GPT-2 flat parameter vector in the order its forward reads them, as the CUDA
// model's parameters-needed hook announces them: the embeddings [0, layer 0) (wte, wpe), each
// layer [h.l.ln_1.weight, h.(l+1).ln_1.weight), then the rest [ln_f.weight, total) (ln_f):
// ascending and contiguous over [0, total). What the one-GPU trainer updates part by part while
// the next forward starts (train.overlap_optimizer). Throws std::logic_error for a layout in
// another order.
std::vector<FlatRange> forward_order_parts(const std::vector<model::ParamTensor>& tensors);

// Optimizer state between a full flat vector (a checkpoint's layout) and rank `rank`'s compact
// shard (plan.owned(rank) concatenated). Errors name the rank and the sizes.
void take_shard(const ShardPlan& plan, int rank, std::span<const float> full, std::span<float> shard);
// Writes the owned ranges of `full` from the shard; calling it for every rank fills all of `full`
// (replicated ranges are written by each rank with the same values).
void put_shard(const ShardPlan& plan, int rank, std::span<const float> shard, std::span<float> full);

}  // namespace stableflash::optim
