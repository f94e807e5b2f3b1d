// Warp-level tensor-core and copy primitives shared by the attention kernels (sm_80+ instructions,
// run here on sm_90a): mma.sync m16n8k16 BF16 -> FP32, ldmatrix, cp.async with zero fill, and the
// XOR-swizzled shared-memory layout of [rows, D] BF16 tiles.
//
// Fragment layouts of mma.m16n8k16 (g = lane / 4, t = lane % 4), which the kernels index by hand:
//   A 16x16 (4 x b32):  a0 (g, 2t..2t+1)  a1 (g+8, 2t..)  a2 (g, 2t+8..)  a3 (g+8, 2t+8..)
//   B 16x8  (2 x b32):  b0 (k 2t..2t+1, n g)  b1 (k 2t+8.., n g)
//   C 16x8  (4 x f32):  c0, c1 (g, 2t, 2t+1)  c2, c3 (g+8, 2t, 2t+1)
// Two C tiles adjacent in n form exactly one A tile in k, so P = exp(S) feeds the next product
// from registers without a trip through shared memory.
//
// mma.sync, ldmatrix and the cp.async group commit come from CuTe (SM80_16x8x16_F32BF16BF16F32_TN,
// SM75_U32x4_LDSM_N, SM75_U16x8_LDSM_T, cp_async_fence); the rest stays PTX: CuTe's zero-filling
// cp.async (SM80_CP_ASYNC_CACHEGLOBAL_ZFILL) adds an .L2::128B prefetch hint, its cp_async_wait<0>
// is wait_all (one more LDGDEPBAR), and it has no BF16x2 conversion or arithmetic wrappers.
#pragma once

#include <cstdint>

#include <cute/arch/copy_sm75.hpp>  // ldmatrix
#include <cute/arch/copy_sm80.hpp>  // cp.async groups
#include <cute/arch/mma_sm80.hpp>   // mma.sync m16n8k16

namespace stableflash::attention::cuda {

// One step of a transpose within each quad of lanes (t = lane % 4): the lane sends its w[t ^ i] and
// receives the partner's (lane ^ i) value for its own slot t, which it keeps in out[t ^ i]. The four
// steps i = 0..3 transpose the quad's 4 x 4 block of b32 values: C-fragment pairs of four 8-column
// tiles become 16 contiguous bytes of a row per lane. Selects instead of indexing by the run-time t
// keep the arrays in registers.
__device__ __forceinline__ void quad_transpose_step(const std::uint32_t (&w)[4], std::uint32_t (&out)[4], int t, int i) {
  const int k = t ^ i;
  const std::uint32_t send = k == 0 ? w[0] : k == 1 ? w[1] : k == 2 ? w[2] : w[3];
  const std::uint32_t got = i == 0 ? send : __shfl_xor_sync(0xffffffffu, send, i);
#pragma unroll
  for (int s = 0; s < 4; ++s) out[s] = s == k ? got : out[s];
}

// A row's 8 BF16 values (4 pairs, columns c .. c + 7) at dst: one 16-byte store where the row is
// 16-byte aligned, else two 8-byte ones (dk, dv, dq rows need only 8: docs/cuda-kernels.md).
__device__ __forceinline__ void store_row8(std::uint16_t* dst, const std::uint32_t (&pairs)[4], bool store16) {
  if (store16) {
    *reinterpret_cast<uint4*>(dst) = make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]);
  } else {
    *reinterpret_cast<uint2*>(dst) = make_uint2(pairs[0], pairs[1]);
    *reinterpret_cast<uint2*>(dst + 4) = make_uint2(pairs[2], pairs[3]);
  }
}

__device__ __forceinline__ void mma_16816(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
  cute::SM80_16x8x16_F32BF16BF16F32_TN::fma(c[0], c[1], c[2], c[3], a[0], a[1], a[2], a[3], b0, b1,
                                            c[0], c[1], c[2], c[3]);
}

