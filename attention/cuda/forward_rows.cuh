// Per-row state of the forward kernels (forward_wgmma_kernel.cuh, forward_ws_kernel.cuh; the lab's
// mma.sync forward) and the walk over key sub-tiles. ForwardRows composes the parts of
// forward_row_parts.cuh (OnlineSoftmax, PaperRowState, TopTwoPrepass, EventCounters) and adds what
// joins them: the shift choice at a unit's start, P-bar and the row sums, the unit's end.
// ForwardEpilogue writes the results: O, the residual, lse, the event counts.
// A thread holds 2 * kRowTiles rows (rows g and g + 8 of each 16-row tile); the four threads of a
// quad hold the same rows, each a quarter of the columns, so row reductions are two shuffles.
#pragma once

#include <cstdint>
#include <type_traits>

#include "forward_row_parts.cuh"
#include "kernel_params.cuh"
#include "paper_pairs.cuh"
#include "plan.hpp"
#include "stableflash/attention/rounding_points.hpp"
#include "stableflash/attention/shift_policies.hpp"
#include "warp_mma.cuh"

namespace stableflash::attention::cuda {

// Policies whose choice depends on a per-row constant may expose it (shift_policies.hpp).
template <class Policy>
__host__ __device__ constexpr bool has_row_constant() {
  if constexpr (requires { Policy::has_row_constant; }) {
    return Policy::has_row_constant;
  } else {
    return false;
  }
}

template <class Policy>
__device__ __forceinline__ Policy make_policy(const PolicyParams& params) {
  if constexpr (std::is_same_v<Policy, PublishedShift>) {
    return Policy{params};
  } else {
    return Policy{};
  }
}

// One step of the key walk: per shift unit, an optional pre-pass over its sub-tiles (K only, to
// find the unit's maximum), then the main pass (K and V).
struct KeyStep {
  int key0;        // first key of the sub-tile
  int sub, n_sub;  // index within the unit, sub-tiles in the unit
  bool main;       // main pass (P-bar * V) rather than pre-pass
  bool prepass;    // the unit has a pre-pass
};

struct KeyWalk {
  int n_keys, unit, per_unit;  // unit = per_unit * 64 keys
  bool multi_pass;             // units of several sub-tiles get a pre-pass

  __device__ int steps_in_unit(int n_sub) const { return (multi_pass && n_sub > 1) ? 2 * n_sub : n_sub; }
  __device__ int total_steps() const {
    const int full = n_keys / unit, rest = n_keys - full * unit;
    return full * steps_in_unit(per_unit) + (rest > 0 ? steps_in_unit((rest + 63) / 64) : 0);
  }
};

// The keys a CTA of query rows [m0, m0 + BQ) walks: all keys some row sees (n_keys), the last key
// its first row sees (sub-tiles reaching past it need the mask), and the walk. Numerics tiles of
// tile_k with a pre-pass where the plan says so (ForwardWalk::units; always where the
// instantiation cannot take the fast path, kMultiPass, which lets the compiler fold the test);
// else one step, and one shift, per BK-key sub-tile.
struct CtaKeys {
  int n_keys, min_last;
  KeyWalk walk;
};
template <int BQ, int BK, bool kMultiPass>
__device__ __forceinline__ CtaKeys cta_keys(const ForwardParams& p, int m0) {
  const bool causal = p.causal != 0;
  const int cta_last_row = min(m0 + BQ, p.q_len) - 1;
  const int n_keys = max(0, last_key(cta_last_row, p.q_len, p.k_len, causal) + 1);
  const bool multi_pass = kMultiPass || p.walk == static_cast<int>(ForwardWalk::units);
  const int unit = multi_pass ? p.tile_k : BK;
  return {n_keys, last_key(m0, p.q_len, p.k_len, causal), KeyWalk{n_keys, unit, unit / BK, multi_pass}};
}

// Walks a KeyWalk's steps in order without divisions (a step's position from its index would
// need two integer divisions by run-time values, tens of instructions per step).
struct KeyCursor {
  KeyWalk walk;
  int unit0 = 0;   // first key of the current unit
  int within = 0;  // step index within the unit
  KeyStep step;

