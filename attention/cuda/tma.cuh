// Hopper bulk tensor copies (TMA) into shared memory, completed on mbarriers. One thread issues a
// whole [64 rows, 64 columns] BF16 box per instruction, written in the 128-byte swizzled layout
// the wgmma descriptors read (wgmma.cuh), rows past the tensor's end filled with zeros: the
// consumer threads spend no instructions on addresses, bounds or swizzling.
//
// Built on CUTLASS/CuTe (nvidia-cutlass 4.2): mbarriers (cutlass::arch::ClusterBarrier,
// ClusterTransactionBarrier, fence_barrier_init), the TMA store
// (SM90_TMA_STORE_4D), bulk groups (tma_store_arrive / tma_store_wait) and named barriers
// (cutlass::arch::NamedBarrier). Three stay hand-written PTX, CuTe having no equal: the TMA load
// (SM90_TMA_LOAD_4D always adds an .L2::cache_hint operand: two more uniform moves per load in
// the key loop), the non-tensor bulk reduction and the full (not .read) bulk wait.
//
// Our wrappers take shared-memory addresses as 32-bit integers (what the kernels compute); CUTLASS
// takes pointers and converts them back with cvta, which the compiler folds away. CUTLASS's
// barrier and bulk-group helpers declare no "memory" clobber, so a compiler fence on each side
// keeps loads and stores of shared memory from moving across them, as our asm's clobber did.
#pragma once

#include <cuda.h>

#include <cstdint>

#include <cute/arch/copy_sm90_tma.hpp>  // SM90_TMA_STORE_4D, tma_store_*
#include <cutlass/arch/barrier.h>        // ClusterBarrier, ClusterTransactionBarrier, NamedBarrier

#if defined(__CUDA_ARCH__) && !defined(CUTE_ARCH_TMA_SM90_ENABLED)
#error "tma.cuh needs sm_90 or newer (TMA, mbarrier transactions)"
#endif

namespace stableflash::attention::cuda {

namespace detail {
__device__ __forceinline__ void compiler_fence() { asm volatile("" ::: "memory"); }
__device__ __forceinline__ std::uint64_t* mbar_ptr(std::uint32_t bar) {
  return static_cast<std::uint64_t*>(__cvta_shared_to_generic(bar));
}
// Runs a CUTLASS helper with our asm's ordering guarantee (see the file comment).
template <class F>
__device__ __forceinline__ void ordered(F&& f) {
  compiler_fence();
  f();
  compiler_fence();
}
}  // namespace detail

__device__ __forceinline__ void mbar_init(std::uint32_t bar, int count) {
  detail::ordered([&] {
    cutlass::arch::ClusterBarrier::init(detail::mbar_ptr(bar), static_cast<std::uint32_t>(count));
  });
}
// Makes initialized barriers visible to the async proxy (the copy engine) before first use.
__device__ __forceinline__ void mbar_fence_init() { detail::ordered([] { cutlass::arch::fence_barrier_init(); }); }

__device__ __forceinline__ void mbar_arrive_expect_tx(std::uint32_t bar, std::uint32_t bytes) {
  detail::ordered([&] {
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(detail::mbar_ptr(bar), bytes);
  });
}

// Waits for the barrier's phase `parity` to complete. ClusterBarrier::wait passes try_wait a
// suspend-time hint, with which a failed check sleeps (NANOSLEEP.SYNCS) until the phase changes
// instead of spinning on the issue slots the other warps of its scheduler need (CuTe's
// wait_barrier, the plain spin, measured 1-2.5% slower backward at head dim 128; docs/benchmarks.md).
__device__ __forceinline__ void mbar_wait(std::uint32_t bar, std::uint32_t parity) {
  detail::ordered([&] { cutlass::arch::ClusterBarrier::wait(detail::mbar_ptr(bar), parity); });
}

// Box (c0, c1, c2, c3) of a 4-d tensor map -> shared memory, completing `bytes` on `bar`.
// Hand-written: CuTe's SM90_TMA_LOAD_4D has no form without an L2 cache hint (file comment).
__device__ __forceinline__ void tma_load_4d(std::uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, int c3,
                                            std::uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<std::uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}


// A plain arrival (consumers telling the copy issuer that a buffer may be overwritten).
__device__ __forceinline__ void mbar_arrive(std::uint32_t bar) {
  detail::ordered([&] { cutlass::arch::ClusterBarrier::arrive(detail::mbar_ptr(bar)); });
}

// Bulk reduction shared -> global: dst[0 .. bytes / 4) += src elementwise in FP32, done by the copy
// engine at L2 (one instruction for a whole tile instead of one atomic per element). Both
// addresses 16-byte aligned, bytes a multiple of 16. Completion is tracked per issuing thread in
// bulk groups: commit, then wait until the shared source has been read (it may be rewritten) or
// until the writes are done. Hand-written: CuTe 4.2 reduces only through tensor maps
// (SM90_TMA_REDUCE_ADD_*D), not a plain address range.
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, std::uint32_t src, std::uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst), "r"(src),
               "r"(bytes)
               : "memory");
}
// Shared memory -> box (c0, c1, c2, c3) of a 4-d tensor map (the inverse of tma_load_4d; elements
// outside the tensor are not written). Completes in the issuing thread's bulk group.
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, std::uint32_t src, int c0, int c1, int c2, int c3) {
  cute::SM90_TMA_STORE_4D::copy(map, __cvta_shared_to_generic(src), c0, c1, c2, c3);
}

