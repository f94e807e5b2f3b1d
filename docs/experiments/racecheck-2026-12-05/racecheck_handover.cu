// Does compute-sanitizer racecheck model the two hand-overs the backward kernel reuses buffers under?
// Warp 0 writes a shared buffer, warp 1 reads it, ten times over, each a correct hand-over (a third
// warp idles, so that named barriers cover part of the block, as in the kernels):
//   mode 0: mbarriers `full` (32 producer arrivals) and `empty` (32 consumer arrivals), phase parity
//           waits (the backward's query slots and the lse / delta rows);
//   mode 1: named barriers, each side arriving (bar.arrive) where the other syncs (bar.sync), as the
//           backward's dq_full / dq_empty hand-over between a consumer and its reducing warp;
//   mode 2: a plain __syncthreads before and after each read (the control: racecheck must stay quiet);
//   mode 3: bar.sync on a named barrier of the two warps only, before and after each read (a third
//           warp of the block takes no part), as the deterministic dQ turns' consumer barrier;
//   mode 4: mode 0 with one arrival a warp (lane 0, barriers of count 1) right after the warp's
//           lanes wrote or read, as the backward's consumers arrive on a slot's `free`;
//   mode 5: mode 4 with __syncwarp() before lane 0 arrives (the lanes' accesses ordered before it).
//   mode 6: mode 3 after a stagger on another named barrier (warp 0 bar.arrive, warp 1 bar.sync, once
//           at the start), as the D = 128 backward's consumers start (kStagger) before the
//           deterministic dQ's hand-overs on their shared barrier (thirty-third session);
//   mode 7: mode 6 with the dQ pattern itself: each warp writes its half of the buffer, both read
//           all of it between two bar.sync of the pair (store_dq_part, then the key-block-order adds).
// Build: nvcc -std=c++17 -O2 -gencode=arch=compute_90a,code=sm_90a racecheck_handover.cu -o racecheck_handover
// Run:   compute-sanitizer --tool racecheck ./racecheck_handover MODE   (MODE 0 to 7)
// The program checks its own sums, so a real race would also show as a wrong sum.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

__device__ __forceinline__ void mbar_init(std::uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(std::uint32_t bar) {
  asm volatile("{\n .reg .b64 st;\n mbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(std::uint32_t bar, std::uint32_t parity) {
  asm volatile(
      "{\n .reg .pred p;\n wait_%=:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra wait_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void bar_sync(int id, int count) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int count) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory"); }

constexpr int kRounds = 10;

__global__ void handover(int mode, float* sums) {
  __shared__ float buf[32];
  __shared__ alignas(8) std::uint64_t bars[4];
  const std::uint32_t full = static_cast<std::uint32_t>(__cvta_generic_to_shared(&bars[0]));
  const std::uint32_t empty = full + 8;
  const std::uint32_t full1 = full + 16, empty1 = full + 24;  // one arrival a phase (modes 4, 5)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    mbar_init(full, 32);
    mbar_init(empty, 32);
    mbar_init(full1, 1);
    mbar_init(empty1, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  float sum = 0.0f;
  for (int r = 0; r < kRounds; ++r) {
    if (warp == 2 && mode != 2) break;  // the idle warp
    if ((mode == 6 || mode == 7) && r == 0) {  // the stagger: warp 1 starts after warp 0 arrives
      if (warp == 0) bar_arrive(4, 64);
      else bar_sync(4, 64);
    }
    if (mode == 0) {
      if (warp == 0) {
        if (r > 0) mbar_wait(empty, (r - 1) & 1);
        buf[lane] = float(r * 32 + lane);
        mbar_arrive(full);
      } else {
        mbar_wait(full, r & 1);
        sum += buf[31 - lane];
        mbar_arrive(empty);
      }
    } else if (mode == 1) {
      if (warp == 0) {
        if (r > 0) bar_sync(2, 64);  // the reader is done with the last round
        buf[lane] = float(r * 32 + lane);
        bar_arrive(1, 64);
      } else {
        bar_sync(1, 64);
        sum += buf[31 - lane];
        if (r + 1 < kRounds) bar_arrive(2, 64);
      }
    } else if (mode == 4 || mode == 5) {
      if (warp == 0) {
        if (r > 0) mbar_wait(empty1, (r - 1) & 1);
        buf[lane] = float(r * 32 + lane);
        if (mode == 5) __syncwarp();
        if (lane == 0) mbar_arrive(full1);
      } else {
        mbar_wait(full1, r & 1);
        sum += buf[31 - lane];
        if (mode == 5) __syncwarp();
        if (lane == 0) mbar_arrive(empty1);
      }
    } else if (mode == 2) {
      if (warp == 0) buf[lane] = float(r * 32 + lane);
      __syncthreads();
      if (warp == 1) sum += buf[31 - lane];
      __syncthreads();
    } else if (mode == 7) {
      if (lane < 16) buf[warp * 16 + lane] = float(r * 32 + warp * 16 + lane);  // each warp its half
      bar_sync(3, 64);
      sum += buf[31 - lane];  // both warps read all of it (warp 1's sums are checked)
      bar_sync(3, 64);
    } else {  // modes 3 and 6
      if (warp == 0) buf[lane] = float(r * 32 + lane);
      bar_sync(3, 64);
      if (warp == 1) sum += buf[31 - lane];
      bar_sync(3, 64);
    }
  }
  if (warp == 1) sums[lane] = sum;
}

int main(int argc, char** argv) {
  const int mode = argc > 1 ? std::atoi(argv[1]) : 0;
  float* sums = nullptr;
  cudaMalloc(&sums, 32 * sizeof(float));
  handover<<<1, 96>>>(mode, sums);  // warp 2 idles (but for mode 2's __syncthreads)
  float host[32];
  if (cudaMemcpy(host, sums, sizeof(host), cudaMemcpyDeviceToHost) != cudaSuccess) {
    std::printf("mode %d: CUDA error %s\n", mode, cudaGetErrorString(cudaGetLastError()));
    return 2;
  }
  int wrong = 0;
  for (int lane = 0; lane < 32; ++lane) {
    float expect = 0.0f;
    for (int r = 0; r < kRounds; ++r) expect += float(r * 32 + 31 - lane);
    wrong += host[lane] != expect;
  }
  std::printf("mode %d: %d of 32 sums wrong\n", mode, wrong);
  return wrong ? 1 : 0;
}
