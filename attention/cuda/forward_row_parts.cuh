// The parts of the forward kernels' per-row state (forward_rows.cuh composes them in ForwardRows):
//   OnlineSoftmax    m, l, the FP32 accumulator acc and their rescale (both numerics)
//   PaperRowState    paper numerics: the unit's m / c / l, O in BF16, its FP32 shadow and l_shadow
//   TopTwoPrepass    the pre-pass's top-2 scores per row, in shared memory
//   EventCounters    the event counters' per-row records, in shared memory
// A thread holds 2 * kRowTiles rows (rows g and g + 8 of each 16-row tile); the four threads of a
// quad hold the same rows, each a quarter of the columns, so row reductions are two shuffles.
#pragma once

#include <cstdint>

#include "kernel_params.cuh"
#include "stableflash/attention/rounding_points.hpp"
#include "warp_mma.cuh"

namespace stableflash::attention::cuda {

// a / b rounded to nearest given rcp = RN(1 / b), in three instructions instead of a division
// (~15 with its range check and slow path, per output element): q = RN(a rcp) is within an ulp of
// a / b, the residual a - q b is exact in one FMA, and one correction step gives RN(a / b)
// (Markstein's theorem) for the normal-range operands the epilogue divides.
__device__ __forceinline__ float quotient_rn(float a, float b, float rcp) {
  const float q = __fmul_rn(a, rcp);
  return __fmaf_rn(__fmaf_rn(-q, b, a), rcp, q);
}

// Row (mi, hf) is row g + 8 hf of row tile mi, row_offset(mi, hf) after the thread's first row.
// Every function below inlines and indexes the register arrays with compile-time constants only
// (unrolled loops), so nvcc keeps the arrays in registers; one run-time index would move an array
// to local memory.

inline constexpr float kInfinity = __builtin_huge_valf();

__device__ constexpr int row_offset(int mi, int hf) { return mi * 16 + 8 * hf; }
__device__ inline bool lane_leads_quad() { return threadIdx.x % 4 == 0; }

// paper scores (BF16 values, one row tile) packed in pairs sp[nj][hf] (keys 8 nj + 2t, + 1 of row
// hf), and back.
template <int N>
__device__ void pack_score_pairs(const float (&sc)[1][N][4], std::uint32_t (&sp)[N][2]) {
#pragma unroll
  for (int nj = 0; nj < N; ++nj)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) sp[nj][hf] = pack_bf16x2(sc[0][nj][2 * hf], sc[0][nj][2 * hf + 1]);
}
template <int N>
__device__ void unpack_score_pairs(const std::uint32_t (&sp)[N][2], float (&sc)[1][N][4]) {
#pragma unroll
  for (int nj = 0; nj < N; ++nj)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) sc[0][nj][2 * hf] = bf16_lo(sp[nj][hf]), sc[0][nj][2 * hf + 1] = bf16_hi(sp[nj][hf]);
}

// The online softmax of the rows, in both modes.
//   fused: m is the shift in use, l this thread's partial sum of P-bar (of BF16(P-bar) with
//          normalizer = bf16; the epilogue adds the quad's four), acc the FP32 O accumulator;
//          when a row's shift grows, l and acc are scaled by c = exp(m_old - m_new).
//   paper: m and l are the row's shift and BF16 row sum as of its last finished unit
//          (PaperRowState::end_unit moves them on), acc the current unit's FP32 P-bar * V.
// acc[mi][nd][2 hf + e2] is column nd * 8 + 2t + e2 of row (mi, hf) (the C fragments).
// A row that has seen no key has m = kUnseen: -inf in paper; in fused the lowest finite float, so
// that its P-bar = exp(S - m) of masked scores (-inf) is 0 and its factor exp(m_old - m_new) is 0,
// or 1 where it stays unseen (its acc and l are 0), with no test for -inf in every step: the
// results of -inf with those tests (0 for exp(-inf - -inf)) wherever a row has a finite score.
template <int MR, int DT, bool kPaper>
struct OnlineSoftmax {
  static constexpr float kUnseen = kPaper ? -kInfinity : -__FLT_MAX__;
  float m[MR][2];    // kUnseen until the row sees a key
  float m_t[MR][2];  // fused, PbarForm::log2_units only: the shift in log2 units (fused::shift_log2), kUnseen alike
  float l[MR][2];
  float acc[MR][DT][4];