  __device__ explicit KeyCursor(const KeyWalk& w) : walk(w) { settle(); }
  __device__ void advance() {
    if (++within == walk.steps_in_unit(step.n_sub)) within = 0, unit0 += walk.unit;
    settle();
  }

 private:
  __device__ void settle() {
    const int left = walk.n_keys - unit0;
    step.n_sub = left >= walk.unit ? walk.per_unit : (left + 63) / 64;
    step.prepass = walk.multi_pass && step.n_sub > 1;
    step.main = !step.prepass || within >= step.n_sub;
    step.sub = step.prepass && within >= step.n_sub ? within - step.n_sub : within;
    step.key0 = unit0 + step.sub * 64;
  }
};

// Calls f(bits) with the output rounding's significand bits as a compile-time 7 (BF16: one
// conversion per element) or else the run-time value. A run-time `bits` inside the per-element
// loops costs a branch region per element; the profile of the paper forward showed its unit-end
// and epilogue code (executed once per unit, so never warm in the instruction cache) taking a
// third of the kernel's stall samples that way.
struct Bf16Bits {
  __device__ constexpr operator int() const { return 7; }
};
// A bool known at compile time where a run-time one may be passed (like Bf16Bits).
template <bool B>
struct FixedBool {
  __device__ constexpr operator bool() const { return B; }
};

template <class F>
__device__ __forceinline__ void with_round_bits(int bits, F&& f) {
  if (bits == 7) {
    f(Bf16Bits{});
  } else {
    f(bits);
  }
}

// fused P-bar from a raw dot when the scale is 2^k, k <= 0 (1/sqrt(D) at D = 16, 64, 256):
// S = fused::score(dot, scale) = RN(dot 2^k) is then dot 2^k exactly, so one FMA gives RN(S - m)
// (fused::pbar_fast's first rounding) bit for bit; the rest is pbar_fast's. The one exception is a
// product below the normal range (|dot| < 2^(-126 - k)), which RN rounds: there the two roundings
// can differ by one unit of 2^-149, and only when |S - m| < 2^-99 (for larger |m| both give -m),
// where exp2 of the (flushed or tiny) argument is 1 either way.
__device__ __forceinline__ bool scale_is_exact_power_of_two(float scale) {
  const std::uint32_t bits = __float_as_uint(scale);
  const std::uint32_t exponent = bits >> 23;  // sign 0: positive
  return (bits & 0x007fffffu) == 0 && exponent >= 1 && exponent <= 127;  // normal, 2^-126 .. 1
}
__device__ __forceinline__ float fused_pbar_pow2_scale(float dot, float scale, float m) {
  return fused::exp_fast(__fmaf_rn(dot, scale, -m));
}

// How a fused walk evaluates P-bar = exp(S - m) from its raw dots, decided once per call (the
// pipelined walk, from the scale; the units walk always takes `scaled`):
//   scaled      pbar_fast(score(dot, scale), m): two multiplies and a subtraction a score
//   pow2_scale  fused_pbar_pow2_scale, where the scale is 2^k: one FMA and a multiply, the same bits
//   log2_units  pbar_log2(score_log2(dot, c), m_t) (rounding_points.hpp), any other scale: a multiply
//               and a subtraction, P-bar and the rescale against the row's shift in log2 units m_t
enum class PbarForm { scaled, pow2_scale, log2_units };

// ---- The rows of a thread: the parts (forward_row_parts.cuh) and what joins them -------------
// The shift choice at a unit's start (start_unit: from the pre-pass or the sub-tile, through the
// shared policy structs), P-bar and the row sums at the mode's rounding points (exponentiate), the
// unit's end (end_unit). ForwardEpilogue writes the results.
template <class Traits, class Policy>
struct ForwardRows {
  static constexpr int MR = Traits::kRowTiles, NT = Traits::kKeyTiles, DT = Traits::kDimTiles;
  static constexpr bool kPaper = Traits::kPaper;
  static constexpr ShiftPrecision kPrec = kPaper ? ShiftPrecision::bf16 : ShiftPrecision::fp32;
  static_assert(!Policy::needs_near_max_count || Policy::kind == ShiftPolicy::paper,
                "a new policy that counts near-maximal scores needs more than the top-2 pre-pass");