// cp.async.bulk.commit_group (CuTe names it after its use for stores; it commits the reductions too).
__device__ __forceinline__ void bulk_commit_group() { detail::ordered([] { cute::tma_store_arrive(); }); }
template <int kPending>
__device__ __forceinline__ void bulk_wait_group_read() {
  cute::tma_store_wait<kPending>();
}
// Waits for the writes themselves (not only the reads of shared memory). Hand-written: CuTe has
// only the .read form.
template <int kPending>
__device__ __forceinline__ void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Bulk copy shared -> global, dst[0 .. bytes) = src (the store beside bulk_reduce_add_f32: same
// alignment rules, same bulk groups). Hand-written: CuTe stores only through tensor maps.
__device__ __forceinline__ void bulk_store(void* dst, std::uint32_t src, std::uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst), "r"(src), "r"(bytes) : "memory");
}

// Orders this thread's global accesses in the generic proxy (flags, atomics) with its bulk copies
// (async proxy): after a completed bulk write, before the release that publishes it; after the
// acquire that saw it published, before the bulk copy that builds on it.
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }

// Named barrier: the `count` threads (a multiple of 32) that use barrier `id` (1..15; __syncthreads
// is 0) wait for each other, so one warpgroup can synchronize without stopping the other. The
// ReservedNamedBarriers overload takes the hardware id as is (the uint32_t one adds CUTLASS's 8
// reserved ids; our kernels use no CUTLASS collective, so ids 1.. are free).
// Programmatic dependent launch (a kernel launched by launch_after_previous, launch.hpp):
// grid_dependency_wait() blocks until the previous kernel in the stream has completed and its memory
// writes are visible (a no-op in a kernel launched without the attribute); nothing the previous
// kernel writes may be read, and nothing it reads may be written, before it. allow_dependent_launch()
// lets the next kernel's CTAs start once every CTA of this grid has issued it (or exited). Written
// here rather than taken from cutlass/arch/grid_dependency_control.h, which wants
// CUTLASS_ENABLE_GDC_FOR_SM90 and brings the GEMM dispatch headers for two instructions.
__device__ __forceinline__ void grid_dependency_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void allow_dependent_launch() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

__device__ __forceinline__ void named_barrier_sync(int id, int count) {
  detail::ordered([&] {
    cutlass::arch::NamedBarrier::sync(static_cast<std::uint32_t>(count),
                                      static_cast<cutlass::arch::ReservedNamedBarriers>(id));
  });
}
// Counts this warp's threads towards barrier `id` without waiting for the others.
__device__ __forceinline__ void named_barrier_arrive(int id, int count) {
  detail::ordered([&] {
    cutlass::arch::NamedBarrier::arrive(static_cast<std::uint32_t>(count),
                                        static_cast<cutlass::arch::ReservedNamedBarriers>(id));
  });
}

}  // namespace stableflash::attention::cuda
