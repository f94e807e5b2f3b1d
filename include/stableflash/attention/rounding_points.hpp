// The rounding points of the `paper` and `fused` numerics (docs/numerics-contract.md "Modes"), element by
// element. The CPU oracle and the CUDA kernels call these functions, so "what is rounded where"
// has one definition. Dot products and row sums are the callers' business: they hand in the FP32
// result of an FP32-accumulated dot product (accumulation order may differ between CPU and GPU).
//
// Notation: S scores, m running row max (shift), P-bar = exp(S - m), l row sum, O the output
// accumulator, c = exp(m_old - m_new) the rescale factor, `bits` = round_bits (7 = BF16).
#pragma once

#include <cmath>

#include "stableflash/attention/modes.hpp"
#include "stableflash/numerics/bf16.hpp"
#include "stableflash/numerics/fp32_ops.hpp"

namespace stableflash::attention {

// Row sums of a tile are clamped here in `paper` numerics, as the authors' code does. Kept on
// purpose: it is part of what is reproduced, and it is why their fix silently returns ~0 when
// exp(-(beta-1) r_m) underflows.
inline constexpr float kPaperTileSumClamp = 1e-10f;

// Output-side rounding (O-bar and O): RNE to `bits` stored significand bits. bits = 7 is plain
// BF16 rounding, one instruction on the GPU (the same values: round_bf16 is RNE to 7 bits).
SF_HD float round_output(float x, int bits) { return bits == 7 ? round_bf16(x) : round_to_bits_rne(x, bits); }

namespace paper {

// S = BF16(BF16(FP32-dot(q, k)) * scale): two roundings, as the authors' code does.
SF_HD float score(float dot_fp32, float scale) { return round_bf16(mul_rn(round_bf16(dot_fp32), scale)); }

// P-bar = exp(BF16(S - m)) in FP32.
SF_HD float pbar(float s, float m) { return exp_fp32(round_bf16(sub_rn(s, m))); }

// The P-bar*V operand: BF16(P-bar).
SF_HD float pbar_operand(float pbar_fp32) { return round_bf16(pbar_fp32); }

SF_HD float clamp_tile_sum(float l_tile) { return fmaxf(l_tile, kPaperTileSumClamp); }

// O-bar_tile = BF16(FP32-dot(BF16(P-bar), v)), at `bits`.
SF_HD float tile_output(float dot_fp32, int bits) { return round_output(dot_fp32, bits); }

// c = exp(BF16(m_old - m_new)) in FP32 (m_old = -inf on the first tile gives c = 0).
SF_HD float rescale(float m_old, float m_new) { return exp_fp32(round_bf16(sub_rn(m_old, m_new))); }

// O = BF16(BF16(O * c) + O-bar_tile).
SF_HD float update_output(float o, float c, float o_tile, int bits) {
  return round_output(add_rn(round_output(mul_rn(o, c), bits), o_tile), bits);
}

// l = BF16(c * l + l_tile) (the BF16 row sum is carried between tiles).
SF_HD float update_sum(float l, float c, float l_tile) { return round_bf16(add_rn(mul_rn(c, l), l_tile)); }

// The FP32 shadow of the same accumulation, used for the `compensated` residual: the same BF16(P-bar)*v
// products, rescaled and summed in FP32 (docs/numerics-contract.md `delta_source`).
SF_HD float update_shadow(float acc, float c, float tile_dot_fp32) { return add_rn(mul_rn(acc, c), tile_dot_fp32); }

// Final O = BF16(O / l); lse = log(l) + m in FP32.
SF_HD float finalize_output(float o, float l, int bits) { return round_output(div_rn(o, l), bits); }
SF_HD float lse(float l, float m) { return add_rn(log_fp32(l), m); }

// Backward: delta = BF16(FP32-rowsum(dO * O)); dP = BF16(FP32-dot(dO, v)); P = exp(S - lse) in
// FP32; dS = P * (dP - delta) * scale in FP32.
SF_HD float delta(float rowsum_fp32) { return round_bf16(rowsum_fp32); }
SF_HD float prob(float s, float lse_value) { return exp_fp32(sub_rn(s, lse_value)); }
SF_HD float dprob(float dot_fp32) { return round_bf16(dot_fp32); }
SF_HD float dscore(float p, float dp, float delta_value, float scale) {
  return mul_rn(mul_rn(p, sub_rn(dp, delta_value)), scale);
}

}  // namespace paper

namespace fused {

// S = FP32-dot(q, k) * scale, never rounded to BF16.
SF_HD float score(float dot_fp32, float scale) { return mul_rn(dot_fp32, scale); }

// P-bar = exp(S - m) in FP32; its BF16 rounding is the P-bar*V operand.
SF_HD float pbar(float s, float m) { return exp_fp32(sub_rn(s, m)); }
SF_HD float pbar_operand(float pbar_fp32) { return round_bf16(pbar_fp32); }

// What the row sum adds for one entry: the FP32 P-bar, or the BF16 value actually used above.
SF_HD float sum_term(float pbar_fp32, Normalizer n) {
  return n == Normalizer::bf16 ? round_bf16(pbar_fp32) : pbar_fp32;
}

SF_HD float rescale(float m_old, float m_new) { return exp_fp32(sub_rn(m_old, m_new)); }

// The GPU kernels' evaluation of the same exponentials: the same rounding points as pbar(), rescale() and
// prob() (S = FP32(dot * scale), then S - x in FP32), with the hardware exp2 for exp:
// exp(y) = exp2(FP32(y * log2(e))). A score equal to m gives exactly 1, as pbar() does, so tied
// maxima stay exact ties (the midpoint structure the audit measures). The relative error is
// ~2^-22 + |y| 2^-24 (docs/numerics-contract.md allows the exp implementation to differ).
// FlashAttention's single FMA(dot, scale log2 e, -m log2 e) would save two operations a score but
// gives 1 + (the rounding error of m log2 e) at the maximum, a factor of the row that the FP32 row
// sum carries and the BF16 numerator does not, which biases the compensated delta
// (docs/numerics-findings.md section 3): measured and not adopted.
inline constexpr float kLog2e = 1.44269504088896341f;
SF_HD float exp_fast(float y) { return exp2_fast(mul_rn(y, kLog2e)); }
SF_HD float pbar_fast(float s, float m) { return exp_fast(sub_rn(s, m)); }
SF_HD float prob_fast(float s, float lse_value) { return exp_fast(sub_rn(s, lse_value)); }
SF_HD float rescale_fast(float m_old, float m_new) { return exp_fast(sub_rn(m_old, m_new)); }  // 1 when m is unchanged

// The same exponentials on scores in log2 units, where the scale is not a power of two (the GPU's
// pipelined forward walk): t = FP32(dot * c) with c = FP32(scale * log2(e)), P-bar = exp2(FP32(t - m_t))
// with m_t the row's shift in log2 units (shift_log2), c' = exp2(FP32(m_t_old - m_t_new)). One
// multiply a score less than pbar_fast(score(dot, scale), m), and still exactly 1 where the score is
// the standard shift (t = m_t), so tied maxima stay exact ties. The relative error against
// exp(S - m): ~ln 2 (3 (|t| + |m_t|) + |t - m_t|) 2^-24 + the exp2's (docs/numerics-contract.md; the
// bound that tests/attention/log2_scores_test.cpp derives and checks).
// The shift m itself stays in the scores' units (the policies choose it, lse = log l + m).
SF_HD float log2_scale(float scale) { return mul_rn(scale, kLog2e); }
SF_HD float score_log2(float dot, float scale_log2) { return mul_rn(dot, scale_log2); }
SF_HD float pbar_log2(float t, float m_t) { return exp2_fast(sub_rn(t, m_t)); }
SF_HD float rescale_log2(float m_t_old, float m_t_new) { return exp2_fast(sub_rn(m_t_old, m_t_new)); }
// m_t for a shift m that a policy chose from the row maximum r_m = score(r_dot, scale) of the raw dot
// r_dot: the maximum's t plus FP32((m - r_m) log2(e)), i.e. exactly that t where m = r_m (the standard
// shift; t + 0 = t, and where t = -0 the exp2 of +-0 is 1 either way). No test: the kernels evaluate it
// for every row of a step, beside the other rows' maxima.
SF_HD float shift_log2(float r_dot, float scale_log2, float r_m, float m) {
  return add_rn(score_log2(r_dot, scale_log2), mul_rn(sub_rn(m, r_m), kLog2e));
}

// acc = acc * c + FP32-dot(BF16(P-bar), v); l = l * c + l_tile (all FP32).
SF_HD float update_accumulator(float acc, float c, float tile_dot_fp32) { return add_rn(mul_rn(acc, c), tile_dot_fp32); }
SF_HD float update_sum(float l, float c, float l_tile) { return add_rn(mul_rn(l, c), l_tile); }

// O = BF16(acc / l), rounded once; the unrounded acc / l is O_fp32 (for the residual).
SF_HD float unrounded_output(float acc, float l) { return div_rn(acc, l); }
SF_HD float finalize_output(float o_fp32, int bits) { return round_output(o_fp32, bits); }
SF_HD float lse(float l, float m) { return add_rn(log_fp32(l), m); }

// Backward as FlashAttention-2: delta = FP32-rowsum(dO * O); P = exp(S - lse); dP in FP32;
// dS = P * (dP - delta) in FP32, BF16(dS) feeds the dQ/dK products, the scale is applied to
// their FP32 results.
SF_HD float prob(float s, float lse_value) { return exp_fp32(sub_rn(s, lse_value)); }
SF_HD float dscore(float p, float dp, float delta_value) { return mul_rn(p, sub_rn(dp, delta_value)); }

}  // namespace fused

namespace paper {
// The GPU kernels' exp of a shifted score BF16(S - m): the hardware exp2 as in fused::exp_fast
// (docs/numerics-contract.md lets the exp implementation differ from the CPU's expf; relative error ~2^-22 +
// |y| 2^-24, and exp(0) = 1 exactly, so tied maxima stay exact ones). The GPU tests count the
// rare BF16 roundings of P-bar this flips against the CPU oracle.
SF_HD float exp_shifted_fast(float shifted) { return fused::exp_fast(shifted); }
}  // namespace paper

// The compensated residual r = BF16(O_fp32 - O) (docs/numerics-contract.md `delta_source`): O + r recovers
// O_fp32 to within 2^-8 of the rounding error itself.
SF_HD float output_residual(float o_fp32, float o_rounded) { return round_bf16(sub_rn(o_fp32, o_rounded)); }

}  // namespace stableflash::attention