  // The rows: their policy, indices, last visible keys and the policy's per-row constants.
  const Policy policy;
  const int row0;   // query index of row (0, 0)
  const int lrow0;  // the same row within the CTA
  const std::uint32_t b, h;
  int last[MR][2];         // last visible key per row; -1 for rows past Tq or before row 0 (never stored)
  float row_const[MR][2];  // the policy's per-row constant (hashed offset), if it has one
  // The parts. (Their order, and that of PaperRowState's members, sets the order of the loop's
  // phi copies in nvcc's output and so ptxas's register allocation: this one gives the fewest
  // registers, docs/benchmarks.md "Kernel history".)
  EventCounters<MR> events;
  TopTwoPrepass<MR, kPaper> top2;
  std::conditional_t<kPaper, PaperRowState<MR, DT>, NoPaperRowState> paper_state;
  OnlineSoftmax<MR, DT, kPaper> softmax;

  // events_smem, top_smem: the CTA's ForwardRowEvents rows and this warpgroup's top-2 slots (null
  // where the kernel never counts or runs a pre-pass).
  __device__ ForwardRows(const ForwardParams& p, ForwardRowEvents* events_smem, float* top_smem, int b_, int h_, int row0_, int lrow0_)
      : policy(make_policy<Policy>(p.policy)),
        row0(row0_),
        lrow0(lrow0_),
        b(b_),
        h(h_),
        events(p.counters ? events_smem : nullptr, lrow0_),
        top2(top_smem) {
#pragma unroll
    for (int mi = 0; mi < MR; ++mi)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = row0 + row_offset(mi, hf);
        last[mi][hf] = unsigned(i) < unsigned(p.q_len) ? last_key(i, p.q_len, p.k_len, p.causal != 0) : -1;
        if constexpr (has_row_constant<Policy>()) row_const[mi][hf] = policy.row_constant(RowId{b, h, std::uint32_t(i)});
        top2.reset(mi, hf);
        events.clear(mi, hf);
      }
  }

  // The largest raw dot of row (mi, hf) in the quad's tile. Started from the first pair rather
  // than -inf (one fmax less per row): the two differ only where every entry the thread holds is
  // NaN, giving NaN instead of -inf, and quad_max's fmax (which drops a NaN operand) and `active`
  // (false for both) treat the two alike.
  template <int N>
  __device__ static float tile_row_max(const float (&sc)[MR][N][4], int mi, int hf) {
    float r = fmaxf(sc[mi][0][2 * hf], sc[mi][0][2 * hf + 1]);
#pragma unroll
    for (int nj = 1; nj < N; ++nj) r = fmaxf(r, fmaxf(sc[mi][nj][2 * hf], sc[mi][nj][2 * hf + 1]));
    return quad_max(r);
  }

  // The score in the policy's units: paper scores already are; fused keeps raw dots, and
  // dot * scale is monotone in dot, so maxima and order statistics map exactly.
  __device__ static float to_score(const ForwardParams& p, float x) { return kPaper ? x : fused::score(x, p.scale); }

