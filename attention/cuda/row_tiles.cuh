// [rows, D] BF16 tiles of one (b, h) in the SW128 layout (wgmma.cuh's WgmmaTile): copied in by
// bulk tensor copies in 64 x 64 boxes, and multiplied as C = A B^T with both tiles K-major. The
// forward's S = Q K^T is such a product; so are the `exact` delta pass's S and dP = dO V^T.
#pragma once

#include <cstdint>

#include "tma.cuh"
#include "wgmma.cuh"

namespace stableflash::attention::cuda {

// Copies rows row0 .. row0 + ROWS - 1 (ROWS a multiple of 64) of head (h, b) into the SW128 layout:
// column block x at x * ROWS * 128 bytes, 64-row box r at r * 8 KiB within it. The copies
// complete on `bar`, whose expected bytes the caller has set; rows past the tensor's end arrive as
// zeros (and count as bytes).
template <int D, int ROWS>
__device__ __forceinline__ void load_tile_boxes(const CUtensorMap* map, std::uint32_t dst, int row0, int h, int b, std::uint32_t bar) {
#pragma unroll
  for (int x = 0; x < D / 64; ++x)
#pragma unroll
    for (int r = 0; r < ROWS / 64; ++r)
      tma_load_4d(dst + x * WgmmaTile<ROWS, D>::kBlockBytes + r * 64 * 128, map, 64 * x, row0 + 64 * r, h, b, bar);
}

// The same, the tile's bytes expected on `bar` first (one arrival per tile).
template <int D, int ROWS>
__device__ __forceinline__ void load_tile(const CUtensorMap* map, std::uint32_t dst, int row0, int h, int b, std::uint32_t bar) {
  mbar_arrive_expect_tx(bar, ROWS * D * 2);
  load_tile_boxes<D, ROWS>(map, dst, row0, h, b, bar);
}

// C = A B^T for the warpgroup's 64 rows of A and N rows of B (c[nj]: B rows 8 nj ..), e.g. S = Q K^T;
// both tiles K-major, so step kk is 32 bytes into a 64-column block. B is the first N rows of a
// tile of kTileRows (its 64-column blocks kTileRows rows apart). Issued, not waited for.
template <int D, int N, int kTileRows = N>
__device__ __forceinline__ void issue_scores(float (&c)[N / 8][4], std::uint32_t s_a, std::uint32_t s_b) {
  static_assert(N <= kTileRows);
  const Sw128Desc a(s_a, 16, 1024), bt(s_b, 16, 1024);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const std::uint32_t a_off = (kk / 4) * WgmmaTile<64, D>::kBlockBytes + (kk % 4) * 32;
    const std::uint32_t b_off = (kk / 4) * WgmmaTile<kTileRows, D>::kBlockBytes + (kk % 4) * 32;
    wgmma_ss<N>(c, a.at(a_off), bt.at(b_off), kk > 0);
  }
}

}  // namespace stableflash::attention::cuda
