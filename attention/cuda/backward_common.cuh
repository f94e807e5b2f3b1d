// The per-block pieces of the attention backward shared by the wgmma kernel
// (backward_wgmma_kernel.cuh) and the kernel lab's mma.sync kernel (lab/backward_mma_kernel.cuh):
// the deterministic dQ turn counters, the causal mask on S^T, P and dS at the numerics' rounding
// points, and the dK, dV stores. The shift policy does not enter the backward: P = exp(S - lse) uses
// the forward's lse whatever m was (docs/numerics-contract.md), so there is one kernel per (head
// dim, numerics).
#pragma once

#include <cstdint>

#include "kernel_params.cuh"
#include "stableflash/attention/rounding_points.hpp"
#include "warp_mma.cuh"

namespace stableflash::attention::cuda {

// The dQ workspace's counters between CTAs (turn counters, tile claims): loads that acquire, and
// the release that publishes.
__device__ __forceinline__ int load_acquire_gpu(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void or_release_gpu(int* p, int bits) {
  asm volatile("red.release.gpu.global.or.b32 [%0], %1;\n" ::"l"(p), "r"(bits) : "memory");
}

// Each CTA of a δ pass clears its share of p.zero_words (the counters above, and the dQ accumulator
// where it is not stored first): an equal slice per CTA of the pass's grid, coalesced 16-byte stores,
// issued before the pass's own loads so that they drain while those are in flight. The same bytes as
// a memset before the pass, without its launch; the main kernel reads them after the pass's grid has
// ended (griddepcontrol.wait).
__device__ __forceinline__ void clear_zero_word_share(const BackwardParams& p) {
  if (!p.zero_words) return;
  const std::int64_t ctas = std::int64_t(gridDim.x) * gridDim.y * gridDim.z;
  const std::int64_t cta = (std::int64_t(blockIdx.z) * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
  const std::int64_t per_cta = (p.zero_word_count + ctas - 1) / ctas, end = min(p.zero_word_count, (cta + 1) * per_cta);
  for (std::int64_t w = cta * per_cta + threadIdx.x; w < end; w += blockDim.x) p.zero_words[w] = make_uint4(0, 0, 0, 0);
}

// Deterministic dQ: the key blocks of one (b, h) add into a query block's dQ in key-block order.
// Block kb waits until the counter reads kb; CTAs are dispatched in blockIdx order, and both
// kernels' launch orders put key block kb - 1 of a (b, h) before kb, so the blocks it waits for are
// running or done. `leader` is the one thread that polls and passes the turn, `sync` the barrier of
// the threads that add (the whole CTA, or the wgmma kernel's consumer warpgroups).
template <class Sync>
__device__ __forceinline__ void wait_turn(const int* counter, int turn, bool leader, Sync sync) {
  if (leader) {
    while (load_acquire_gpu(counter) != turn) {
    }
  }
  sync();
}
template <class Sync>
__device__ __forceinline__ void pass_turn(int* counter, int next, bool leader, Sync sync) {
  __threadfence();
  sync();
  if (leader) asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(counter), "r"(next) : "memory");
}
__device__ __forceinline__ void wait_turn(const int* counter, int turn) {
  wait_turn(counter, turn, threadIdx.x == 0, [] { __syncthreads(); });
}
__device__ __forceinline__ void pass_turn(int* counter, int next) {
  pass_turn(counter, next, threadIdx.x == 0, [] { __syncthreads(); });
}

// S^T entries a query must not see (keys past Tk, or past the causal diagonal) set to -inf, so
// that P = exp(S - lse) = 0 and dS = P (dP - delta) = 0 there, as the oracle's exclusion gives.
// Callers test once per block whether any entry needs it: a mask test inside the per-element code
// cost a branch region per element (a seventh of the wgmma backward's instructions).
// Element (nq, e) is key `key` + 8 (e / 2), query q0 + 8 nq + 2t + (e % 2).
template <int NQ>
__device__ __forceinline__ void mask_transposed_scores(const BackwardParams& p, float (&st)[NQ][4], int key, int q0, int t,
                                                       bool causal) {
#pragma unroll
  for (int nq = 0; nq < NQ; ++nq)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int kj = key + 8 * (e / 2), qi = q0 + nq * 8 + 2 * t + (e & 1);
      if (kj >= p.k_len || (causal && kj > qi + p.k_len - p.q_len)) st[nq][e] = -__builtin_huge_valf();
    }
}

// P of one score and dS of one (P, dP) pair at the mode's rounding points, masked scores already
// -inf (mask_transposed_scores): exp(-inf) = 0, so dS = 0 there too. Split so that the wgmma
// backward forms P while the tensor cores still compute dP^T; the mma.sync kernel calls both
// through probs_and_dscores.
template <bool kPaper>
__device__ __forceinline__ float prob_of_score(const BackwardParams& p, float s, float lse) {
  if constexpr (kPaper) return paper::prob(paper::score(s, p.scale), lse);
  return fused::prob_fast(fused::score(s, p.scale), lse);
}
template <bool kPaper>
__device__ __forceinline__ float dscore_of(const BackwardParams& p, float prob, float dpt, float delta) {
  if constexpr (kPaper) return paper::dscore(prob, paper::dprob(dpt), delta, p.scale);
  return fused::dscore(prob, dpt, delta);
}

// P and dS of four accumulator elements: element e is query q_local + (e % 2) of the block and key
// key + 8 (e / 2). Both backward kernels (mma.sync and wgmma) lay their fragments out this way.
template <bool kPaper>
__device__ __forceinline__ void probs_and_dscores(const BackwardParams& p, const float (&s)[4], const float (&dpt)[4],
                                                  int q_local, const float* s_lse, const float* s_delta, float (&pv)[4],
                                                  float (&dsv)[4]) {
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int ql = q_local + (e & 1);
    pv[e] = prob_of_score<kPaper>(p, s[e], s_lse[ql]);
    dsv[e] = dscore_of<kPaper>(p, pv[e], dpt[e], s_delta[ql]);
  }
}