  // The unit's shift for every row, from the pre-pass or from this single sub-tile's scores.
  // fused: rescales l and the O accumulator by c = exp(m_old - m_new). The pipelined walk
  // (kDeferAccRescale) has the previous tile's P-bar * V still in flight on the accumulator: it
  // gets c in `deferred` and applies it with softmax.rescale_acc() once that product has landed.
  // kForm = log2_units also moves the row's shift in log2 units (softmax.m_t) with m, and takes c from it.
  template <bool kDeferAccRescale = false, PbarForm kForm = PbarForm::scaled, int N>
  __device__ void start_unit(const ForwardParams& p, const float (&sc)[MR][N][4], const KeyStep& st,
                             float (*deferred)[2] = nullptr) {
    constexpr bool kLog2 = kForm == PbarForm::log2_units;
    static_assert(!(kPaper && kLog2), "paper scores are rounded to BF16 before the shift");
    const float scale_log2 = fused::log2_scale(p.scale);
#pragma unroll
    for (int mi = 0; mi < MR; ++mi)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        float r1 = -kInfinity, r2 = -kInfinity;
        if (st.prepass) {
          top2.take(mi, hf, r1, r2);
        } else {
          r1 = tile_row_max(sc, mi, hf);
        }
        const bool active = r1 > -kInfinity;
        const float r_m = to_score(p, r1);
        int near = 0;
        if constexpr (Policy::needs_near_max_count) {
          const float thr = policy.near_max_threshold(r_m, kPrec);
          if (st.prepass) {
            near = r_m >= thr ? 1 + (to_score(p, r2) >= thr ? 1 : 0) : 0;  // saturates at 2
          } else {
#pragma unroll
            for (int nj = 0; nj < N; ++nj)
#pragma unroll
              for (int e2 = 0; e2 < 2; ++e2) near += to_score(p, sc[mi][nj][2 * hf + e2]) >= thr ? 1 : 0;
            near = quad_sum(near);
          }
        }
        const float m_old = softmax.m[mi][hf];
        float m_new = m_old;
        float m_t_new = softmax.m_t[mi][hf];  // log2_units: moves where m does
        bool fell = false;
        if (active) {
          ShiftChoice choice;
          if constexpr (has_row_constant<Policy>()) {
            choice = policy.choose_with(row_const[mi][hf], r_m, near, kPrec);
          } else {
            choice = policy.choose(r_m, near, RowId{b, h, std::uint32_t(row0 + row_offset(mi, hf))}, kPrec);
          }
          fell = choice.fell_back;
          m_new = fmaxf(m_old, choice.m);
          if constexpr (kLog2) {  // a select, not a branch: ptxas then interleaves the rows' maxima
            const float m_t_choice = fused::shift_log2(r1, scale_log2, r_m, choice.m);
            m_t_new = choice.m > m_old ? m_t_choice : m_t_new;
          }
        }
        // A row that has seen no key keeps acc = l = 0, so its factor is irrelevant (paper: 0
        // avoids the NaN of -inf - -inf; fused's finite kUnseen gives 0, or 1 where the row stays
        // unseen, as does an inactive row's m_new = m_old: exp(0) = 1 exactly).
        const float c = kPaper  ? (m_old == -kInfinity ? 0.0f : paper::rescale(m_old, m_new))
                        : kLog2 ? fused::rescale_log2(softmax.m_t[mi][hf], m_t_new)
                                : fused::rescale_fast(m_old, m_new);
        if constexpr (kLog2) softmax.m_t[mi][hf] = m_t_new;
        events.start_unit(mi, hf, fell);
        if constexpr (kPaper) {
          paper_state.start_unit(mi, hf, active, m_new, c);
        } else if constexpr (kDeferAccRescale) {
          deferred[mi][hf] = c;                                  // 1 where inactive
          softmax.template move_shift<false>(mi, hf, m_new, c);  // l * 1, m_new = m_old where inactive
        } else {
          if (active) softmax.template move_shift<true>(mi, hf, m_new, c);
        }
      }
  }

  // P-bar = exp(S - m) in place, the row sums, and BF16(P-bar) packed as A fragments.
  template <int N>
  __device__ void probabilities(const ForwardParams& p, float (&sc)[MR][N][4], std::uint32_t (&pa)[MR][N / 2][4]) {
    exponentiate(p, sc);
    pack_operands(sc, pa);
  }

  // P-bar = exp(S - m) in place over a tile of N key n-tiles, and the row sums: of the FP32 P-bar
  // (paper; fused by default) or of BF16(P-bar) (fused, normalizer = bf16: the values the
  // P-bar * V product actually uses).
  // kForm (fused only): PbarForm; pow2_scale where the caller has checked
  // scale_is_exact_power_of_two(p.scale), log2_units where start_unit moved softmax.m_t.
  template <PbarForm kForm = PbarForm::scaled, int N>
  __device__ void exponentiate(const ForwardParams& p, float (&sc)[MR][N][4]) {
    static_assert(!(kPaper && kForm != PbarForm::scaled), "paper scores are rounded to BF16 before the shift");
    if constexpr (kPaper) {
      std::uint32_t sp[N][2];
      pack_score_pairs(sc, sp);
      exponentiate_pairs(p, sp, sc);
    } else if (p.normalizer_bf16) {
      // One branch per tile, around the exponentials and the sums together: with the branch between
      // them (per-element tests cost more), ptxas issued a step's 64 MUFU.EX2 back to back, each
      // waiting for the special-function pipe, and the sums' additions only after them; in one
      // basic block it can fill the pipe's gaps with them (docs/benchmarks.md).
      exponentiate_fused<kForm, true>(p, sc);
    } else {
      exponentiate_fused<kForm, false>(p, sc);
    }
  }

  // fused: P-bar and the row sums (of BF16(P-bar) where kBf16Terms: normalizer = bf16), each
  // entry added right after its exponential, in key order (add_term).
  template <PbarForm kForm, bool kBf16Terms, int N>
  __device__ void exponentiate_fused(const ForwardParams& p, float (&sc)[MR][N][4]) {
    constexpr bool kLog2 = kForm == PbarForm::log2_units;
    const float scale_log2 = fused::log2_scale(p.scale);
#pragma unroll
    for (int mi = 0; mi < MR; ++mi) {
      // the row's m (m_t in log2 units); for a row with no key yet the finite kUnseen, against which -inf gives 0
      const float shift[2] = {kLog2 ? softmax.m_t[mi][0] : softmax.m[mi][0], kLog2 ? softmax.m_t[mi][1] : softmax.m[mi][1]};
      float part[2];
#pragma unroll
      for (int nj = 0; nj < N; ++nj)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if constexpr (kForm == PbarForm::pow2_scale) {
            sc[mi][nj][e] = fused_pbar_pow2_scale(sc[mi][nj][e], p.scale, shift[e / 2]);
          } else if constexpr (kLog2) {
            sc[mi][nj][e] = fused::pbar_log2(fused::score_log2(sc[mi][nj][e], scale_log2), shift[e / 2]);
          } else {
            sc[mi][nj][e] = fused::pbar_fast(fused::score(sc[mi][nj][e], p.scale), shift[e / 2]);
          }
          add_term<kBf16Terms>(part[e / 2], nj == 0 && e % 2 == 0, sc[mi][nj][e]);
        }
      finish_row_sums(mi, sc, part);
    }
  }

  // paper: P-bar = exp(BF16(S - m)) of BF16 score pairs into sc, and the unit's row sums. BF16(S -
  // m) is one bf16x2 subtraction per two keys (paper_pairs.cuh); exp is paper::pbar_fast's.
  template <int N>
  __device__ void exponentiate_pairs(const ForwardParams& p, const std::uint32_t (&sp)[N][2], float (&sc)[MR][N][4]) {
    static_assert(kPaper && MR == 1, "paper numerics: one row tile per warp");
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const float shift = paper_state.shift(0, hf);
#pragma unroll
      for (int nj = 0; nj < N; ++nj) {
        const std::uint32_t d = paper_shifted_pair(sp[nj][hf], shift);
        sc[0][nj][2 * hf] = paper::exp_shifted_fast(bf16_lo(d));
        sc[0][nj][2 * hf + 1] = paper::exp_shifted_fast(bf16_hi(d));
      }
    }
    add_row_sums(0, sc);
  }

  // One term of a row sum: the FP32 P-bar, or BF16(P-bar) (kBf16Terms). Each sum starts from its
  // first term rather than 0 + it: the same value, since P-bar >= 0 and 0 + x = x for every x but
  // -0 (one add less per row); then the terms in key order.
  template <bool kBf16Terms>
  __device__ static void add_term(float& part, bool first, float pbar) {
    const float term = kBf16Terms ? round_bf16(pbar) : pbar;
    part = first ? term : part + term;
  }
  // paper: the unit's row sums of the FP32 P-bar.
  template <int N>
  __device__ void add_row_sums(int mi, const float (&sc)[MR][N][4]) {
    float part[2];
#pragma unroll
    for (int nj = 0; nj < N; ++nj)
#pragma unroll
      for (int e = 0; e < 4; ++e) add_term<false>(part[e / 2], nj == 0 && e % 2 == 0, sc[mi][nj][e]);
    finish_row_sums(mi, sc, part);
  }
  // The sums into the rows' state (paper: the unit's; fused: the running ones), and the counters'
  // BF16(P-bar) == 1 entries.
  template <int N>
  __device__ void finish_row_sums(int mi, const float (&sc)[MR][N][4], const float (&part)[2]) {
    events.count_ones(mi, sc);
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      if constexpr (kPaper) {
        paper_state.l_unit[mi][hf] += part[hf];
      } else {
        softmax.l[mi][hf] += part[hf];
      }
    }
  }

  // BF16(P-bar) as the A fragments of P-bar * V, 16 keys each.
  template <int N>
  __device__ static void pack_operands(const float (&sc)[MR][N][4], std::uint32_t (&pa)[MR][N / 2][4]) {
#pragma unroll
    for (int mi = 0; mi < MR; ++mi)
#pragma unroll
      for (int nj = 0; nj < N; ++nj) {
        pa[mi][nj / 2][(nj % 2) * 2 + 0] = pack_bf16x2(sc[mi][nj][0], sc[mi][nj][1]);
        pa[mi][nj / 2][(nj % 2) * 2 + 1] = pack_bf16x2(sc[mi][nj][2], sc[mi][nj][3]);
      }
  }

  // After the unit's last sub-tile. paper: the unit's rounding points (PaperRowState::end_unit);
  // fused: nothing but the tie count (its O accumulator was rescaled at the unit's start).
  __device__ void end_unit(const ForwardParams& p) {
    with_round_bits(p.round_bits, [&](auto bits) { end_unit_rounded(p, bits); });
  }
  template <class Bits>
  __device__ void end_unit_rounded(const ForwardParams& p, Bits bits) {
#pragma unroll
    for (int mi = 0; mi < MR; ++mi)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        events.end_unit(mi, hf);
        if constexpr (kPaper) paper_state.end_unit(softmax, p, bits, mi, hf);
      }
  }

};

