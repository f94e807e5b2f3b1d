// ZeRO-1 shard plan and the optimizer-state arithmetic of checkpoints (see sharding.hpp).
#include "stableflash/optim/sharding.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace stableflash::optim {
namespace {

std::int64_t round_down(std::int64_t x, std::int64_t m) { return x / m * m; }
std::int64_t round_up(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }

// Splits [lo, hi) into buckets of about `target` elements from the top down; every cut is a
// multiple of `align` (lo and hi are), so every bucket's length is too.
void cut_region(std::int64_t lo, std::int64_t hi, std::int64_t target, std::int64_t align, bool replicated,
                std::vector<GradientBucket>& out_descending) {
  for (std::int64_t end = hi; end > lo;) {
    const std::int64_t begin = std::max(lo, round_up(end - target, align));
    out_descending.push_back({{begin, end}, replicated});
    end = begin;
  }
}

}  // namespace

FlatRange GradientBucket::owned(int rank, int world) const {
  if (replicated) return range;
  const std::int64_t piece = range.size() / world;
  return {range.begin + rank * piece, range.begin + (rank + 1) * piece};
}

FlatRange GradientBucket::norm_slice(int rank, int world) const {
  if (!replicated) return owned(rank, world);
  const std::int64_t n = range.size();
  return {range.begin + n * rank / world, range.begin + n * (rank + 1) / world};
}

ShardPlan ShardPlan::make(const std::vector<model::ParamTensor>& tensors, OptimizerKind kind, int world, std::int64_t bucket_elements,
                          bool replicate_all, bool split_token_embedding) {
  if (world < 1) throw std::invalid_argument("shard plan: world size " + std::to_string(world) + " < 1");
  if (bucket_elements < world)
    throw std::invalid_argument("shard plan: buckets of " + std::to_string(bucket_elements) + " elements cannot be split over " +
                                std::to_string(world) + " ranks");
  ShardPlan p;
  p.world_ = world;
  std::int64_t muon_lo = -1, muon_hi = -1;  // the span of Muon's matrices
  for (const auto& t : tensors) {
    p.total_ = std::max(p.total_, t.offset + t.size);
    if (kind == OptimizerKind::muon && t.role == model::ParamRole::hidden_matrix && t.size > 0) {
      muon_lo = muon_lo < 0 ? t.offset : std::min(muon_lo, t.offset);
      muon_hi = std::max(muon_hi, t.offset + t.size);
    }
  }
  // The token embedding split: wte first in the layout, Vp rows that the ranks share evenly, and
  // parameters above it (else there is nothing to overlap its reduction with).
  std::int64_t base = 0;  // the regions below start here; the split's bucket is [0, base)
  if (split_token_embedding)
    for (const auto& t : tensors)
      if (t.name == "transformer.wte.weight" && t.offset == 0 && t.is_2d() && t.shape[0] % world == 0 && t.size < p.total_ &&
          (muon_lo < 0 || muon_lo >= t.size)) {
        p.embedding_ = {t.shape[0], t.shape[1]};
        base = t.size;
      }
  // Regions between forced cuts: [base, sharded end) is sharded except Muon's span (widened to
  // multiples of the world size), and the last total % world elements are replicated.
  const std::int64_t w = world, sharded_end = round_down(p.total_, w);
  std::vector<GradientBucket> descending;
  if (sharded_end < p.total_) descending.push_back({{sharded_end, p.total_}, true});
  if (replicate_all) {
    cut_region(base, sharded_end, bucket_elements, w, true, descending);
  } else if (muon_lo < 0) {
    cut_region(base, sharded_end, bucket_elements, w, false, descending);
  } else {
    const std::int64_t hi = std::min(sharded_end, round_up(muon_hi, w)), lo = std::max(base, std::min(hi, round_down(muon_lo, w)));
    cut_region(hi, sharded_end, bucket_elements, w, false, descending);
    cut_region(lo, hi, bucket_elements, w, true, descending);
    cut_region(base, lo, bucket_elements, w, false, descending);
  }
  // One bucket, whatever bucket_elements says: its pieces must be whole rows, and its reduction
  // overlaps the whole backward anyway.
  if (base > 0) descending.push_back({{0, base}, replicate_all});
  p.buckets_.assign(descending.rbegin(), descending.rend());
  return p;
}

std::vector<FlatRange> ShardPlan::owned(int rank) const {
  std::vector<FlatRange> out;
  for (const auto& b : buckets_) {
    const FlatRange r = b.owned(rank, world_);
    if (r.empty()) continue;
    if (!out.empty() && out.back().end == r.begin) out.back().end = r.end;  // adjacent replicated buckets
    else out.push_back(r);
  }
  return out;
}

std::int64_t ShardPlan::owned_count() const {
  std::int64_t n = 0;
  for (const auto& b : buckets_) n += b.owned(0, world_).size();
  return n;
}

