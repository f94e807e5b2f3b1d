// CPU flash-attention forward in `paper` and `fused` numerics: the oracle the CUDA kernels are
// checked against. One query row at a time (rows are independent in both modes; only the key-tile
// width Bc changes the numerics), walking key tiles exactly as a tiled kernel does, with every
// rounding point taken from rounding_points.hpp and the shift from shift_policies.hpp.
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "cpu_kernels_common.hpp"
#include "stableflash/attention/attention.hpp"
#include "stableflash/attention/cuda.hpp"
#include "stableflash/attention/rounding_points.hpp"

namespace stableflash::attention {
namespace {

using detail::HeadMajor;

constexpr float kInf = std::numeric_limits<float>::infinity();

// Per-row results of the tile walk.
struct RowResult {
  bool tie_event = false, repeated_max = false, fell_back = false;
};

// Inputs of one head, widened to FP32 and head-major.
struct HeadInputs {
  const float* q;  // [Tq, D]
  const float* k;  // [Tk, D]
  const float* v;  // [Tk, D]
};

// Scratch of one row: scores and P-bar operands of a key tile, D-wide accumulators.
struct RowScratch {
  std::vector<float> s, p_operand;
  std::vector<double> pv;  // FP64 sums of BF16(P-bar) * v for the tile (FP32-accumulator emulation)
  std::vector<float> o, shadow;
  explicit RowScratch(int tile_k, int dim) : s(tile_k), p_operand(tile_k), pv(dim), o(dim), shadow(dim) {}
};

// Tracks whether the row's S maximum occurs at two or more keys (the paper's early warning),
// across tiles, before any policy.
struct RepeatedMaxTracker {
  float max = -kInf;
  int count = 0;
  void add_tile(const float* s, int n) {
    const float tile_max = *std::max_element(s, s + n);
    if (tile_max < max) return;
    if (tile_max > max) max = tile_max, count = 0;
    count += static_cast<int>(std::count(s, s + n, tile_max));
  }
};

template <class Policy>
int near_max_count(const Policy& policy, const float* s, int n, float r_m, ShiftPrecision p) {
  if constexpr (Policy::needs_near_max_count) {
    const float threshold = policy.near_max_threshold(r_m, p);
    return static_cast<int>(std::count_if(s, s + n, [&](float x) { return x >= threshold; }));
  } else {
    return 0;
  }
}

// P-bar*V for one tile: pv[d] = sum_j BF16(P-bar_j) * v[j][d] in FP64 (rounded to FP32 by callers).
void tile_pv(const float* p_operand, const float* v, int j0, int n, int dim, std::vector<double>& pv) {
  std::fill(pv.begin(), pv.end(), 0.0);
  for (int j = 0; j < n; ++j) {
    const double p = p_operand[j];
    if (p == 0.0) continue;
    const float* vj = v + std::int64_t(j0 + j) * dim;
    for (int d = 0; d < dim; ++d) pv[d] += p * vj[d];
  }
}

// One row's scores for keys [j0, j0+n), rounded as the mode's `score` says.
template <class ScoreFn>
void tile_scores(const HeadInputs& in, int i, int j0, int n, int dim, float* s, ScoreFn score) {
  const float* qi = in.q + std::int64_t(i) * dim;
  for (int j = 0; j < n; ++j) s[j] = score(detail::dot_fp32(qi, in.k + std::int64_t(j0 + j) * dim, dim));
}

// The tile's new running shift: the policy's choice for the tile's row maximum, merged with the
// running m; also records the repeated-maximum and fallback events.
template <class Policy>
float next_shift(const Policy& policy, const float* s, int n, RowId row, ShiftPrecision p, float m, RepeatedMaxTracker& rep,
                 RowResult& res) {
  rep.add_tile(s, n);
  const float r_m = *std::max_element(s, s + n);
  const ShiftChoice choice = policy.choose(r_m, near_max_count(policy, s, n, r_m, p), row, p);
  res.fell_back |= choice.fell_back;
  return std::max(m, choice.m);
}

// P-bar of a tile through the mode's `pbar`, its P-bar*V operands (`operand`) into w.p_operand,
// and the row-sum terms through `sum_term`; returns the FP32 tile sum and records a tie event
// (>= 2 operands exactly 1.0).
template <class PbarFn, class OperandFn, class SumTermFn>
float tile_pbar(int n, RowScratch& w, RowResult& res, PbarFn pbar, OperandFn operand, SumTermFn sum_term) {
  detail::Fp32Accumulator tile_sum;
  int ones = 0;
  for (int j = 0; j < n; ++j) {
    const float p = pbar(w.s[j]);
    tile_sum.add(sum_term(p));
    w.p_operand[j] = operand(p);
    ones += w.p_operand[j] == 1.0f;
  }
  res.tie_event |= ones >= 2;
  return tile_sum.value();
}

template <class Policy>
RowResult paper_row(const Policy& policy, const AttentionOptions& opt, const HeadInputs& in, RowId row, int last,
                    int dim, float scale, RowScratch& w, float* o_out, float* lse_out, float* residual_out) {
  const int bc = opt.resolved_tile_k(), bits = opt.round_bits;
  RowResult res;
  RepeatedMaxTracker rep;
  float m = -kInf, l = 0.0f, l_shadow = 0.0f;
  std::fill(w.o.begin(), w.o.end(), 0.0f);
  std::fill(w.shadow.begin(), w.shadow.end(), 0.0f);
  for (int j0 = 0; j0 <= last; j0 += bc) {
    const int n = std::min(bc, last + 1 - j0);  // keys past `last` are masked: they never count
    tile_scores(in, int(row.i), j0, n, dim, w.s.data(), [&](float dot) { return paper::score(dot, scale); });
    const float m_new = next_shift(policy, w.s.data(), n, row, ShiftPrecision::bf16, m, rep, res);
    const float l_tile = paper::clamp_tile_sum(
        tile_pbar(n, w, res, [&](float x) { return paper::pbar(x, m_new); }, paper::pbar_operand, [](float p) { return p; }));
    tile_pv(w.p_operand.data(), in.v, j0, n, dim, w.pv);
    const float c = paper::rescale(m, m_new);
    for (int d = 0; d < dim; ++d) {
      const float dot = static_cast<float>(w.pv[d]);
      w.o[d] = paper::update_output(w.o[d], c, paper::tile_output(dot, bits), bits);
      w.shadow[d] = paper::update_shadow(w.shadow[d], c, dot);
    }
    l = paper::update_sum(l, c, l_tile);
    l_shadow = add_rn(mul_rn(l_shadow, c), l_tile);
    m = m_new;
  }
  for (int d = 0; d < dim; ++d) {
    o_out[d] = paper::finalize_output(w.o[d], l, bits);
    if (residual_out) residual_out[d] = output_residual(div_rn(w.shadow[d], l_shadow), o_out[d]);
  }
  *lse_out = paper::lse(l, m);
  res.repeated_max = rep.count >= 2;
  return res;
}

template <class Policy>
RowResult fused_row(const Policy& policy, const AttentionOptions& opt, const HeadInputs& in, RowId row, int last,
                    int dim, float scale, RowScratch& w, float* o_out, float* lse_out, float* residual_out) {
  const int bc = opt.resolved_tile_k(), bits = opt.round_bits;
  RowResult res;
  RepeatedMaxTracker rep;
  float m = -kInf, l = 0.0f;
  std::fill(w.o.begin(), w.o.end(), 0.0f);  // the FP32 accumulator
  for (int j0 = 0; j0 <= last; j0 += bc) {
    const int n = std::min(bc, last + 1 - j0);
    tile_scores(in, int(row.i), j0, n, dim, w.s.data(), [&](float dot) { return fused::score(dot, scale); });
    const float m_new = next_shift(policy, w.s.data(), n, row, ShiftPrecision::fp32, m, rep, res);
    const float l_tile = tile_pbar(n, w, res, [&](float x) { return fused::pbar(x, m_new); }, fused::pbar_operand,
                                   [&](float p) { return fused::sum_term(p, opt.normalizer); });
    tile_pv(w.p_operand.data(), in.v, j0, n, dim, w.pv);
    const float c = fused::rescale(m, m_new);
    for (int d = 0; d < dim; ++d) w.o[d] = fused::update_accumulator(w.o[d], c, static_cast<float>(w.pv[d]));
    l = fused::update_sum(l, c, l_tile);
    m = m_new;
  }
  for (int d = 0; d < dim; ++d) {
    const float o32 = fused::unrounded_output(w.o[d], l);
    o_out[d] = fused::finalize_output(o32, bits);
    if (residual_out) residual_out[d] = output_residual(o32, o_out[d]);
  }
  *lse_out = fused::lse(l, m);
  res.repeated_max = rep.count >= 2;
  return res;
}

template <class Policy>
void forward_with_policy(const Policy& policy, const ForwardArgs& a, const AttentionOptions& opt) {
  const AttentionShape& s = a.shape;
  const int dim = s.head_dim, br = opt.resolved_tile_q(), bc = opt.resolved_tile_k();
  const float scale = opt.resolved_scale(dim);
  const bool want_residual = a.o_residual != nullptr;
  const HeadMajor q(a.q, a.q_strides(), s.batch, s.heads, s.q_len, dim);
  const HeadMajor k(a.k, a.k_strides(), s.batch, s.resolved_kv_heads(), s.k_len, dim);
  const HeadMajor v(a.v, a.v_strides(), s.batch, s.resolved_kv_heads(), s.k_len, dim);
  const HeadStrides os = a.o_strides();  // o and o_residual
  const int row_tiles = (s.q_len + br - 1) / br;
  const std::int64_t units = std::int64_t(s.batch) * s.heads * row_tiles;
  std::int64_t tie_rows = 0, repeated_rows = 0, fallback_rows = 0, masked_rows = 0;
  if (a.head_ties) std::fill(a.head_ties, a.head_ties + s.heads, TieCounts{});

#pragma omp parallel reduction(+ : tie_rows, repeated_rows, fallback_rows, masked_rows)
  {
    RowScratch w(bc, dim);
    std::vector<float> o_row(dim), r_row(dim);
#pragma omp for schedule(dynamic)
    for (std::int64_t u = 0; u < units; ++u) {
      const int b = int(u / (std::int64_t(s.heads) * row_tiles));
      const int h = int(u / row_tiles % s.heads);
      const int tile = int(u % row_tiles);
      const HeadInputs in{q.head(b, h), k.head(b, s.kv_head_of(h)), v.head(b, s.kv_head_of(h))};
      TieCounts unit_counts;  // this unit's rows, added to its head's counters (head_ties)
      for (int i = tile * br; i < std::min(s.q_len, (tile + 1) * br); ++i) {
        const int last = last_visible_key(i, s.q_len, s.k_len, opt.causal);
        float lse = std::numeric_limits<float>::infinity();
        std::fill(o_row.begin(), o_row.end(), 0.0f);
        std::fill(r_row.begin(), r_row.end(), 0.0f);
        ++unit_counts.rows;
        if (last < 0) {
          ++masked_rows;
          ++unit_counts.masked_rows;
        } else {
          const RowId row{std::uint32_t(b), std::uint32_t(h), std::uint32_t(i)};
          float* residual = want_residual ? r_row.data() : nullptr;
          const RowResult r = opt.numerics == Numerics::paper
                                  ? paper_row(policy, opt, in, row, last, dim, scale, w, o_row.data(), &lse, residual)
                                  : fused_row(policy, opt, in, row, last, dim, scale, w, o_row.data(), &lse, residual);
          tie_rows += r.tie_event;
          repeated_rows += r.repeated_max;
          fallback_rows += r.fell_back;
          unit_counts.tie_event_rows += r.tie_event;
          unit_counts.repeated_max_rows += r.repeated_max;
          unit_counts.fallback_rows += r.fell_back;
        }
        const std::int64_t at = os.at(b, h, i);
        for (int d = 0; d < dim; ++d) {
          a.o[at + d] = bf16::from_float(o_row[d]);
          if (want_residual) a.o_residual[at + d] = bf16::from_float(r_row[d]);
        }
        a.lse[(std::int64_t(b) * s.heads + h) * s.q_len + i] = lse;
      }
      if (a.head_ties) {
        TieCounts& c = a.head_ties[h];
#pragma omp critical(stableflash_head_ties)
        {
          c.rows += unit_counts.rows, c.tie_event_rows += unit_counts.tie_event_rows;
          c.repeated_max_rows += unit_counts.repeated_max_rows, c.fallback_rows += unit_counts.fallback_rows;
          c.masked_rows += unit_counts.masked_rows;
        }
      }
    }
  }
  if (a.ties) *a.ties = TieCounts{s.rows(), tie_rows, repeated_rows, fallback_rows, masked_rows};
}

}  // namespace

void attention_forward(const ForwardArgs& a, const AttentionOptions& options) {
  if (options.device == Device::cuda) return cuda::forward(a, options);
  const AttentionOptions opt = options.for_shape(a.shape);
  opt.validate(a.shape);
  if (opt.numerics == Numerics::reference)
    throw std::invalid_argument("numerics: 'reference' has FP64 outputs; call reference_forward()");
  if (!a.q || !a.k || !a.v || !a.o || !a.lse) throw std::invalid_argument("attention_forward: q, k, v, o and lse are required");
  opt.require_residual(a.shape, a.o_residual != nullptr, "an o_residual output buffer");
  with_shift_policy(opt.policy, opt.policy_params, [&](const auto& policy) { forward_with_policy(policy, a, opt); });
}

}  // namespace stableflash::attention