// The epilogue of a finished walk: O = BF16(O_fp32) and the compensated delta's residual
// r = BF16(O_fp32 - O) (fused: O_fp32 = acc / l; paper: O over the BF16 sum, the residual from the
// FP32 shadow), lse, and the rows' event counts.
template <class Rows>
struct ForwardEpilogue {
  static constexpr int MR = Rows::MR, DT = Rows::DT;
  static constexpr bool kPaper = Rows::kPaper;

  // The element's O_fp32 (fused: acc / l; paper: the FP32 shadow over its FP32 sum, only when a
  // residual is asked for) and its rounded O. A row that saw no key has acc = O = shadow = 0 and
  // gets rcp = 0, so both come out 0 with no per-element branch.
  __device__ static float exact_output(const Rows& rows, int mi, int nd, int hf, int e2, float l_row, float rcp_l, float rcp_shadow) {
    if constexpr (kPaper) return rows.paper_state.exact_output(mi, nd, hf, e2, rcp_shadow);
    return rows.softmax.output(mi, nd, hf, e2, l_row, rcp_l);
  }
  template <class Bits>
  __device__ static float rounded_output(const Rows& rows, Bits bits, int mi, int nd, int hf, int e2, float l_row, float rcp_l) {
    if constexpr (kPaper) return rows.paper_state.rounded_output(bits, mi, nd, hf, e2, l_row, rcp_l);
    return fused::finalize_output(exact_output(rows, mi, nd, hf, e2, l_row, rcp_l, 0.0f), bits);
  }