  __device__ OnlineSoftmax() {
#pragma unroll
    for (int mi = 0; mi < MR; ++mi) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) m[mi][hf] = m_t[mi][hf] = kUnseen, l[mi][hf] = 0.0f;
#pragma unroll
      for (int nd = 0; nd < DT; ++nd)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mi][nd][e] = 0.0f;
    }
  }

  // Whether the row has seen a key, given its full sum l_row. fused: a row whose maximum is the
  // lowest finite score itself also has m = kUnseen, but its sum holds that maximum's term (>= exp(-1)).
  __device__ bool seen(int mi, int hf, float l_row) const {
    if constexpr (kPaper) return m[mi][hf] != -kInfinity;
    return m[mi][hf] != kUnseen || l_row != 0.0f;
  }

  // fused: the row moves to shift m_new with c = exp(m_old - m_new). kScaleAcc = false leaves acc
  // to rescale_acc (the pipelined walk still has a P-bar * V product in flight on it).
  // l * c rounded on its own (fused::update_sum's mul_rn, then the tile's terms added): a plain
  // multiply let nvcc contract it with the next addition of the row sum into one FMA where the two
  // met in one basic block, so the bits of l followed the surrounding code (the D = 128 fast path's
  // loop had the FMA, the D = 64 one had not, and a change elsewhere in the kernel moved them:
  // docs/benchmarks.md, "The forward's tile end fused with the next tile's first step").
  template <bool kScaleAcc>
  __device__ void move_shift(int mi, int hf, float m_new, float c) {
    l[mi][hf] = __fmul_rn(l[mi][hf], c);
    if constexpr (kScaleAcc) scale_acc_row(mi, hf, c);
    m[mi][hf] = m_new;
  }
  __device__ void scale_acc_row(int mi, int hf, float c) {
#pragma unroll
    for (int nd = 0; nd < DT; ++nd) acc[mi][nd][2 * hf] *= c, acc[mi][nd][2 * hf + 1] *= c;
  }
  __device__ void rescale_acc(const float (&c)[MR][2]) {
#pragma unroll
    for (int mi = 0; mi < MR; ++mi)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) scale_acc_row(mi, hf, c[mi][hf]);
  }

  // fused: an element's O_fp32 = acc / l (fused::unrounded_output), given rcp_l = RN(1 / l).
  __device__ float output(int mi, int nd, int hf, int e2, float l_row, float rcp_l) const {
    return quotient_rn(acc[mi][nd][2 * hf + e2], l_row, rcp_l);
  }
};

// paper numerics' row state beside OnlineSoftmax (docs/numerics-contract.md: rounding per numerics
// tile, i.e. per shift unit). Per unit: its shift m_unit, the factor c_unit = exp(m_old - m_unit)
// that moves the row from its previous shift, and this thread's partial P-bar sum l_unit. Across
// units: O as BF16 values (packed, o_bf[mi][nd][hf]: columns nd * 8 + 2t, + 1 of row (mi, hf)) and,
// for the compensated delta's residual only, its FP32 shadow over the FP32 row sum l_shadow.
template <int MR, int DT>
struct PaperRowState {
  std::uint32_t o_bf[MR][DT][2];
  float shadow[MR][DT][4];
  float l_shadow[MR][2];
  float m_unit[MR][2];  // -inf: the row sees no key in the unit
  float c_unit[MR][2];
  float l_unit[MR][2];

