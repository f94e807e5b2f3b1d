// The attention probes of a training step, computed on the host from a capture (the layer's own
// BF16 q, k, v, O, its rounding residual, lse and dO; model/attention_capture.hpp), so the CPU and
// the GPU trainer share one definition. docs/training.md ("Probes") states each definition next to
// the metrics.jsonl key it fills; the rounding points are docs/numerics-contract.md's (rounding_points.hpp) and
// the shift is the layer's policy (shift_policies.hpp), as in the kernels.
#pragma once

#include <cstdint>
#include <vector>

#include "stableflash/model/attention_capture.hpp"

namespace stableflash::diag {

// `count` query rows of a sequence of `len`, evenly spaced and ending with the last row (which sees
// every key); all rows when count >= len.
std::vector<int> sampled_rows(int len, int count);

// Statistics of one head over the sampled rows of every captured sequence, walking key tiles as
// the layer's numerics do (tile_k), with the layer's shift policy.
struct HeadRowStats {
  std::int64_t rows = 0;               // rows looked at (sequences x sampled rows with a visible key)
  double max_logit = 0;                // the largest score S over those rows' visible keys (S as the mode rounds it)
  std::int64_t repeated_max_rows = 0;  // rows whose S maximum occurs at >= 2 keys (before any policy)
  std::int64_t tie_event_rows = 0;     // rows where some key tile feeds >= 2 BF16(P-bar) == 1.0 into P-bar V
  std::int64_t pbar_ones = 0;          // entries with BF16(P-bar) == 1.0 (after the policy's shift), all tiles
  double top_mass = 0;                 // mean over the rows of the largest P = exp(S_max - lse), with the saved lse
};
std::vector<HeadRowStats> attention_row_stats(const model::LayerCapture& c, const std::vector<int>& rows);

// The delta shadow (the paper's Fig. 5a): per head, the sum over every captured row of
// delta_used - delta_fp32, where delta_used is what the layer's backward used (attention_delta
// with its delta_source) and delta_fp32 = sum_d dO * (O + o_residual) in FP64: the delta of the
// output before its last rounding.
struct DeltaShadow {
  double sum = 0;             // over all heads
  std::vector<double> heads;  // [heads]
  std::int64_t rows = 0;
};
DeltaShadow delta_shadow(const model::LayerCapture& c);

// The shared direction (the paper's Fig. 4): dW_Q's error is sum_i (delta_lp - delta_hp)_i R_i
// with the rank-1 terms R_i = X_i (P K)_i^T (X_i: row i of c_attn's input, [C]; (P K)_i = sum_j
// P_ij k_j, [D], per head, P_ij = exp(S_ij - lse_i)). Per head, the mean over pairs of sampled
// rows (of every captured sequence) of the Frobenius cosine
//   <R_i, R_j> / (|R_i| |R_j|) = (X_i . X_j)(PK_i . PK_j) / (|X_i| |X_j| |PK_i| |PK_j|);
// 1 when all terms share one direction. Rows whose X or PK is zero are left out.
std::vector<double> rank1_similarity(const model::LayerCapture& c, const std::vector<int>& rows);

}  // namespace stableflash::diag