// CuTe's ldmatrix atoms take a reference to shared memory; ours an address (cvta there and back
// folds away).
__device__ __forceinline__ const cute::uint128_t& smem_row(std::uint32_t addr) {
  return *static_cast<const cute::uint128_t*>(__cvta_shared_to_generic(addr));
}
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], std::uint32_t addr) {
  cute::SM75_U32x4_LDSM_N::copy(smem_row(addr), r[0], r[1], r[2], r[3]);
}

__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], std::uint32_t addr) {
  cute::SM75_U16x8_LDSM_T::copy(smem_row(addr), r[0], r[1], r[2], r[3]);
}

// 16-byte global -> shared copy; `valid == false` writes zeros (rows past the sequence end), so
// padded rows hold finite values and never need separate clearing.
__device__ __forceinline__ void cp_async_16(std::uint32_t smem_addr, const void* gmem, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { cute::cp_async_fence(); }
// Hand-written: cute::cp_async_wait<0> is cp.async.wait_all, which commits an empty group first.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ std::uint32_t smem_u32(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// Two FP32 values -> one register of two BF16 (RNE), low half first (the mma operand order).
__device__ __forceinline__ std::uint32_t pack_bf16x2(float lo, float hi) {
  std::uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ float bf16_lo(std::uint32_t x) { return __uint_as_float(x << 16); }
__device__ __forceinline__ float bf16_hi(std::uint32_t x) { return __uint_as_float(x & 0xffff0000u); }

// Two BF16 values at once (sm_90): the exact result rounded to nearest even (sub), or the
// larger / smaller of each pair (max, min; exact).
__device__ __forceinline__ std::uint32_t bf16x2_sub(std::uint32_t a, std::uint32_t b) {
  std::uint32_t r;
  asm("sub.rn.bf16x2 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
__device__ __forceinline__ std::uint32_t bf16x2_max(std::uint32_t a, std::uint32_t b) {
  std::uint32_t r;
  asm("max.bf16x2 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
__device__ __forceinline__ std::uint32_t bf16x2_min(std::uint32_t a, std::uint32_t b) {
  std::uint32_t r;
  asm("min.bf16x2 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(b));
  return r;
}

// A [rows, D] BF16 tile in shared memory, rows of D/8 16-byte chunks. Chunk c of row r lives at
// chunk c ^ (r % 8): the 8 rows an ldmatrix phase reads, and the 8 chunks a cp.async phase
// writes, then fall in 8 distinct bank groups (no conflicts for D = 64 or 128).
template <int D>
struct SwizzledTile {
  static_assert(D % 64 == 0, "rows must hold a multiple of 8 chunks for the 8-way swizzle");
  static constexpr int kChunks = D / 8;
  __device__ static __forceinline__ std::uint32_t offset(int row, int chunk) {
    return static_cast<std::uint32_t>(row * (D * 2) + ((chunk ^ (row & 7)) << 4));
  }
};

// Copies rows [row0, row0 + ROWS) of a [len, D] BF16 head (row stride `stride` elements) into a
// swizzled tile; rows >= len become zeros. All THREADS threads take part.
template <int ROWS, int D, int THREADS>
__device__ __forceinline__ void load_tile_async(std::uint32_t smem, const std::uint16_t* head, std::int64_t stride,
                                                int row0, int len) {
  constexpr int kChunks = D / 8, kTotal = ROWS * kChunks;
  static_assert(kTotal % THREADS == 0, "every thread copies the same number of chunks");
#pragma unroll
  for (int it = 0; it < kTotal / THREADS; ++it) {
    const int idx = it * THREADS + static_cast<int>(threadIdx.x);
    const int r = idx / kChunks, c = idx % kChunks;
    const bool valid = row0 + r < len;
    const std::uint16_t* src = head + (valid ? (row0 + r) * stride + c * 8 : 0);
    cp_async_16(smem + SwizzledTile<D>::offset(r, c), src, valid);
  }
}

// Reductions over the four threads of a quad (the threads that share rows of a C fragment).
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
__device__ __forceinline__ int quad_sum(int x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

}  // namespace stableflash::attention::cuda