// Whether every row of a BF16 head (its first element, rows stride_t elements apart) starts at
// 16 bytes: store_row8's one 16-byte store; else two 8-byte ones (the gradients' rows need only 8).
__device__ __forceinline__ bool rows_16_byte_aligned(const std::uint16_t* head, std::int64_t stride_t) {
  return reinterpret_cast<std::uintptr_t>(head) % 16 == 0 && stride_t % 8 == 0;
}

// A [64 queries, 64 dims] FP32 dQ part in the wgmma accumulator's order to dq as BF16(value *
// scale), mul_rn then RN: value(j) is the float4 of dim group j, (x, y) = dims 8j + 2t, + 1 of
// query 16 warp + g, (z, w) the same dims of query + 8. The BF16 pairs are exchanged within each
// quad (quad_transpose_step) so that lane t stores dim groups t and t + 4 of its rows whole
// (store_row8: 16 bytes, or two 8-byte stores where dq's rows are only 8-byte aligned). `part`: the
// part's first row and dim in dq; rows from `rows_left` on (past Tq) are not stored; every lane
// takes part in the exchanges. The dQ conversion (backward_delta.cuh) and the main kernel's direct
// store (one key block: BackwardParams::dq_direct) both write dQ through this.
template <class Value>
__device__ __forceinline__ void store_dq_part_rows(std::uint16_t* part, std::int64_t stride_t, int rows_left, float scale, bool store16,
                                                   int warp, int lane, Value&& value) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {  // query 16 warp + g + 8 hf
    const int row = warp * 16 + g + 8 * hf;
#pragma unroll
    for (int half = 0; half < 2; ++half) {  // dim groups 4 half .. 4 half + 3; this lane keeps 4 half + t
      std::uint32_t w[4], out[4] = {0, 0, 0, 0};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float4 v = value(4 * half + k);
        w[k] = hf == 0 ? pack_bf16x2(mul_rn(v.x, scale), mul_rn(v.y, scale)) : pack_bf16x2(mul_rn(v.z, scale), mul_rn(v.w, scale));
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) quad_transpose_step(w, out, t, i);  // out[s] = dims 2s, 2s + 1 of group 4 half + t
      if (row >= rows_left) continue;
      store_row8(part + row * stride_t + (4 * half + t) * 8, out, store16);
    }
  }
}

// dK = BF16(acc * scale) (fused applies the scale to the FP32 product; paper's dS has it) and
// dV = BF16(acc) of a warp's 16 keys: this thread's keys `key` and key + 8, columns dim0 + nd * 8
// + 2t, + 1 (mma.sync C fragments, which the wgmma accumulators repeat), at query head h (BackwardParams:
// with grouped-query heads p.dk, p.dv are the per-query-head workspace). The BF16 pairs of four
// fragments are exchanged within each quad (quad_transpose_step), so that lane t stores columns
// (4G + t) * 8 .. + 7 of its row whole: a quarter of the store instructions of one pair each,
// which at short rows queued on the load/store unit (stall_lg: docs/benchmarks.md, kernel history,
// "Backward"). Keys past Tk are not stored; every lane takes part in the exchanges (shuffles).
template <bool kPaper, int DT>
__device__ __forceinline__ void store_dk_dv(const BackwardParams& p, int b, int h, int key, int t, const float (&acc_dk)[DT][4],
                                            const float (&acc_dv)[DT][4], int dim0 = 0) {
  static_assert(DT % 4 == 0, "groups of four 8-column fragments");
  const float dk_scale = kPaper ? 1.0f : p.scale;
  std::uint16_t* dk_head = p.dk + p.dk_strides.head(b, h);
  std::uint16_t* dv_head = p.dv + p.dv_strides.head(b, h);
  const bool dk16 = rows_16_byte_aligned(dk_head, p.dk_strides.t), dv16 = rows_16_byte_aligned(dv_head, p.dv_strides.t);
  // one fragment group of one output at a time: four pairs in, four out (the epilogue's registers
  // beside the two accumulators)
  const auto store_group = [&](std::uint16_t* head, std::int64_t stride_t, bool store16, int k, int G, auto&& pair_of) {
    std::uint32_t w[4], out[4] = {0, 0, 0, 0};
#pragma unroll
    for (int s = 0; s < 4; ++s) w[s] = pair_of(4 * G + s);
#pragma unroll
    for (int i = 0; i < 4; ++i) quad_transpose_step(w, out, t, i);
    if (k < p.k_len) store_row8(head + k * stride_t + dim0 + (4 * G + t) * 8, out, store16);  // the quad's row: all four lanes alike
  };
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int k = key + 8 * hf;
#pragma unroll
    for (int G = 0; G < DT / 4; ++G) {
      store_group(dk_head, p.dk_strides.t, dk16, k, G, [&](int nd) {
        return pack_bf16x2(mul_rn(acc_dk[nd][2 * hf], dk_scale), mul_rn(acc_dk[nd][2 * hf + 1], dk_scale));
      });
      store_group(dv_head, p.dv_strides.t, dv16, k, G, [&](int nd) { return pack_bf16x2(acc_dv[nd][2 * hf], acc_dv[nd][2 * hf + 1]); });
    }
  }
}

}  // namespace stableflash::attention::cuda