  // Calls f(mi, hf, row, l, seen) for each row this thread holds in [0, Tq) (kEveryRow: every row),
  // with the row's full sum l (fused: the quad's partial sums added; every lane takes part in that)
  // and whether it saw a key.
  template <bool kEveryRow = false, class F>
  __device__ static void for_each_row(const Rows& rows, const ForwardParams& p, F&& f) {
#pragma unroll
    for (int mi = 0; mi < MR; ++mi)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = rows.row0 + row_offset(mi, hf);
        const float l_row = kPaper ? rows.softmax.l[mi][hf] : quad_sum(rows.softmax.l[mi][hf]);
        if (kEveryRow || unsigned(i) < unsigned(p.q_len)) f(mi, hf, i, l_row, rows.softmax.seen(mi, hf, l_row));
      }
  }

  // Visits every output element pair this thread holds in rows [0, Tq): emit(row, local_row, nd,
  // O pair, residual pair) with O = BF16(O_fp32) and r = BF16(O_fp32 - O) (the compensated
  // delta's residual; 0 unless `residual`). Columns nd * 8 + 2t, + 1. Rows that saw no key: 0.
  // fused decides `residual` once here, not per element (per element, nvcc interleaved predicated
  // copies of both variants: ~20 instructions per pair instead of 12); paper keeps the run-time
  // test, which costs it fewer registers (241 instead of 255 at D = 128). kEveryRow: rows past Tq
  // too (a staging tile whose bulk copy clips them; warp-collective stores need every lane).
  template <bool kEveryRow = false, class Emit>
  __device__ static void finalize_outputs(const Rows& rows, const ForwardParams& p, bool residual, Emit&& emit) {
    with_round_bits(p.round_bits, [&](auto bits) {
      if constexpr (kPaper) {
        finalize_rows<kEveryRow>(rows, p, bits, residual, emit);
      } else if (residual) {
        finalize_rows<kEveryRow>(rows, p, bits, FixedBool<true>{}, emit);
      } else {
        finalize_rows<kEveryRow>(rows, p, bits, FixedBool<false>{}, emit);
      }
    });
  }

  // fused at BF16 output: both elements of a pair rounded by one cvt.rn.bf16x2 (the bits of
  // pack_bf16x2(round_bf16(a), round_bf16(b)): RN to BF16 once either way), the residual from the
  // packed halves (bf16_lo/hi are the rounded values exactly).
  template <class Bits>
  static constexpr bool kPairRounding = !kPaper && std::is_same_v<Bits, Bf16Bits>;

  // residual: a bool, or FixedBool to decide it at compile time.
  template <bool kEveryRow, class Bits, class Residual, class Emit>
  __device__ static void finalize_rows(const Rows& rows, const ForwardParams& p, Bits bits, Residual residual, Emit& emit) {
    for_each_row<kEveryRow>(rows, p, [&](int mi, int hf, int i, float l_row, bool seen) {
      const float rcp_l = seen ? __frcp_rn(l_row) : 0.0f;
      float rcp_shadow = 0.0f;
      if constexpr (kPaper) rcp_shadow = residual && seen ? __frcp_rn(rows.paper_state.l_shadow[mi][hf]) : 0.0f;
#pragma unroll
      for (int nd = 0; nd < DT; ++nd) {
        std::uint32_t o_pair, r_pair = 0u;
        if constexpr (kPairRounding<Bits>) {
          const float e0 = exact_output(rows, mi, nd, hf, 0, l_row, rcp_l, 0.0f);
          const float e1 = exact_output(rows, mi, nd, hf, 1, l_row, rcp_l, 0.0f);
          o_pair = pack_bf16x2(e0, e1);  // = finalize_output(e, 7) of each, packed
          // output_residual(e, o) = round_bf16(e - o), packed: RN to BF16 once either way
          if (residual) r_pair = pack_bf16x2(sub_rn(e0, bf16_lo(o_pair)), sub_rn(e1, bf16_hi(o_pair)));
        } else {
          float o2[2], r2[2] = {0.0f, 0.0f};
          if (residual) {  // uniform: both loops are straight-line code
#pragma unroll
            for (int e2 = 0; e2 < 2; ++e2) {
              const float exact = exact_output(rows, mi, nd, hf, e2, l_row, rcp_l, rcp_shadow);
              o2[e2] = kPaper ? rounded_output(rows, bits, mi, nd, hf, e2, l_row, rcp_l) : fused::finalize_output(exact, bits);
              r2[e2] = output_residual(exact, o2[e2]);
            }
          } else {
#pragma unroll
            for (int e2 = 0; e2 < 2; ++e2) o2[e2] = rounded_output(rows, bits, mi, nd, hf, e2, l_row, rcp_l);
          }
          o_pair = pack_bf16x2(o2[0], o2[1]);
          r_pair = pack_bf16x2(r2[0], r2[1]);
        }
        emit(i, rows.lrow0 + row_offset(mi, hf), nd, o_pair, r_pair);
      }
    });
  }

  // O (and its residual) straight to global memory (the element-wise epilogue).
  __device__ static void store_outputs(const Rows& rows, const ForwardParams& p, int b_, int h_, int t) {
    std::uint16_t* o_head = p.o + p.o_strides.head(b_, h_);
    std::uint16_t* r_head = p.o_residual ? p.o_residual + p.o_strides.head(b_, h_) : nullptr;
    finalize_outputs(rows, p, r_head != nullptr, [&](int i, int, int nd, std::uint32_t o2, std::uint32_t r2) {
      const std::int64_t at = i * p.o_strides.t + nd * 8 + 2 * t;
      *reinterpret_cast<std::uint32_t*>(o_head + at) = o2;
      if (r_head) *reinterpret_cast<std::uint32_t*>(r_head + at) = r2;
    });
  }

  // lse and the event counters of the rows this thread leads. Rows that saw no key: lse = +inf.
  __device__ static void store_row_stats(const Rows& rows, const ForwardParams& p, int b_, int h_, int t) {
    for_each_row(rows, p, [&](int mi, int hf, int i, float l_row, bool seen) {
      if (t != 0) return;
      const float m = rows.softmax.m[mi][hf];
      p.lse[(std::int64_t(b_) * p.heads + h_) * p.q_len + i] = seen ? (kPaper ? paper::lse(l_row, m) : fused::lse(l_row, m)) : kInfinity;
      if (rows.events.counting() && seen) rows.events.add_to(p.counters[h_], mi, hf);  // one record per query head
    });
  }

  __device__ static void store(const Rows& rows, const ForwardParams& p, int b_, int h_, int t) {
    store_outputs(rows, p, b_, h_, t);
    store_row_stats(rows, p, b_, h_, t);
  }
};