  __device__ PaperRowState() {
#pragma unroll
    for (int mi = 0; mi < MR; ++mi) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) m_unit[mi][hf] = -kInfinity, c_unit[mi][hf] = 1.0f, l_unit[mi][hf] = 0.0f, l_shadow[mi][hf] = 0.0f;
#pragma unroll
      for (int nd = 0; nd < DT; ++nd) {
        o_bf[mi][nd][0] = o_bf[mi][nd][1] = 0u;
#pragma unroll
        for (int e = 0; e < 4; ++e) shadow[mi][nd][e] = 0.0f;
      }
    }
  }

  // A unit starts for row (mi, hf): with its shift m_new and factor c if the row sees a key in it.
  __device__ void start_unit(int mi, int hf, bool active, float m_new, float c) {
    c_unit[mi][hf] = active ? c : 1.0f;
    m_unit[mi][hf] = active ? m_new : -kInfinity;
    l_unit[mi][hf] = 0.0f;
  }

  // The shift P-bar = exp(BF16(S - m)) uses: 0 for a row with no key in the unit (all its scores are -inf).
  __device__ float shift(int mi, int hf) const { return m_unit[mi][hf] == -kInfinity ? 0.0f : m_unit[mi][hf]; }

  // The unit's rounding points for row (mi, hf) after its last sub-tile: O-bar = the unit's P-bar * V
  // (s.acc, zeroed for the next unit) at the output rounding, O, l and the shadow moved on by
  // c_unit, and the row takes the unit's shift.
  template <class Bits>
  __device__ void end_unit(OnlineSoftmax<MR, DT, true>& s, const ForwardParams& p, Bits bits, int mi, int hf) {
    // every lane shuffles; the skip below is quad-uniform
    const float l_tile = paper::clamp_tile_sum(quad_sum(l_unit[mi][hf]));
    if (m_unit[mi][hf] == -kInfinity) return;  // the row skips this unit (acc stayed 0)
    const float c = c_unit[mi][hf];
    if (p.o_residual) {  // the FP32 shadow serves the residual only
#pragma unroll
      for (int nd = 0; nd < DT; ++nd)
#pragma unroll
        for (int e2 = 0; e2 < 2; ++e2)
          shadow[mi][nd][2 * hf + e2] = paper::update_shadow(shadow[mi][nd][2 * hf + e2], c, s.acc[mi][nd][2 * hf + e2]);
    }
#pragma unroll
    for (int nd = 0; nd < DT; ++nd) {
      float o2[2] = {bf16_lo(o_bf[mi][nd][hf]), bf16_hi(o_bf[mi][nd][hf])};
#pragma unroll
      for (int e2 = 0; e2 < 2; ++e2) {
        const float dot = s.acc[mi][nd][2 * hf + e2];
        o2[e2] = paper::update_output(o2[e2], c, paper::tile_output(dot, bits), bits);
        s.acc[mi][nd][2 * hf + e2] = 0.0f;
      }
      o_bf[mi][nd][hf] = pack_bf16x2(o2[0], o2[1]);  // exact: O holds <= 7 significand bits
    }
    s.l[mi][hf] = paper::update_sum(s.l[mi][hf], c, l_tile);
    if (p.o_residual) l_shadow[mi][hf] = add_rn(mul_rn(l_shadow[mi][hf], c), l_tile);  // the shadow serves the residual only
    s.m[mi][hf] = m_unit[mi][hf];
  }

  // An element's O_fp32 (the shadow over its FP32 sum, given rcp_shadow = RN(1 / l_shadow)) and its
  // rounded O (O over the BF16 sum l, given rcp_l = RN(1 / l); paper::finalize_output).
  __device__ float exact_output(int mi, int nd, int hf, int e2, float rcp_shadow) const {
    return quotient_rn(shadow[mi][nd][2 * hf + e2], l_shadow[mi][hf], rcp_shadow);
  }
  template <class Bits>
  __device__ float rounded_output(Bits bits, int mi, int nd, int hf, int e2, float l_row, float rcp_l) const {
    const float o_acc = e2 == 0 ? bf16_lo(o_bf[mi][nd][hf]) : bf16_hi(o_bf[mi][nd][hf]);
    return round_output(quotient_rn(o_acc, l_row, rcp_l), bits);
  }
};
struct NoPaperRowState {};  // fused numerics keep none of it

