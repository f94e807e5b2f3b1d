// The launch plan (plan.hpp) and the argument checks of the CUDA path: host code, built with and
// without CUDA so that the CPU tests can check what each call would run.
#include "plan.hpp"

#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "stableflash/attention/attention.hpp"
#include "stableflash/attention/cuda.hpp"
#include "tail_pieces.hpp"
#include "walk_order.hpp"

namespace stableflash::attention::cuda {
namespace {

// What the kernels need of one tensor's memory: every row (b, h, t) starts `align` bytes aligned,
// i.e. the base address and the three strides (in bytes) are multiples of `align`. Strides are
// non-negative (bulk tensor copies take unsigned ones). The one place these rules are decided:
// forward_tensors / backward_tensors list every tensor with its need, check_tensor applies it.
struct TensorNeed {
  const char* field;         // the args' pointer (messages): q, k, v, o, o_residual, do, dq, dk, dv
  const char* stride_field;  // its entry in args.strides (o_residual follows o)
  const void* ptr;           // null: not passed (optional tensors; delta has no gradients)
  HeadStrides strides;
  int align;                 // bytes
  const char* why;
};

constexpr const char* kBulkReads = "read by bulk tensor copies (TMA) and 16-byte loads";
constexpr const char* kPairStores = "written two values at a time; 16-byte aligned rows also allow bulk stores";
constexpr const char* kGradientStores = "written up to four values (8 bytes) at a time";

bool rows_aligned(const void* ptr, const HeadStrides& st, int align) { return cuda::rows_aligned(ptr, st.b, st.h, st.t, align); }

void check_tensor(const TensorNeed& n) {
  if (!n.ptr) return;
  const std::string need = " (" + std::string(n.why) + ")";
  if (reinterpret_cast<std::uintptr_t>(n.ptr) % n.align != 0)
    throw std::invalid_argument(std::string("CUDA attention: ") + n.field + " must be " + std::to_string(n.align) +
                                "-byte aligned" + need);
  const std::pair<const char*, std::int64_t> strides[] = {{"b", n.strides.b}, {"h", n.strides.h}, {"t", n.strides.t}};
  for (const auto& [dim, elements] : strides) {
    const std::string name = std::string("CUDA attention: strides.") + n.stride_field + "." + dim + " = " + std::to_string(elements);
    if (elements < 0) throw std::invalid_argument(name + " is negative; the kernels need non-negative strides");
    if ((elements * 2) % n.align != 0)
      throw std::invalid_argument(name + " must be a multiple of " + std::to_string(n.align / 2) + " elements (" +
                                  std::to_string(n.align) + " bytes)" + need);
  }
}

std::vector<TensorNeed> forward_tensors(const ForwardArgs& a) {
  return {{"q", "q", a.q, a.q_strides(), 16, kBulkReads},
          {"k", "k", a.k, a.k_strides(), 16, kBulkReads},
          {"v", "v", a.v, a.v_strides(), 16, kBulkReads},
          {"o", "o", a.o, a.o_strides(), 4, kPairStores},
          {"o_residual", "o", a.o_residual, a.o_strides(), 4, kPairStores}};
}

std::vector<TensorNeed> backward_tensors(const BackwardArgs& a) {
  return {{"q", "q", a.q, a.q_strides(), 16, kBulkReads},
          {"k", "k", a.k, a.k_strides(), 16, kBulkReads},
          {"v", "v", a.v, a.v_strides(), 16, kBulkReads},
          {"o", "o", a.o, a.o_strides(), 16, kBulkReads},
          {"o_residual", "o", a.o_residual, a.o_strides(), 16, kBulkReads},
          {"do", "d_o", a.d_o, a.d_o_strides(), 16, kBulkReads},
          {"dq", "dq", a.dq, a.dq_strides(), 8, kGradientStores},
          {"dk", "dk", a.dk, a.dk_strides(), 8, kGradientStores},
          {"dv", "dv", a.dv, a.dv_strides(), 8, kGradientStores}};
}

std::size_t aligned256(std::size_t n) { return (n + 255) / 256 * 256; }

// The index checks below, in 64 bits: a shape near the limits must not overflow on the way.
std::int64_t blocks(int len, int block) { return (std::int64_t(len) + block - 1) / block; }
std::int64_t rounded_up(int len, int block) { return blocks(len, block) * block; }
// A product of counts (each >= 1; batch * heads * blocks of ints can reach 2^86), saturated at
// 2^63 - 1 where it leaves 64 bits: the checks only compare it with 2^31.
constexpr std::int64_t kSaturated = INT64_MAX;
std::int64_t product(std::initializer_list<std::int64_t> factors) {
  std::int64_t p = 1;
  for (const std::int64_t f : factors)
    if (__builtin_mul_overflow(p, f, &p)) return kSaturated;
  return p;
}
void below_2_31(std::int64_t n, const char* pass, const char* what) {
  if (n >= (std::int64_t(1) << 31))
    throw std::invalid_argument(std::string("CUDA attention ") + pass + ": " + what + " must be below 2^31, got " +
                                (n == kSaturated ? std::string("more than 2^63") : std::to_string(n)));
}
// CUDA's limit on a grid's y and z dimensions (x takes up to 2^31 - 1).
void grid_y_or_z(int n, const char* pass, const char* what) {
  if (n > 65535)
    throw std::invalid_argument(std::string("CUDA attention ") + pass + ": " + what +
                                " must be at most 65535 (CUDA's limit on a grid's y and z), got " + std::to_string(n));
}

// What the forward's kernels index in 32 bits (forward_instances.cu.in launches them without
// further checks): the grid (query blocks, heads, batch), the row after a CTA's last (cta_keys: m0 +
// rows per CTA) and the key after the walk's last step (the fast path's (n_keys + step - 1) / step
// and its masks; the numerics-tile walk's start of the tile after the last), i.e. q_len and k_len
// rounded up to whole CTAs and steps. kForwardMaxBlock is the warp-specialized kernel's CTA and
// step; the one-warpgroup kernel (64-row CTAs) could take 64 rows more.
void check_forward_index_ranges(const AttentionShape& s, const AttentionOptions& opt) {
  grid_y_or_z(s.heads, "forward", "heads (the grid's y)");
  grid_y_or_z(s.batch, "forward", "batch (the grid's z)");
  below_2_31(rounded_up(s.q_len, kForwardMaxBlock), "forward", "q_len rounded up to the largest CTA (kForwardMaxBlock rows)");
  below_2_31(rounded_up(s.k_len, kForwardMaxBlock), "forward", "k_len rounded up to the largest key step (within kForwardMaxBlock keys)");
  below_2_31(rounded_up(s.k_len, opt.resolved_tile_k()), "forward", "k_len rounded up to whole key tiles (tile_k)");
  // the warp-specialized kernel numbers its tiles (64 or more rows each) and a last round's 64-row
  // items (one or more 64-row blocks, tail_pieces.hpp) in 32 bits (WsTileOrder): at most the 64-row
  // blocks of whole 192-row tiles
  below_2_31(product({s.batch, s.heads, blocks(s.q_len, 192) * 3}), "forward",
             "batch * heads * blocks of 64 query rows in whole tiles of 192 (the tiles and items)");
}

// What the backward's kernels index in 32 bits (backward_instances.cu.in and group_sum.cu launch
// them without further checks): the δ pass's rows of one batch element, the query blocks the main
// kernel and the exact δ pass walk, the main kernel's 1-d grid of CTAs, the dQ conversion's [64, 64]
// tiles (one CTA each); the exact δ pass's grid (query blocks, heads, batch) and key steps of 64;
// the group sum's 1-d grid (grouped-query heads).
void check_backward_index_ranges(const AttentionShape& s, const AttentionOptions& opt) {
  below_2_31(product({s.heads, s.q_len}), "backward", "heads * q_len (the delta pass's rows of a batch element)");
  below_2_31(rounded_up(s.q_len, kBackwardBlockQ), "backward", "q_len rounded up to query blocks of 64");
  below_2_31(product({s.batch, s.heads, blocks(s.k_len, kBackwardBlockK)}), "backward",
             "batch * heads * key blocks of 128 (the backward's CTAs)");
  below_2_31(product({s.batch, s.heads, blocks(s.q_len, kBackwardBlockQ), s.head_dim / 64}), "backward",
             "batch * heads * query blocks of 64 * head_dim / 64 (the dQ conversion's tiles)");
  if (opt.delta_source == DeltaSource::exact) {
    grid_y_or_z(s.heads, "backward", "heads (the exact delta pass's grid y)");
    grid_y_or_z(s.batch, "backward", "batch (the exact delta pass's grid z)");
    below_2_31(rounded_up(s.k_len, 64), "backward", "k_len rounded up to the exact delta pass's steps of 64 keys");
  }
  if (s.group_size() > 1) {
    const std::int64_t threads = product({s.batch, s.resolved_kv_heads(), s.k_len, s.head_dim / 4});
    below_2_31(threads / kGroupSumThreads + (threads % kGroupSumThreads != 0), "backward",
               "batch * kv_heads * k_len * head_dim / 4 / 256 (the group sum's CTAs)");
  }
}

}  // namespace

bool rows_aligned(const void* ptr, std::int64_t stride_b, std::int64_t stride_h, std::int64_t stride_t, int align) {
  const auto multiple = [&](std::int64_t elements) { return elements >= 0 && (elements * 2) % align == 0; };
  return reinterpret_cast<std::uintptr_t>(ptr) % align == 0 && multiple(stride_b) && multiple(stride_h) && multiple(stride_t);
}

void check_shape_options(const AttentionShape& s, const AttentionOptions& opt, bool head_dim_compiled) {
  opt.validate(s);
  if (opt.numerics == Numerics::reference)
    throw std::invalid_argument("numerics: 'reference' runs on the CPU only (FP64 oracle)");
  if (!head_dim_compiled)
    throw std::invalid_argument("CUDA attention: head_dim " + std::to_string(s.head_dim) +
                                " has no kernels in this build (64 and 128 exist; STABLEFLASH_CUDA_HEAD_DIMS)");
  if (opt.resolved_tile_k() % kSubTile != 0)
    throw std::invalid_argument("tile: the CUDA kernels need a key tile that is a multiple of " +
                                std::to_string(kSubTile) + ", got " + std::to_string(opt.resolved_tile_k()));
}

void check_tensors(const ForwardArgs& a, const AttentionOptions& opt) {
  if (!a.q || !a.k || !a.v || !a.o || !a.lse) throw std::invalid_argument("attention_forward: q, k, v, o and lse are required");
  opt.require_residual(a.shape, a.o_residual != nullptr, "an o_residual output buffer");
  for (const TensorNeed& n : forward_tensors(a)) check_tensor(n);
  check_forward_index_ranges(a.shape, opt);
}

void check_tensors(const BackwardArgs& a, const AttentionOptions& opt) {
  if (!a.q || !a.k || !a.v || !a.o || !a.lse || !a.d_o)
    throw std::invalid_argument("attention_backward: q, k, v, o, lse and do are required");
  opt.require_residual(a.shape, a.o_residual != nullptr, "the forward's o_residual");
  for (const TensorNeed& n : backward_tensors(a)) check_tensor(n);
  check_backward_index_ranges(a.shape, opt);
}

bool takes_fast_path(Numerics numerics, ShiftPolicy policy, bool count_events) {
  const bool tile_tie_count =
      with_shift_policy(policy, PolicyParams{}, [](auto p) { return decltype(p)::needs_near_max_count; });
  return fast_path_instantiable(numerics == Numerics::paper, tile_tie_count) && !count_events;
}

// Keys a query row sees on average: all of them, or under the bottom-right causal mask k_len -
// q_len + i + 1 for row i (none where that is <= 0).
double mean_visible_keys(const AttentionShape& s, bool causal) {
  if (!causal) return s.k_len;
  const double q = s.q_len, k = s.k_len;
  return q <= k ? k - (q - 1) / 2 : k * (k + 1) / (2 * q);
}

bool takes_warp_specialized_forward(const AttentionShape& s, bool causal, int sms) {
  // Up to kOneWarpgroupMaxKeys keys there is nothing to pipeline, and several 64-row CTAs per SM
  // beat one CTA of two or three consumers, except at D = 128 where the persistent CTAs take
  // several tiles each: each tile's set-up and epilogue then run beside the next tile's copies
  // (measured, kernel_lab: 32,16,128,128 full +14%, causal +2%, with 512 tiles of 128 rows, 3.9
  // rounds on 132 SMs; 8,16,128,128 full -6% with 128 tiles, under one round). The bound of
  // kMinRoundsForShortRows rounds lies between the two.
  constexpr int kOneWarpgroupMaxKeys = 128;
  constexpr double kMinRoundsForShortRows = 2;
  if (s.k_len <= kOneWarpgroupMaxKeys) {
    if (s.head_dim != 128) return false;
    const double tiles = double(s.batch) * s.heads * blocks(s.q_len, 64 * ws_consumers_for(s, causal, sms));  // the kernel's tile rows
    return tiles >= kMinRoundsForShortRows * sms;
  }
  if (s.head_dim == 128 || !causal) return true;
  // D = 64 causal: where rows see on average kWsMinMeanCausalKeys keys or more. The three consumers'
  // 192-row tiles step 128 keys at a time, so on the diagonal they load steps that only some
  // consumers compute; on short causal rows that costs more than sharing each K/V tile three ways
  // gains. Measured with the causal tiles ending at the sequence's end (WsTileOrder::causal_lead;
  // docs/benchmarks.md): +5% at 1,024 x 1,024 (mean 512 keys) and 1,000 x 1,000, +20% with 48
  // heads of 1,024, -3% at 512 x 512 (mean 256); the bound lies between the two means.
  constexpr double kWsMinMeanCausalKeys = 384;
  return mean_visible_keys(s, causal) >= kWsMinMeanCausalKeys;
}

// Grids too small for the 128- or 192-row tiles to fill the SMs: 64-row tiles of one consumer each
// spread the rows over two or three times the SMs, with the same bits (the same walk and steps).
// Measured (H100, A/B against the larger tiles; docs/benchmarks.md, "One consumer on small grids"):
// forward +21-33% where the 64-row blocks fit one an SM from 512 keys on (1,1,8192,128 full 436
// against 340 TFLOP/s, 1,2,4096,64 full +33%, 1,16,512,128 full +21%), less on shorter rows (+5% at
// 1,8,256,128 full); causal grids of up to two blocks an SM +4-9%
// (1,8,2048 +9% / +8% at D = 128 / 64, 2,16,384,128 +4%), their unequal tiles going heaviest
// first; full attention past one block an SM loses the second round of equal tiles (1,8,2048,128
// forced to one consumer: 399 against 525).
bool spreads_rows_over_sms(const AttentionShape& s, bool causal, int sms) {
  const double row_blocks = double(s.batch) * s.heads * blocks(s.q_len, 64);
  return row_blocks <= (causal ? 2.0 : 1.0) * sms;
}

int ws_consumers_for(const AttentionShape& s, bool causal, int sms) {
  if (spreads_rows_over_sms(s, causal, sms)) return 1;
  if (s.head_dim != 64) return 2;
  // The cost of C consumers: the rounds of tiles over the persistent grid (the last round's idle
  // CTAs count; causal too, where a CTA's longest tile bounds a short schedule) times a tile's time.
  // A two-consumer tile takes kTwoConsumerTile of a three-consumer one for two thirds of its rows
  // (measured at 2,16,8192,64 full, where both fill their rounds: 359 against 445 TFLOP/s, 0.79 of
  // the rate per row, docs/benchmarks.md): two pay where three leave most of a round idle, as with
  // 1 x 8 heads of 4,097 rows (176 tiles of 192 rows on 132 SMs) or a single short round.
  constexpr double kTwoConsumerTile = 0.84;
  const auto rounds = [&](int consumers) {
    const std::int64_t tiles = std::int64_t(s.batch) * s.heads * blocks(s.q_len, 64 * consumers);
    return (tiles + sms - 1) / sms;
  };
  return kTwoConsumerTile * double(rounds(2)) < double(rounds(3)) ? 2 : 3;
}

// A last round of r equal tiles takes a tile's time with sms - r SMs idle (1 x 8 heads of 16,384 rows
// at D = 64: 688 tiles of 192 rows, 5 rounds and 28 tiles). Its blocks as items of fewer blocks than a
// tile's take less: one block, a CTA's lone consumer, walks it in about 0.75 of a tile's time (no
// turns to wait for), measured (H100, docs/benchmarks.md) at 1,8,16384,64 full +5.3% (6.2% fewer
// cycles); but 132 of them on 132 SMs (8,16,4097,64 full, an earlier build) ran 2.4% slower, a CTA
// that finishes early taking two: so one-block items only where they fit on two thirds of the SMs.
// Items of more blocks (three consumers) only where each CTA takes one at most, and where no head
// ends in a lone block: such a tile is cheap (one consumer), so the CTAs drift apart over the
// schedule, the last round is no longer a round, and the larger items only add work (GPT-2 full,
// 1,024 rows = 5 x 192 + 64: 0.7% more time with them). Two-block items at the locked clock (H100,
// docs/benchmarks.md): 2,16,2048,64 full 6.2% less time, 2,16,8192,64 full 1.6% less, the unsplit
// shapes' as before (GPT-2 full +0.2%, 32,16,2048,64 full +0.1%: within the 0.6% noise).
WsTailSplit ws_tail_for(const AttentionShape& s, bool causal, int sms, int consumers) {
  if (causal || consumers < 2 || sms <= 0) return {};
  const std::int64_t tiles = std::int64_t(s.batch) * s.heads * blocks(s.q_len, 64 * consumers);
  const int r = int(tiles % sms);
  if (tiles <= sms || r == 0) return {};
  const int last_tile_blocks = (blocks(s.q_len, 64) - 1) % consumers + 1;
  for (int group = 1; group < consumers; ++group) {
    const int items = WsTailPieces::of(s.q_len, s.batch * s.heads, consumers, r, group).items(s.batch * s.heads);
    if (group == 1 ? 3 * items <= 2 * sms : items <= sms && last_tile_blocks > 1) return {r, group};
  }
  return {};
}

// A head of 1,024 rows in 192-row tiles (GPT-2) is 5 whole tiles and a last one where one consumer
// of three computes, in about 0.75 of a whole tile's time: at 192 heads the schedule ends at 8.75
// tile times in head order (docs/experiments/lone-blocks-2026-12-07), a CTA that draws a whole tile
// last keeping the others waiting. Two heads' lone blocks in one tile (consumers 0 and 1, each on its
// own K/V ring), right after the two heads' whole tiles, take it to about 8.0. Measured (H100,
// docs/benchmarks.md): GPT-2 full 4.7% less time, 8,16,1000,64 full 0.8-1.0%; all the pairs at the
// schedule's end read their heads' K/V from memory again (46 MB at GPT-2) and ran 5% slower. Only
// where no tail items split the last round (they are the other remedy for it) and there is a pair of
// heads.
bool ws_lone_pairs_for(const AttentionShape& s, bool causal, int consumers, bool tail_split) {
  return !causal && consumers == 3 && !tail_split && blocks(s.q_len, 64) % 3 == 1 && std::int64_t(s.batch) * s.heads >= 2;
}

ForwardPlan plan_forward(const ForwardArgs& a, const AttentionOptions& opt, int sms) {
  ForwardPlan plan;
  plan.head_dim = a.shape.head_dim;
  plan.paper = opt.numerics == Numerics::paper;
  plan.policy = opt.policy;
  plan.count_events = a.ties != nullptr || a.head_ties != nullptr;
  plan.walk = takes_fast_path(opt.numerics, opt.policy, plan.count_events) ? ForwardWalk::pipelined : ForwardWalk::units;
  plan.kernel = plan.walk == ForwardWalk::pipelined && takes_warp_specialized_forward(a.shape, opt.causal, sms)
                    ? ForwardKernel::warp_specialized
                    : ForwardKernel::one_warpgroup;
  if (plan.kernel == ForwardKernel::warp_specialized) {
    plan.ws_consumers = ws_consumers_for(a.shape, opt.causal, sms);
    plan.ws_tail = ws_tail_for(a.shape, opt.causal, sms, plan.ws_consumers);
    plan.ws_lone_pairs = ws_lone_pairs_for(a.shape, opt.causal, plan.ws_consumers, plan.ws_tail.group > 0);
  }
  plan.sms = sms;
  // the epilogue's bulk stores need 16-byte aligned output rows; others are stored element-wise
  plan.store_by_tma = rows_aligned(a.o, a.o_strides(), 16) && (!a.o_residual || rows_aligned(a.o_residual, a.o_strides(), 16));
  return plan;
}

// delta_source `auto` takes the exact delta where the main kernel forms it with a reduction alone
// (DeltaPass::in_main; attention.hpp)
static_assert(kAutoExactMaxKeys == kBackwardBlockK, "auto's exact range is the backward's one key block");
// 64-key CTAs start their walk where their 128-key block's CTA does (walk_order.hpp)
static_assert(kWalkStartKeys == kBackwardBlockK, "the walk's start counts 128-key CTAs");

bool backward_has_64_key_ctas(const AttentionShape& s, const AttentionOptions& opt) {
  return !opt.deterministic && s.head_dim == 128 && blocks(s.k_len, kBackwardBlockK) > 1;
}

bool backward_spreads_keys_over_sms(const AttentionShape& s, const AttentionOptions& opt, int sms) {
  if (sms <= 0 || !backward_has_64_key_ctas(s, opt)) return false;
  // 64-key items, one CTA an SM at most (177 KB of shared memory). Both consumers compute the items'
  // S^T, dP^T, P and dS (1.4x a 128-key item's products per key), so a 64-key CTA does about 0.6 of a
  // 128-key one's work an SM: it pays where 128-key items leave half the SMs idle or more, and measured
  // (H100, docs/benchmarks.md): causal +4-20% over 8 grids of up to `sms` items of 64 keys; full
  // +8-13% up to 96, but 0.75-1.03x at 128, where many CTAs of one head add into the same dQ tiles in
  // step. Head dim 64 would split 64 dims into dQ tiles of 32: not built (one consumer a CTA was no
  // faster there at any grid).
  const std::int64_t items64 = blocks(s.k_len, kBackwardBlockK / 2) * std::int64_t(s.batch) * s.heads;
  return opt.causal ? items64 <= sms : 4 * items64 <= 3 * std::int64_t(sms);
}

BackwardPlan plan_backward(const BackwardArgs& a, const AttentionOptions& opt, bool with_gradients, int sms) {
  const AttentionShape& s = a.shape;
  BackwardPlan plan;
  plan.head_dim = s.head_dim;
  plan.paper = opt.numerics == Numerics::paper;
  if (opt.delta_source == DeltaSource::automatic)
    throw std::logic_error("plan_backward: delta_source 'auto' not resolved (AttentionOptions::for_shape)");
  plan.delta = opt.delta_source == DeltaSource::exact ? DeltaPass::exact : DeltaPass::from_output;
  plan.kv_group = s.group_size();
  if (!with_gradients) return plan;
  plan.dq_direct = blocks(s.k_len, kBackwardBlockK) == 1;
  plan.dq_first_store = !plan.dq_direct;
  const std::int64_t items = blocks(s.k_len, kBackwardBlockK) * std::int64_t(s.batch) * s.heads;
  const int q_walk = blocks(s.q_len, kBackwardBlockQ);  // a full-attention item's query blocks
  // head dim 128 only (WgmmaBackwardTraits::kPersistent), and walks of up to kPersistentMaxWalk
  // query blocks: what it saves is about a block's time an item, +3.4 to +5.5% at 16-32 blocks, +0.9%
  // at 128 and nothing measurable at 256 (-0.1 / -1.4%, docs/benchmarks.md)
  constexpr int kPersistentMaxWalk = 128;
  if (sms > 0 && s.head_dim == 128 && !opt.causal && !plan.dq_direct && items > sms && q_walk <= kPersistentMaxWalk) plan.main_ctas = sms;
  if (backward_spreads_keys_over_sms(s, opt, sms)) plan.key_groups = 1, plan.main_ctas = 0;
  settle_backward_plan(plan, a, opt);
  return plan;
}

void settle_backward_plan(BackwardPlan& plan, const BackwardArgs& a, const AttentionOptions& opt) {
  const AttentionShape& s = a.shape;
  // One key block: the main kernel holds every P and dP of a row, so the exact delta costs it a
  // reduction, where the pass computes S and dP again (docs/cuda-kernels.md)
  if (plan.delta != DeltaPass::from_output) plan.delta = plan.dq_direct ? DeltaPass::in_main : DeltaPass::exact;
  BackwardWorkspace& w = plan.workspace;
  w = BackwardWorkspace{};
  const std::int64_t q_blocks = blocks(s.q_len, kBackwardBlockQ);  // no int overflow: backward_workspace_bytes skips check_tensors
  const std::size_t padded_rows = std::size_t(s.batch) * s.heads * q_blocks * kBackwardBlockQ;
  w.dq_bytes = plan.dq_direct ? 0 : padded_rows * s.head_dim * sizeof(float);
  w.semaphores = opt.deterministic && !plan.dq_direct ? std::size_t(s.batch) * s.heads * q_blocks : 0;
  // a claim word per [64, 64] dQ tile where no turn counter orders the key blocks
  w.accumulator_zeroed = !plan.dq_first_store;
  w.claims = plan.dq_first_store && !opt.deterministic ? std::size_t(s.batch) * s.heads * q_blocks * (s.head_dim / 64) : 0;
  w.delta_bytes = a.delta ? 0 : std::size_t(s.rows()) * sizeof(float);
  // Grouped-query heads: the main kernel runs as multi-head attention with K/V read by the group
  // and writes each query head's BF16 dK, dV here; the group sum adds them per K/V head in
  // ascending head order, in FP32, rounded once (docs/numerics-contract.md; docs/cuda-kernels.md why).
  w.per_head_bytes = plan.kv_group > 1 ? std::size_t(s.batch) * s.heads * s.k_len * s.head_dim * sizeof(std::uint16_t) : 0;
  w.at_claims = aligned256(w.dq_bytes);
  w.at_semaphores = aligned256(w.at_claims + w.claims * sizeof(int));
  w.at_delta = aligned256(w.at_semaphores + w.semaphores * sizeof(int));
  w.at_dk = aligned256(w.at_delta + w.delta_bytes);
  w.at_dv = w.at_dk + aligned256(w.per_head_bytes);
  w.total = w.at_dv + w.per_head_bytes;
}

}  // namespace stableflash::attention::cuda
