// Hopper warpgroup MMA (wgmma, sm_90a): shared-memory matrix descriptors for the 128-byte
// swizzled layout, and m64nNk16 BF16 -> FP32 products with A from shared memory or registers.
//
// Layout (CuTe's canonical GMMA "SW128" atoms, mma_traits_sm90_gmma.hpp): a [rows, D] BF16 tile is
// stored as D/64 column blocks of [rows, 64]; each row of a block is 128 bytes whose 16-byte chunk c
// sits at chunk c ^ (row % 8), blocks 1024-byte aligned. The same bytes serve
//   K-major operands (Q and K: the reduction dim d contiguous): 8-row groups 1024 B apart (SBO);
//     the k16 step kk of a block starts 32 B * kk into it;
//   MN-major operands (V as B of P V: N = d contiguous, K = keys): 8-key groups 1024 B apart (SBO),
//     64-wide d blocks rows * 128 B apart (LBO); the k16 step over keys starts 2048 B * kk in.
// Accumulator and register-A fragments of m64nNk16 are, per warp (16 rows), those of
// mma.sync m16n8k16 repeated over N/8 (warp_mma.cuh), so the per-row softmax code is shared.
//
// The instructions come from CuTe (nvidia-cutlass 4.2 headers, .deps/python): the GMMA atoms
// SM90::GMMA::MMA_64xNx16_F32BF16BF16_{SS,RS}, GmmaDescriptor's fields, warpgroup_arrive /
// commit_batch / wait / fence_operand. Our wrappers keep the kernels' fragment arrays ([N/8][4],
// flattened row-major into the atoms' d00..dNN, which is the wgmma register order) and the
// descriptor that moves by one add. The SASS is that of the hand-written asm they replaced (the
// register-A atoms pass scale-D = 1 in a register rather than as an immediate; ptxas folds it).
#pragma once

#include <cstdint>
#include <utility>

#include <cute/arch/mma_sm90_desc.hpp>  // GmmaDescriptor
#include <cute/arch/mma_sm90_gmma.hpp>  // GMMA atoms, warpgroup_*
#include <cutlass/arch/barrier.h>        // fence_view_async_shared

// CuTe compiles its GMMA atoms to a run-time trap where sm_90a features are off; keep the build
// error the plain asm gave instead.
#if defined(__CUDA_ARCH__) && !defined(CUTE_ARCH_MMA_SM90A_ENABLED)
#error "wgmma.cuh needs sm_90a (STABLEFLASH_CUDA_ARCHS=90a-real)"
#endif

namespace stableflash::attention::cuda {

namespace GMMA = cute::SM90::GMMA;

template <int ROWS, int D>
struct WgmmaTile {
  static_assert(D % 64 == 0 && ROWS % 8 == 0, "SW128 atoms: 64 columns x 8 rows");
  static constexpr int kBlockBytes = ROWS * 128;  // one 64-column block
  static constexpr int kBytes = kBlockBytes * (D / 64);
  __device__ static __forceinline__ std::uint32_t offset(int row, int chunk) {
    return static_cast<std::uint32_t>((chunk / 8) * kBlockBytes + row * 128 + (((chunk % 8) ^ (row % 8)) << 4));
  }
};

// Four 8x8 BF16 matrices into shared memory (stmatrix .x4): register j of each lane is its pair of
// matrix j, row lane / 4, columns 2 (lane % 4) and + 1 (the layout of an accumulator fragment's
// 8-column block, rows g or g + 8), and lane l gives the address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void stmatrix_x4(std::uint32_t addr, const std::uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]), "r"(r[1]), "r"(r[2]),
               "r"(r[3])
               : "memory");
}

// A SW128 descriptor built once and moved along its tile with one 32-bit add per product: the
// start address is the low word's 14-bit field (in 16-byte units) and shared memory ends below
// 2^18 bytes, so adding an in-tile offset never carries into the LBO field above it. Rebuilding
// each descriptor from its address costs ~6 uniform instructions per wgmma, which the softmax
// warps pay in issue slots. The constant fields (LBO, SBO, 128-byte swizzle) are set through
// CuTe's GmmaDescriptor and fold to constants; the run-time start address is or-ed into the low
// word by hand: written through the 14-bit field, it was built with byte permutes (UPRMT; 8-16
// more SASS instructions per wgmma kernel).
struct Sw128Desc {
  std::uint32_t lo, hi;
  __device__ __forceinline__ Sw128Desc(std::uint32_t smem_addr, std::uint32_t lbo_bytes, std::uint32_t sbo_bytes) {
    cute::GmmaDescriptor d;
    d.bitfield.leading_byte_offset_ = static_cast<std::uint16_t>(lbo_bytes >> 4);  // 14-bit fields
    d.bitfield.stride_byte_offset_ = static_cast<std::uint16_t>(sbo_bytes >> 4);
    d.bitfield.layout_type_ = static_cast<std::uint8_t>(GMMA::LayoutType::B128);
    lo = d.reg32_[0] | ((smem_addr >> 4) & 0x3fffu);  // start_address_, bits [0, 14)
    hi = d.reg32_[1];
  }
  __device__ __forceinline__ std::uint64_t at(std::uint32_t byte_offset) const {
    return (std::uint64_t(hi) << 32) | (lo + (byte_offset >> 4));
  }
};