// The pre-pass of a unit of several sub-tiles whose shift needs the unit's maximum: the unit's two
// largest scores per row, a multiset (equal maxima count twice). That decides every policy, the
// published rule's tie count included, because it only asks whether >= 2 scores reach r_m - eps.
// Kept in shared memory, [slot][thread] (no bank conflicts): the pre-pass is the slow path and the
// fast path spends no registers on it. paper keeps its BF16 scores' top-2 as packed pairs (even and
// odd keys, merged when the unit starts), fused as floats.
template <int MR, bool kPaper>
struct TopTwoPrepass {
  static constexpr int kSlots = MR * 2 * 2;                  // (mi, hf) x {top1, top2}
  static constexpr std::uint32_t kNegInfPair = 0xff80ff80u;  // BF16 (-inf, -inf)
  float* const slots;                                        // [kSlots][blockDim.x]

  __device__ explicit TopTwoPrepass(float* smem) : slots(smem) {}  // ForwardRows resets each row's slots

  __device__ float& at(int mi, int hf, int which) const { return slots[((mi * 2 + hf) * 2 + which) * blockDim.x + threadIdx.x]; }
  __device__ std::uint32_t& pair(int mi, int hf, int which) const { return reinterpret_cast<std::uint32_t&>(at(mi, hf, which)); }
  __device__ void reset(int mi, int hf) const {
    if (slots == nullptr) return;  // a kernel without the pre-pass (the warp-specialized forward) passes none
    if constexpr (kPaper) {
      pair(mi, hf, 0) = pair(mi, hf, 1) = kNegInfPair;
    } else {
      at(mi, hf, 0) = at(mi, hf, 1) = -kInfinity;
    }
  }

  // Folds a sub-tile's scores into the unit's top-2.
  template <int N>
  __device__ void fold(const float (&sc)[MR][N][4]) const {
    if constexpr (kPaper) {
      std::uint32_t sp[N][2];
      pack_score_pairs(sc, sp);
      fold_pairs(sp);
    } else {
#pragma unroll
      for (int mi = 0; mi < MR; ++mi)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          float a1 = at(mi, hf, 0), a2 = at(mi, hf, 1);
#pragma unroll
          for (int nj = 0; nj < N; ++nj)
#pragma unroll
            for (int e2 = 0; e2 < 2; ++e2) {
              const float x = sc[mi][nj][2 * hf + e2];
              a2 = fmaxf(a2, fminf(a1, x));  // the multiset's second largest
              a1 = fmaxf(a1, x);
            }
          at(mi, hf, 0) = a1, at(mi, hf, 1) = a2;
        }
    }
  }

  // paper: the same on BF16 score pairs sp[nj][hf] (keys 8 nj + 2t, + 1 of row hf), two keys per
  // instruction.
  template <int N>
  __device__ void fold_pairs(const std::uint32_t (&sp)[N][2]) const {
    static_assert(kPaper && MR == 1, "paper numerics: one row tile per warp");
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      std::uint32_t a1 = pair(0, hf, 0), a2 = pair(0, hf, 1);
#pragma unroll
      for (int nj = 0; nj < N; ++nj) {
        a2 = bf16x2_max(a2, bf16x2_min(a1, sp[nj][hf]));
        a1 = bf16x2_max(a1, sp[nj][hf]);
      }
      pair(0, hf, 0) = a1, pair(0, hf, 1) = a2;
    }
  }

  // The unit's top-2 of row (mi, hf) over the quad (every lane shuffles); the slots are reset for
  // the next unit.
  __device__ void take(int mi, int hf, float& r1, float& r2) const {
    if constexpr (kPaper) {
      const std::uint32_t a1 = pair(mi, hf, 0), a2 = pair(mi, hf, 1);
      const float x = bf16_lo(a1), y = bf16_hi(a1);
      r1 = fmaxf(x, y);
      r2 = fmaxf(fminf(x, y), fmaxf(bf16_lo(a2), bf16_hi(a2)));
    } else {
      r1 = at(mi, hf, 0), r2 = at(mi, hf, 1);
    }
    reset(mi, hf);
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {  // merge the quad's top-2 lists
      const float o1 = __shfl_xor_sync(0xffffffffu, r1, off), o2 = __shfl_xor_sync(0xffffffffu, r2, off);
      r2 = fmaxf(fminf(r1, o1), fmaxf(r2, o2));
      r1 = fmaxf(r1, o1);
    }
  }
};

