// Spectral norms of weight matrices, the paper's fast indicator of the failure (its W_Q norms in
// the failing layer blow up long before the loss does). Power iteration, warm-started from the
// previous probe's right singular vector, so a probe every N steps costs a few matrix-vector
// products per matrix.
#pragma once

#include <cstdint>
#include <vector>

namespace stableflash::diag {

// Largest singular value of the row-major matrix W [rows, cols] (leading dimension ld) by rounds of
// v <- W^T W v / |W^T W v|, in FP64: at most `iterations`, fewer when `tolerance` > 0 and a round
// changes the estimate by at most tolerance times itself (the remaining error is then about
// tolerance * r / (1 - r), r = (sigma_2 / sigma_1)^2). `v` is the warm start (resized to cols and
// filled with a fixed unit vector when empty or of another size) and receives the new estimate.
// Converges to the top singular value from below; a warm start from the last probe needs few rounds.
double spectral_norm(const float* w, int rows, int cols, std::int64_t ld, std::vector<double>& v, int iterations,
                     double tolerance = 0.0);

}  // namespace stableflash::diag
