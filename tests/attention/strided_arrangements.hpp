// Strided arrangements of attention tensors for the stride tests (CPU: strided_views_test.cpp; GPU:
// tests/attention_gpu/strided_gpu_test.cpp): host buffers ("arenas") holding q, k, v, o, o_residual,
// do, dq, dk, dv as views with their own strides, filled with a poison pattern where no view is.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "stableflash/attention/attention.hpp"

namespace stableflash::attention::strided {

constexpr std::uint16_t kPoison = 0x7fa5;  // a NaN no computation produces

// A tensor [B, heads, len, D] as a view into a BF16 buffer.
struct View {
  std::int64_t offset = 0;
  HeadStrides st;
  int heads = 0, len = 0;
};

// A BF16 buffer holding views; `covered` marks the elements some view owns.
struct Arena {
  std::vector<bf16> mem;
  std::vector<bool> covered;
  int batch, dim;
  Arena(std::size_t n, int batch_, int dim_) : mem(n, bf16::from_bits(kPoison)), covered(n, false), batch(batch_), dim(dim_) {}

  template <class F>
  void for_each(const View& v, F f) {  // f(index into mem, index into the packed bhtd tensor)
    std::int64_t packed = 0;
    for (int b = 0; b < batch; ++b)
      for (int h = 0; h < v.heads; ++h)
        for (int t = 0; t < v.len; ++t)
          for (int d = 0; d < dim; ++d) f(std::size_t(v.offset + v.st.at(b, h, t) + d), std::size_t(packed++));
  }
  bf16* at(const View& v) { return mem.data() + v.offset; }
  void own(const View& v) {
    for_each(v, [&](std::size_t m, std::size_t) { covered[m] = true; });
  }
  void place(const View& v, const std::vector<bf16>& packed) {
    for_each(v, [&](std::size_t m, std::size_t p) { mem[m] = packed[p], covered[m] = true; });
  }
  std::vector<bf16> gather(const View& v) {
    std::vector<bf16> out(std::size_t(batch) * v.heads * v.len * dim);
    for_each(v, [&](std::size_t m, std::size_t p) { out[p] = mem[m]; });
    return out;
  }
  ::testing::AssertionResult untouched_outside_views() const {
    for (std::size_t i = 0; i < mem.size(); ++i)
      if (!covered[i] && mem[i].bits != kPoison) return ::testing::AssertionFailure() << "element " << i << " written";
    return ::testing::AssertionSuccess();
  }
};

// Where each tensor lives: buffers and views. make(shape, arenas, views) builds the arrangement.
struct Arrangement {
  std::string name;
  std::function<void(const AttentionShape&, std::vector<Arena>&, std::vector<View>&)> make;
};
// Views, in this order: q, k, v, o, o_residual, do, dq, dk, dv; buffers: inputs, outputs, gradients.
enum Tensor { kQ, kK, kV, kO, kResidual, kDo, kDq, kDk, kDv };

// q, k, v interleaved per token in one buffer [B, T, H + 2 H_kv, D]; o, o_residual, do [B, T, H, D];
// dq, dk, dv interleaved like q, k, v in a gradient buffer. Needs Tq == Tk.
inline void interleaved(const AttentionShape& s, std::vector<Arena>& arenas, std::vector<View>& views) {
  const int H = s.heads, Hkv = s.resolved_kv_heads(), D = s.head_dim, T = s.q_len, W = H + 2 * Hkv;
  const HeadStrides qkv{std::int64_t(T) * W * D, D, std::int64_t(W) * D};
  const HeadStrides bthd = HeadStrides::of(Layout::bthd, H, T, D);
  const std::size_t qkv_size = std::size_t(s.batch) * T * W * D, out_size = std::size_t(s.batch) * T * H * D;
  arenas = {Arena(qkv_size, s.batch, D), Arena(3 * out_size, s.batch, D), Arena(qkv_size, s.batch, D)};
  views = {{0, qkv, H, T},         {std::int64_t(H) * D, qkv, Hkv, T}, {std::int64_t(H + Hkv) * D, qkv, Hkv, T},
           {0, bthd, H, T},        {std::int64_t(out_size), bthd, H, T}, {2 * std::int64_t(out_size), bthd, H, T},
           {0, qkv, H, T},         {std::int64_t(H) * D, qkv, Hkv, T}, {std::int64_t(H + Hkv) * D, qkv, Hkv, T}};
}

// Each tensor a different permutation of (B, H, T), some rows padded by 8 elements.
inline void transposed(const AttentionShape& s, std::vector<Arena>& arenas, std::vector<View>& views) {
  const int B = s.batch, H = s.heads, Hkv = s.resolved_kv_heads(), D = s.head_dim, Tq = s.q_len, Tk = s.k_len;
  const std::int64_t P = D + 8;  // padded row
  const std::int64_t nq = std::int64_t(B) * H * Tq * P, nk = std::int64_t(B) * Hkv * Tk * P;
  // [H, B, Tq, D], [Tk, B, Hkv, P], [B, Hkv, Tk, P]
  const HeadStrides hbt{std::int64_t(Tq) * D, std::int64_t(B) * Tq * D, D};
  const HeadStrides k_tbh{std::int64_t(Hkv) * P, P, std::int64_t(B) * Hkv * P};
  const HeadStrides v_bht{std::int64_t(Hkv) * Tk * P, std::int64_t(Tk) * P, P};
  // [Tq, H, B, P], [B, Tq, H, D]
  const HeadStrides o_thb{P, std::int64_t(B) * P, std::int64_t(H) * B * P};
  const HeadStrides bthd = HeadStrides::of(Layout::bthd, H, Tq, D);
  // [Hkv, Tk, B, D]
  const HeadStrides dk_htb{D, std::int64_t(Tk) * B * D, std::int64_t(B) * D};
  arenas = {Arena(std::size_t(nq + 2 * nk), B, D), Arena(std::size_t(3 * nq), B, D), Arena(std::size_t(nq + 2 * nk), B, D)};
  views = {{0, hbt, H, Tq},      {nq, k_tbh, Hkv, Tk},    {nq + nk, v_bht, Hkv, Tk},
           {0, o_thb, H, Tq},    {nq, o_thb, H, Tq},      {2 * nq, bthd, H, Tq},
           {0, bthd, H, Tq},     {nq, dk_htb, Hkv, Tk},   {nq + nk, v_bht, Hkv, Tk}};
}

inline int arena_of(int tensor) { return tensor <= kV ? 0 : tensor <= kDo ? 1 : 2; }

}  // namespace stableflash::attention::strided