// The diagnostics (ForwardArgs::ties; counting runs only): one ForwardRowEvents record per row of
// the CTA in shared memory, written by the quad's first lane, so the fast path keeps no registers
// for them. Counting runs walk in units of one numerics tile (cta_keys): `ones` counts per tile.
template <int MR>
struct EventCounters {
  static constexpr int kTieEvent = 1, kFellBack = 2;  // ForwardRowEvents::flags
  ForwardRowEvents* const records;                    // the CTA's rows; null: not counting
  const int lrow0;                                    // this thread's first row within the CTA

  __device__ EventCounters(ForwardRowEvents* records_, int lrow0_) : records(records_), lrow0(lrow0_) {}  // ForwardRows clears each row

  __device__ bool counting() const { return records != nullptr; }
  __device__ ForwardRowEvents& at(int mi, int hf) const { return records[lrow0 + row_offset(mi, hf)]; }
  __device__ void clear(int mi, int hf) const {
    // threadIdx.x % 4 rather than lane_leads_quad(): nvcc then forms the predicate as before the
    // parts were split (one register less in the fused D = 64 kernel with hashed_offset)
    if (records && threadIdx.x % 4 == 0) at(mi, hf) = ForwardRowEvents{0, -kInfinity, 0, 0};
  }

  // A unit starts: whether the policy fell back; the tile's count of ones restarts.
  __device__ void start_unit(int mi, int hf, bool fell) const {
    if (records && lane_leads_quad()) {
      ForwardRowEvents& ev = at(mi, hf);
      ev.flags |= fell ? kFellBack : 0;
      ev.ones = 0;
    }
  }

  // Whether the row's maximum score (before any policy) occurs at >= 2 keys. Counting runs only.
  template <int N>
  __device__ void count_repeated_max(const float (&sc)[MR][N][4]) const {
#pragma unroll
    for (int mi = 0; mi < MR; ++mi)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        float mx = -kInfinity;
#pragma unroll
        for (int nj = 0; nj < N; ++nj) mx = fmaxf(mx, fmaxf(sc[mi][nj][2 * hf], sc[mi][nj][2 * hf + 1]));
        mx = quad_max(mx);
        int n = 0;
#pragma unroll
        for (int nj = 0; nj < N; ++nj) n += (sc[mi][nj][2 * hf] == mx) + (sc[mi][nj][2 * hf + 1] == mx);
        n = quad_sum(n);  // every lane shuffles
        ForwardRowEvents& ev = at(mi, hf);
        if (!lane_leads_quad() || mx == -kInfinity || mx < ev.rep_max) continue;
        ev.rep_count = (mx > ev.rep_max ? 0 : ev.rep_count) + n;
        ev.rep_max = mx;
      }
  }

  // The BF16(P-bar) == 1 entries of a tile's row tile mi.
  template <int N>
  __device__ void count_ones(int mi, const float (&sc)[MR][N][4]) const {
    if (!records) return;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      int n = 0;
#pragma unroll
      for (int nj = 0; nj < N; ++nj) n += (round_bf16(sc[mi][nj][2 * hf]) == 1.0f) + (round_bf16(sc[mi][nj][2 * hf + 1]) == 1.0f);
      n = quad_sum(n);
      if (lane_leads_quad()) at(mi, hf).ones += n;
    }
  }

  // A unit ends: two or more ones in the tile make a tie event.
  __device__ void end_unit(int mi, int hf) const {
    if (records && lane_leads_quad()) {
      ForwardRowEvents& ev = at(mi, hf);
      ev.flags |= ev.ones >= 2 ? kTieEvent : 0;
    }
  }

  // The row's events into its query head's record (entry.cu sums the heads'); rows that saw a key.
  __device__ void add_to(DeviceTieCounters& c, int mi, int hf) const {
    const ForwardRowEvents& ev = at(mi, hf);
    if (ev.flags & kTieEvent) atomicAdd(&c.tie_event_rows, 1ull);
    if (ev.rep_count >= 2) atomicAdd(&c.repeated_max_rows, 1ull);
    if (ev.flags & kFellBack) atomicAdd(&c.fallback_rows, 1ull);
  }
};

}  // namespace stableflash::attention::cuda