// Keys past a row's last visible key become -inf (excluded, as the CPU oracle excludes them).
// Element (mi, nj, e) is key key0 + 8 nj + 2t + (e % 2) of row (mi, e / 2). Only sub-tiles on the
// causal diagonal or past Tk have any.
template <int BK, int MR, int NT>
__device__ __forceinline__ void mask_scores(float (&sc)[MR][NT][4], int key0, int min_last, int t, const int (&last)[MR][2]) {
  if (key0 + BK - 1 <= min_last) return;
#pragma unroll
  for (int mi = 0; mi < MR; ++mi)
#pragma unroll
    for (int nj = 0; nj < NT; ++nj)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (key0 + nj * 8 + 2 * t + (e & 1) > last[mi][e / 2]) sc[mi][nj][e] = -__builtin_huge_valf();
}

// Scores as the mode defines them (paper: BF16 S; fused: the raw FP32 dot, scaled inside the
// exponent), masked. Shared by the mma.sync and wgmma forward kernels, which lay scores out alike.
template <bool kPaper, int BK, int MR, int NT>
__device__ __forceinline__ void mode_scores_and_mask(float (&sc)[MR][NT][4], float scale, int key0, int min_last, int t,
                                                     const int (&last)[MR][2]) {
  if constexpr (kPaper) {
#pragma unroll
    for (int mi = 0; mi < MR; ++mi)
#pragma unroll
      for (int nj = 0; nj < NT; ++nj)
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[mi][nj][e] = paper::score(sc[mi][nj][e], scale);
  }
  mask_scores<BK>(sc, key0, min_last, t, last);
}

// paper: the masked scores of a sub-tile as BF16 pairs sp[nj][hf] (keys key0 + 8 nj + 2t, + 1 of
// row hf), two per conversion. Masking the dot first gives what masking the score gives, since
// paper::score(-inf) = -inf.
template <int BK, int NT>
__device__ __forceinline__ void paper_score_pairs(float (&dots)[1][NT][4], float scale, int key0, int min_last, int t,
                                                  const int (&last)[1][2], std::uint32_t (&sp)[NT][2]) {
  mask_scores<BK>(dots, key0, min_last, t, last);
#pragma unroll
  for (int nj = 0; nj < NT; ++nj)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) sp[nj][hf] = paper_score_pair(dots[0][nj][2 * hf], dots[0][nj][2 * hf + 1], scale);
}

}  // namespace stableflash::attention::cuda
