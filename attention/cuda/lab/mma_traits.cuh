// Tile traits of the kernel lab's mma.sync kernels (FlashAttention-2 style, the stepping stone the
// wgmma kernels grew from; comparison only).
#pragma once

#include <cstdint>

#include "kernel_params.cuh"

namespace stableflash::attention::cuda {

// Forward tiles. Each warp owns 16 * kRowTiles query rows; keys are walked in sub-tiles of 64.
// `paper` numerics carry three D-wide row vectors (BF16 O, the tile's FP32 P-bar*V, the FP32
// shadow for `compensated`), so it uses one 16-row tile per warp to stay within registers.
template <int kHeadDim_, bool kPaper_>
struct ForwardTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kPaper = kPaper_;
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRowTiles = kPaper ? 1 : 2;
  static constexpr int kBlockQ = kWarps * 16 * kRowTiles;
  static constexpr int kBlockK = 64;
  // CTAs per SM the register budget is sized for (__launch_bounds__): paper's one row tile per warp
  // fits three (<= 168 registers); fused keeps 2 row tiles of accumulators and fits two at D = 64.
  static constexpr int kMinBlocks = kPaper ? (kHeadDim == 64 ? 3 : 2) : (kHeadDim == 64 ? 2 : 1);
  static constexpr int kKeyTiles = kBlockK / 8;   // n-tiles of S per row tile
  static constexpr int kDimTiles = kHeadDim / 8;  // n-tiles of O per row tile
  static constexpr int kSmemKV = kBlockK * kHeadDim * 2;
  // Shared memory: tiles in the XOR swizzle of ldmatrix (SwizzledTile), K and V double buffered.
  struct SharedStorage {
    std::uint16_t q[kBlockQ * kHeadDim];
    std::uint16_t k[2][kBlockK * kHeadDim];
    std::uint16_t v[2][kBlockK * kHeadDim];
    ForwardRowEvents events[kBlockQ];        // counting runs (EventCounters)
    float top[kRowTiles * 2 * 2][kThreads];  // the pre-pass's top-2 slots (TopTwoPrepass)
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage);
  static_assert(kHeadDim == 64 || kHeadDim == 128, "head dims with kernels: 64, 128");
  static_assert(kBlockK % 16 == 0 && kBlockQ % 16 == 0, "mma tiles are 16 x 16");
};

// Backward tiles: a CTA owns kBlockK keys (16 per warp) and walks query blocks of kBlockQ.
template <int kHeadDim_, bool kPaper_>
struct BackwardTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kPaper = kPaper_;
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBlockK = kWarps * 16;
  static constexpr int kBlockQ = 64;
  static constexpr int kQueryTiles = kBlockQ / 8;  // n-tiles of S^T per warp
  static constexpr int kDimTiles = kHeadDim / 8;
  static constexpr int kSmemQ = kBlockQ * kHeadDim * 2;
  // Shared memory: tiles in the XOR swizzle of ldmatrix (SwizzledTile); Q, dO, lse and delta double
  // buffered.
  struct SharedStorage {
    std::uint16_t k[kBlockK * kHeadDim];
    std::uint16_t v[kBlockK * kHeadDim];
    std::uint16_t q[2][kBlockQ * kHeadDim];
    std::uint16_t d_o[2][kBlockQ * kHeadDim];
    std::uint16_t ds[kBlockK * kBlockQ];  // dS^T [keys, queries]
    float rowvals[2 * 2 * kBlockQ];       // [buffer][lse | delta][query]
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage);
  // dQ = dS K: 4 row tiles of 16 queries x 2 halves of D, one per warp
  static constexpr int kDqRowTiles = kBlockQ / 16;
  static constexpr int kDqColSplit = kWarps / kDqRowTiles;
  static constexpr int kDqDimTiles = kHeadDim / 8 / kDqColSplit;
  static_assert(kHeadDim == 64 || kHeadDim == 128, "head dims with kernels: 64, 128");
  static_assert(kWarps % kDqRowTiles == 0 && kDqDimTiles % 2 == 0, "dQ work splits evenly over warps");
  static_assert(kBlockQ == 64, "the dS^T tile uses the 8-chunk swizzle of 64-wide rows");
};

}  // namespace stableflash::attention::cuda