std::vector<FlatRange> ShardPlan::norm_slices(int rank) const {
  std::vector<FlatRange> out;
  for (const auto& b : buckets_)
    if (const FlatRange r = b.norm_slice(rank, world_); !r.empty()) out.push_back(r);
  return out;
}

std::pair<int, int> ShardPlan::buckets_touching(FlatRange r) const {
  if (r.empty()) return {0, 0};
  const auto first = std::upper_bound(buckets_.begin(), buckets_.end(), r.begin,
                                      [](std::int64_t x, const GradientBucket& b) { return x < b.range.end; });
  const auto last = std::lower_bound(first, buckets_.end(), r.end, [](const GradientBucket& b, std::int64_t x) { return b.range.begin < x; });
  return {int(first - buckets_.begin()), int(last - buckets_.begin())};
}

FlatRange ShardPlan::owned_token_rows(int rank) const {
  if (!token_embedding()) throw std::logic_error("shard plan: no token embedding split");
  const GradientBucket& b = buckets_.front();
  const FlatRange r = b.owned(rank, world_);
  return {r.begin / embedding_.row_size, r.end / embedding_.row_size};
}

std::vector<FlatRange> ShardPlan::token_rows_by_owner(std::span<const int> ascending_ids) const {
  std::vector<FlatRange> out;
  for (int q = 0; q < world_; ++q) {
    const FlatRange rows = owned_token_rows(q);
    const auto first = std::lower_bound(ascending_ids.begin(), ascending_ids.end(), rows.begin);
    const auto last = std::lower_bound(first, ascending_ids.end(), rows.end);
    out.push_back({first - ascending_ids.begin(), last - ascending_ids.begin()});
  }
  return out;
}

std::pair<int, int> ranges_touching(const std::vector<FlatRange>& ascending, FlatRange r) {
  if (r.empty()) return {0, 0};
  const auto first = std::upper_bound(ascending.begin(), ascending.end(), r.begin, [](std::int64_t x, const FlatRange& b) { return x < b.end; });
  const auto last = std::lower_bound(first, ascending.end(), r.end, [](const FlatRange& b, std::int64_t x) { return b.begin < x; });
  return {int(first - ascending.begin()), int(last - ascending.begin())};
}

std::vector<FlatRange> forward_order_parts(const std::vector<model::ParamTensor>& tensors) {
  std::int64_t total = 0;
  for (const auto& t : tensors) total = std::max(total, t.offset + t.size);
  auto offset_of = [&](const std::string& name) -> std::int64_t {
    for (const auto& t : tensors)
      if (t.name == name) return t.offset;
    return -1;
  };
  std::vector<std::int64_t> cuts = {0};
  for (int l = 0;; ++l) {
    const std::int64_t at = offset_of("transformer.h." + std::to_string(l) + ".ln_1.weight");
    if (at < 0) break;
    cuts.push_back(at);
  }
  if (const std::int64_t lnf = offset_of("transformer.ln_f.weight"); lnf >= 0) cuts.push_back(lnf);
  cuts.push_back(total);
  std::vector<FlatRange> parts;
  for (std::size_t k = 0; k + 1 < cuts.size(); ++k) {
    if (cuts[k + 1] < cuts[k]) throw std::logic_error("forward_order_parts: the parameter layout is not [embeddings, layers, ln_f]");
    if (cuts[k + 1] > cuts[k]) parts.push_back({cuts[k], cuts[k + 1]});
  }
  return parts;
}

namespace {

void check_sizes(const ShardPlan& plan, int rank, std::size_t full, std::size_t shard, const char* what) {
  if (rank < 0 || rank >= plan.world())
    throw std::invalid_argument(std::string(what) + ": rank " + std::to_string(rank) + " is not in [0, " + std::to_string(plan.world()) + ")");
  if (std::int64_t(full) != plan.total() || std::int64_t(shard) != plan.owned_count())
    throw std::invalid_argument(std::string(what) + " (rank " + std::to_string(rank) + "): " + std::to_string(full) + " full and " +
                                std::to_string(shard) + " shard values; the plan has " + std::to_string(plan.total()) + " parameters, " +
                                std::to_string(plan.owned_count()) + " per rank");
}

}  // namespace

void take_shard(const ShardPlan& plan, int rank, std::span<const float> full, std::span<float> shard) {
  check_sizes(plan, rank, full.size(), shard.size(), "take_shard");
  std::int64_t at = 0;
  for (const FlatRange& r : plan.owned(rank)) {
    std::copy(full.begin() + r.begin, full.begin() + r.end, shard.begin() + at);
    at += r.size();
  }
}

void put_shard(const ShardPlan& plan, int rank, std::span<const float> shard, std::span<float> full) {
  check_sizes(plan, rank, full.size(), shard.size(), "put_shard");
  std::int64_t at = 0;
  for (const FlatRange& r : plan.owned(rank)) {
    std::copy(shard.begin() + at, shard.begin() + at + r.size(), full.begin() + r.begin);
    at += r.size();
  }
}

}  // namespace stableflash::optim
