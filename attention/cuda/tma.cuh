// Hopper bulk tensor copies (TMA) into shared memory, completed on mbarriers. One thread issues a
// whole [64 rows, 64 columns] BF16 box per instruction, written in the 128-byte swizzled layout
// the wgmma descriptors read (wgmma.cuh), rows past the tensor's end filled with zeros: the
// consumer threads spend no instructions on addresses, bounds or swizzling.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace stableflash::attention::cuda {

__device__ __forceinline__ void mbar_init(std::uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes initialized barriers visible to the async proxy (the copy engine) before first use.
__device__ __forceinline__ void mbar_fence_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

__device__ __forceinline__ void mbar_arrive_expect_tx(std::uint32_t bar, std::uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_wait(std::uint32_t bar, std::uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nwait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// Box (c0, c1, c2, c3) of a 4-d tensor map -> shared memory, completing `bytes` on `bar`.
__device__ __forceinline__ void tma_load_4d(std::uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, int c3,
                                            std::uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<std::uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}


// A plain arrival (consumers telling the copy issuer that a buffer may be overwritten).
__device__ __forceinline__ void mbar_arrive(std::uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// Bulk reduction shared -> global: dst[0 .. bytes / 4) += src elementwise in FP32, done by the copy
// engine at L2 (one instruction for a whole tile instead of one atomic per element). Both
// addresses 16-byte aligned, bytes a multiple of 16. Completion is tracked per issuing thread in
// bulk groups: commit, then wait until the shared source has been read (it may be rewritten) or
// until the writes are done.
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, std::uint32_t src, std::uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst), "r"(src),
               "r"(bytes)
               : "memory");
}
// Shared memory -> box (c0, c1, c2, c3) of a 4-d tensor map (the inverse of tma_load_4d; elements
// outside the tensor are not written). Completes in the issuing thread's bulk group.
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, std::uint32_t src, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
                   reinterpret_cast<std::uint64_t>(map)),
               "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}

__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}
template <int kPending>
__device__ __forceinline__ void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Named barrier: the `count` threads (a multiple of 32) that use barrier `id` (1..15; __syncthreads
// is 0) wait for each other, so one warpgroup can synchronize without stopping the other.
__device__ __forceinline__ void named_barrier_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

}  // namespace stableflash::attention::cuda