__device__ __forceinline__ void wgmma_fence() { cute::warpgroup_arrive(); }
__device__ __forceinline__ void wgmma_commit() { cute::warpgroup_commit_batch(); }
__device__ __forceinline__ void wgmma_wait_all() { cute::warpgroup_wait<0>(); }
// Waits until at most N committed groups are pending (the newest N may still run).
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  cute::warpgroup_wait<N>();
}
// Writes by the generic proxy (cp.async, st.shared) become visible to wgmma's async proxy.
// CUTLASS's fence declares no "memory" clobber (its callers order memory by other means); the
// compiler fences around it keep shared-memory stores from moving past it, as our asm did.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("" ::: "memory");
  cutlass::arch::fence_view_async_shared();
  asm volatile("" ::: "memory");
}

// Keeps the compiler from moving accumulator reads across wgmma_wait_all (the asm that issues a
// wgmma names them, the one that waits does not).
template <int N>
__device__ __forceinline__ void fence_registers(float (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) cute::warpgroup_fence_operand(r[i][e]);
}

namespace detail {
// The GMMA atoms take the accumulator as N/2 scalar references d00..; ours is [N/8][4] in the
// same order.
template <class Op, int N, std::size_t... I>
__device__ __forceinline__ void gmma_ss(float (&c)[N / 8][4], std::uint64_t a, std::uint64_t b, GMMA::ScaleOut scale_d,
                                        std::index_sequence<I...>) {
  Op::fma(a, b, c[I / 4][I % 4]..., scale_d);
}
template <class Op, int N, std::size_t... I>
__device__ __forceinline__ void gmma_rs(float (&c)[N / 8][4], const std::uint32_t (&a)[4], std::uint64_t b,
                                        std::index_sequence<I...>) {
  Op::fma(a[0], a[1], a[2], a[3], b, c[I / 4][I % 4]..., GMMA::ScaleOut::One);
}
}  // namespace detail

// C[64 x N] (+)= A[64 x 16] * B[16 x N], both from shared memory; kTrans = 0: both K-major (S = Q
// K^T), 1: both MN-major (A stored [k][m], B stored [k][n]: the backward's dQ = dS K with dS read
// from its transpose dS^T). scale_d = 0 overwrites C.
template <int kTrans>
__device__ __forceinline__ void wgmma_m64n64_ss_t(float (&c)[8][4], std::uint64_t a, std::uint64_t b, int scale_d) {
  constexpr GMMA::Major kMajor = kTrans ? GMMA::Major::MN : GMMA::Major::K;
  detail::gmma_ss<GMMA::MMA_64x64x16_F32BF16BF16_SS<kMajor, kMajor>, 64>(
      c, a, b, static_cast<GMMA::ScaleOut>(scale_d), std::make_index_sequence<32>{});
}
template <int kTrans>
__device__ __forceinline__ void wgmma_m64n128_ss_t(float (&c)[16][4], std::uint64_t a, std::uint64_t b, int scale_d) {
  constexpr GMMA::Major kMajor = kTrans ? GMMA::Major::MN : GMMA::Major::K;
  detail::gmma_ss<GMMA::MMA_64x128x16_F32BF16BF16_SS<kMajor, kMajor>, 128>(
      c, a, b, static_cast<GMMA::ScaleOut>(scale_d), std::make_index_sequence<64>{});
}
// C[64 x 64] += A[64 x 16] (registers) * B[16 x 64] (shared, MN-major).
__device__ __forceinline__ void wgmma_m64n64_rs(float (&c)[8][4], const std::uint32_t (&a)[4], std::uint64_t b) {
  detail::gmma_rs<GMMA::MMA_64x64x16_F32BF16BF16_RS<GMMA::Major::K, GMMA::Major::MN>, 64>(
      c, a, b, std::make_index_sequence<32>{});
}

// C[64 x 128] += A[64 x 16] (registers) * B[16 x 128] (shared, MN-major).
__device__ __forceinline__ void wgmma_m64n128_rs(float (&c)[16][4], const std::uint32_t (&a)[4], std::uint64_t b) {
  detail::gmma_rs<GMMA::MMA_64x128x16_F32BF16BF16_RS<GMMA::Major::K, GMMA::Major::MN>, 128>(
      c, a, b, std::make_index_sequence<64>{});
}

// P V for a 64-wide d block or the whole D = 128.
template <int D>
__device__ __forceinline__ void wgmma_pv(float (&c)[D / 8][4], const std::uint32_t (&a)[4], std::uint64_t b) {
  if constexpr (D == 64) {
    wgmma_m64n64_rs(c, a, b);
  } else {
    wgmma_m64n128_rs(c, a, b);
  }
}

// C[64 x N] (+)= A B for N = 64 or 128, both operands from shared memory (kTrans as above).
template <int N, int kTrans = 0>
__device__ __forceinline__ void wgmma_ss(float (&c)[N / 8][4], std::uint64_t a, std::uint64_t b, int scale_d) {
  if constexpr (N == 64) {
    wgmma_m64n64_ss_t<kTrans>(c, a, b, scale_d);
  } else {
    wgmma_m64n128_ss_t<kTrans>(c, a, b, scale_d);
  }
}

// The same for the A fragments of register-A products: they must stay untouched until the
// wgmma that reads them completes.
template <int N>
__device__ __forceinline__ void fence_registers(std::uint32_t (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) cute::warpgroup_fence_operand(r[i][e]);
}

}  // namespace stableflash::attention::cuda
