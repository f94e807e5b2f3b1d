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
#pragma once

#include <cstdint>

namespace stableflash::attention::cuda {

template <int ROWS, int D>
struct WgmmaTile {
  static_assert(D % 64 == 0 && ROWS % 8 == 0, "SW128 atoms: 64 columns x 8 rows");
  static constexpr int kBlockBytes = ROWS * 128;  // one 64-column block
  static constexpr int kBytes = kBlockBytes * (D / 64);
  __device__ static __forceinline__ std::uint32_t offset(int row, int chunk) {
    return static_cast<std::uint32_t>((chunk / 8) * kBlockBytes + row * 128 + (((chunk % 8) ^ (row % 8)) << 4));
  }
};

// A SW128 descriptor built once and moved along its tile with one 32-bit add per product: the
// start address is the low word's 14-bit field (in 16-byte units) and shared memory ends below
// 2^18 bytes, so adding an in-tile offset never carries into the LBO field above it. Rebuilding
// each descriptor from its address costs ~6 uniform instructions per wgmma, which the softmax
// warps pay in issue slots.
struct Sw128Desc {
  std::uint32_t lo, hi;
  __device__ __forceinline__ Sw128Desc(std::uint32_t smem_addr, std::uint32_t lbo_bytes, std::uint32_t sbo_bytes)
      : lo(((smem_addr >> 4) & 0x3fffu) | (((lbo_bytes >> 4) & 0x3fffu) << 16)),
        hi(((sbo_bytes >> 4) & 0x3fffu) | (1u << 30)) {}  // bit 62: 128-byte swizzle
  __device__ __forceinline__ std::uint64_t at(std::uint32_t byte_offset) const {
    return (std::uint64_t(hi) << 32) | (lo + (byte_offset >> 4));
  }
};


__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// Waits until at most N committed groups are pending (the newest N may still run).
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Writes by the generic proxy (cp.async, st.shared) become visible to wgmma's async proxy.
__device__ __forceinline__ void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Keeps the compiler from moving accumulator reads across wgmma_wait_all (the asm that issues a
// wgmma names them, the one that waits does not).
template <int N>
__device__ __forceinline__ void fence_registers(float (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(r[i][e])::"memory");
}

#define SF_ACC8(i) "+f"(c[i][0]), "+f"(c[i][1]), "+f"(c[i][2]), "+f"(c[i][3]), "+f"(c[i + 1][0]), "+f"(c[i + 1][1]), "+f"(c[i + 1][2]), "+f"(c[i + 1][3])

// C[64 x N] (+)= A[64 x 16] * B[16 x N], both from shared memory; kTrans = 0: both K-major (S = Q
// K^T), 1: both MN-major (A stored [k][m], B stored [k][n]: the backward's dQ = dS K with dS read
// from its transpose dS^T). scale_d = 0 overwrites C.
template <int kTrans>
__device__ __forceinline__ void wgmma_m64n64_ss_t(float (&c)[8][4], std::uint64_t a, std::uint64_t b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31},"
      " %32, %33, p, 1, 1, %35, %35;\n}\n"
      : SF_ACC8(0), SF_ACC8(2), SF_ACC8(4), SF_ACC8(6)
      : "l"(a), "l"(b), "r"(scale_d), "n"(kTrans));
}
template <int kTrans>
__device__ __forceinline__ void wgmma_m64n128_ss_t(float (&c)[16][4], std::uint64_t a, std::uint64_t b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63},"
      " %64, %65, p, 1, 1, %67, %67;\n}\n"
      : SF_ACC8(0), SF_ACC8(2), SF_ACC8(4), SF_ACC8(6), SF_ACC8(8), SF_ACC8(10), SF_ACC8(12), SF_ACC8(14)
      : "l"(a), "l"(b), "r"(scale_d), "n"(kTrans));
}
// C[64 x 64] += A[64 x 16] (registers) * B[16 x 64] (shared, MN-major).
__device__ __forceinline__ void wgmma_m64n64_rs(float (&c)[8][4], const std::uint32_t (&a)[4], std::uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31},"
      " {%32,%33,%34,%35}, %36, p, 1, 1, 1;\n}\n"
      : SF_ACC8(0), SF_ACC8(2), SF_ACC8(4), SF_ACC8(6)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(1));
}

// C[64 x 128] += A[64 x 16] (registers) * B[16 x 128] (shared, MN-major).
__device__ __forceinline__ void wgmma_m64n128_rs(float (&c)[16][4], const std::uint32_t (&a)[4], std::uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63},"
      " {%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"
      : SF_ACC8(0), SF_ACC8(2), SF_ACC8(4), SF_ACC8(6), SF_ACC8(8), SF_ACC8(10), SF_ACC8(12), SF_ACC8(14)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(1));
}


#undef SF_ACC8

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
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(r[i][e])::"memory");
}

}  // namespace stableflash::attention::cuda
