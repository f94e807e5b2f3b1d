// `kernel_lab --backward-parts`: the backward's memory-bound kernels around the main one (the delta
// pass from the output, alone and clearing the dQ workspace as production runs it, the dQ
// conversion) and the dQ workspace's memset it replaced, each timed alone, the
// earlier kernels (lab/backward_small_v1.cuh) against production's (backward_delta.cuh) in one run,
// and their outputs compared bit for bit on the same inputs, in the layouts that reach them:
// [B, H, T, D], [B, T, H, D], GPT-2's (o and dO [B, T, H, D], dq a view of [B, T, 3, H, D]) and dq
// rows aligned to 8 bytes only (the conversion's 8-byte store path).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "execute.hpp"
#include "lab/lab_support.cuh"
#include "lab/backward_small_v1.cuh"
#include "lab/lab.hpp"
#include "launch.hpp"
#include "plan.hpp"

namespace stableflash::attention::cuda::lab {
namespace {

enum class Fill { bf16_values, bf16_residuals, fp32_values };

// Random finite values from a counter hash, bit patterns rather than a distribution: BF16 pairs with
// magnitudes 2^-7 .. 2^9 (values) or 2^-22 .. 2^-9 (residuals), FP32 with 2^-27 .. 2^13 and every
// mantissa bit random (so some products land on BF16 rounding ties).
__global__ void fill_bits_kernel(std::uint32_t* out, std::int64_t n, std::uint64_t seed, Fill fill) {
  const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const std::uint64_t z = counter_hash(seed, std::uint64_t(i));
  auto bf16 = [&](std::uint32_t r) -> std::uint32_t {
    const std::uint32_t exponent = fill == Fill::bf16_values ? 120 + r % 16 : 105 + r % 14;
    return ((r >> 8) & 0x8000u) | (exponent << 7) | ((r >> 16) & 0x7fu);
  };
  if (fill == Fill::fp32_values)
    out[i] = (std::uint32_t(z >> 40) & 0x80000000u) | ((100 + std::uint32_t(z >> 32) % 41) << 23) | (std::uint32_t(z) & 0x7fffffu);
  else
    out[i] = bf16(std::uint32_t(z)) | (bf16(std::uint32_t(z >> 32)) << 16);
}

template <class T>
void fill(DeviceBuffer<T>& b, std::uint64_t seed, Fill kind) {
  const std::int64_t words = std::int64_t(b.bytes() / 4);
  fill_bits_kernel<<<unsigned((words + 255) / 256), 256>>>(reinterpret_cast<std::uint32_t*>(b.ptr), words, seed, kind);
  check_cuda(cudaGetLastError(), "fill_bits_kernel");
}

struct Shape {
  int batch, heads, len, dim;
};

std::vector<Shape> parse_shapes(const std::string& list) {
  std::vector<Shape> out;
  std::size_t at = 0;
  while (at <= list.size()) {
    const std::size_t end = std::min(list.find(',', at), list.size());
    const std::string item = list.substr(at, end - at);
    Shape s{};
    char tail = 0;
    if (std::sscanf(item.c_str(), "%dx%dx%dx%d%c", &s.batch, &s.heads, &s.len, &s.dim, &tail) != 4 || s.batch < 1 ||
        s.heads < 1 || s.len < 1)
      throw std::invalid_argument("--parts-shapes: expected BxHxTxD, got '" + item + "'");
    out.push_back(s);
    at = end + 1;
  }
  return out;
}

// Where the tensors lie: o, o_residual and dO share a layout; dq packed like them, as GPT-2's view
// of its interleaved [B, T, 3, H, D] gradient, or with rows 8-byte aligned only.
enum class DqView { packed, interleaved_qkv, aligned8 };
struct Case {
  const char* name;
  Layout layout;
  DqView dq;
};
constexpr Case kCases[] = {{"bhtd", Layout::bhtd, DqView::packed},
                           {"bthd", Layout::bthd, DqView::packed},
                           {"gpt2 (o, dO bthd; dq in [B,T,3,H,D])", Layout::bthd, DqView::interleaved_qkv},
                           {"dq rows 8-byte aligned (bhtd)", Layout::bhtd, DqView::aligned8}};

struct Timing {
  double flushed_us, streamed_us;  // median of single launches after an L2 flush (as ncu); mean of back-to-back launches
};

Timing time_launches(const std::function<void()>& launch, DeviceBuffer<char>& flush, int repeats) {
  for (int i = 0; i < 3; ++i) launch();
  check_cuda(cudaDeviceSynchronize(), "warm-up");
  std::vector<double> single;
  EventPair events;
  for (int r = 0; r < repeats; ++r) {
    check_cuda(cudaMemsetAsync(flush.ptr, r & 0xff, flush.bytes()), "L2 flush");
    events.start();
    launch();
    single.push_back(events.stop_us());
  }
  std::sort(single.begin(), single.end());
  return {single[single.size() / 2], back_to_back_us(launch, repeats)};
}

void print_row(const char* what, double bytes, const Timing& old_t, const Timing& new_t, const char* same) {
  const auto tbs = [&](double us) { return bytes / (us * 1e-6) / 1e12; };
  std::printf("  %-26s %8.1f MB | old %7.2f us %5.2f TB/s (back-to-back %7.2f us %5.2f) | new %7.2f us %5.2f TB/s "
              "(back-to-back %7.2f us %5.2f) | %s\n",
              what, bytes / 1e6, old_t.flushed_us, tbs(old_t.flushed_us), old_t.streamed_us, tbs(old_t.streamed_us),
              new_t.flushed_us, tbs(new_t.flushed_us), new_t.streamed_us, tbs(new_t.streamed_us), same);
}

// One shape in one case: bit checks of every (numerics, delta source) and conversion scale, then
// the timings of fused numerics (GPT-2's). Returns the number of differing outputs.
template <int D>
int run_case(const Shape& s, const Case& c, DeviceBuffer<char>& flush, int repeats) {
  const std::int64_t rows = std::int64_t(s.batch) * s.heads * s.len, elements = rows * D;
  const HeadStrides os = HeadStrides::of(c.layout, s.heads, s.len, D);
  HeadStrides ds = os;
  std::int64_t dq_extent = elements, dq_offset = 0;
  if (c.dq == DqView::interleaved_qkv) {
    ds = {std::int64_t(s.len) * 3 * s.heads * D, D, std::int64_t(3) * s.heads * D};
    dq_extent = 3 * elements;
  } else if (c.dq == DqView::aligned8) {  // rows of D + 4 elements from an 8-byte offset: 8-byte aligned, not 16
    ds = {std::int64_t(s.heads) * s.len * (D + 4), std::int64_t(s.len) * (D + 4), D + 4};
    dq_extent = rows * (D + 4) + 4, dq_offset = 4;
  }
  const int n_blocks = DqFragmentOrder::blocks(s.len);
  const std::int64_t acc_floats = std::int64_t(s.batch) * s.heads * n_blocks * DqFragmentOrder::kBlockQ * D;
  DeviceBuffer<std::uint16_t> o(elements), res(elements), d_o(elements), dq_old(dq_extent), dq_new(dq_extent);
  DeviceBuffer<float> delta_old(rows), delta_new(rows), acc(acc_floats);
  fill(o, 1, Fill::bf16_values), fill(res, 2, Fill::bf16_residuals), fill(d_o, 3, Fill::bf16_values);
  fill(acc, 4, Fill::fp32_values);

  BackwardParams p{};
  p.o = o.ptr, p.o_residual = res.ptr, p.d_o = d_o.ptr, p.dq = dq_new.ptr + dq_offset, p.dq_accum = acc.ptr;
  p.o_strides = {os.b, os.h, os.t}, p.d_o_strides = p.o_strides, p.dq_strides = {ds.b, ds.h, ds.t};
  p.batch = s.batch, p.heads = s.heads, p.q_len = s.len, p.k_len = s.len, p.kv_group = 1;
  p.scale = 1.0f / std::sqrt(float(D));
  const cudaStream_t stream = nullptr;

  auto old_delta = [&]<bool kPaper>(BackwardParams q) {
    q.delta = delta_old.ptr;
    const std::int64_t threads = rows * (D / 8);
    delta_from_output_v1_kernel<D, kPaper><<<unsigned((threads + 255) / 256), 256, 0, stream>>>(q);
    check_cuda(cudaGetLastError(), "lab delta v1 launch");
  };
  auto new_delta = [&]<bool kPaper>(BackwardParams q) {
    q.delta = delta_new.ptr;
    launch_delta<D, kPaper>(q, DeltaPass::from_output, stream);
  };
  auto old_convert = [&]<bool kPaper>(BackwardParams q) {
    q.dq = dq_old.ptr + dq_offset;
    const std::int64_t quads = acc_floats / 4;
    dq_convert_fragments_v1_kernel<D><<<unsigned((quads + 255) / 256), 256, 0, stream>>>(q, kPaper ? 1.0f : q.scale);
    check_cuda(cudaGetLastError(), "lab dQ conversion v1 launch");
  };
  auto new_convert = [&]<bool kPaper>(BackwardParams q) { launch_dq_convert<D, kPaper>(q, stream); };

  int differing = 0;
  auto same = [&](const auto& x, const auto& y, const std::string& what) {
    const bool equal = x.download() == y.download();
    if (!equal) {
      std::printf("  DIFFERENT BITS: %s\n", what.c_str());
      ++differing;
    }
    return equal;
  };
  bool delta_same = true, convert_same = true;
  for (const DeltaSource src : {DeltaSource::rounded, DeltaSource::compensated}) {
    p.delta_source = static_cast<int>(src);
    const std::string tag = std::string(to_string(src));
    check_cuda(cudaMemset(delta_old.ptr, 0xff, delta_old.bytes()), "cudaMemset");
    check_cuda(cudaMemset(delta_new.ptr, 0xff, delta_new.bytes()), "cudaMemset");
    old_delta.template operator()<false>(p), new_delta.template operator()<false>(p);
    delta_same &= same(delta_old, delta_new, "delta fused " + tag);
    old_delta.template operator()<true>(p), new_delta.template operator()<true>(p);
    delta_same &= same(delta_old, delta_new, "delta paper " + tag);
  }
  for (const bool paper : {false, true}) {
    check_cuda(cudaMemset(dq_old.ptr, 0x5a, dq_old.bytes()), "cudaMemset");  // elements between rows compare too
    check_cuda(cudaMemset(dq_new.ptr, 0x5a, dq_new.bytes()), "cudaMemset");
    if (paper)
      old_convert.template operator()<true>(p), new_convert.template operator()<true>(p);
    else
      old_convert.template operator()<false>(p), new_convert.template operator()<false>(p);
    convert_same &= same(dq_old, dq_new, paper ? "dQ conversion paper (scale 1)" : "dQ conversion fused (scale 1/sqrt(D))");
  }

  std::printf("%dx%dx%dx%d, %s\n", s.batch, s.heads, s.len, D, c.name);
  const double bf16_tensor = double(elements) * 2, delta_bytes = double(rows) * 4;
  for (const DeltaSource src : {DeltaSource::compensated, DeltaSource::rounded}) {
    p.delta_source = static_cast<int>(src);
    const Timing t_old = time_launches([&] { old_delta.template operator()<false>(p); }, flush, repeats);
    const Timing t_new = time_launches([&] { new_delta.template operator()<false>(p); }, flush, repeats);
    const double bytes = (src == DeltaSource::compensated ? 3 : 2) * bf16_tensor + delta_bytes;
    print_row(src == DeltaSource::compensated ? "delta compensated" : "delta rounded", bytes, t_old, t_new,
              delta_same ? "same bits" : "DIFFERENT");
  }
  {  // production's δ pass also clears the dQ workspace (what execute_backward runs instead of the memset below)
    BackwardParams z = p;
    z.delta_source = static_cast<int>(DeltaSource::compensated);
    z.zero_words = reinterpret_cast<uint4*>(acc.ptr), z.zero_word_count = std::int64_t(acc.bytes() / 16);
    const Timing t = time_launches([&] { new_delta.template operator()<false>(z); }, flush, repeats);
    const double bytes = 3 * bf16_tensor + delta_bytes + double(acc.bytes());
    std::printf("  %-26s %8.1f MB | %7.2f us %5.2f TB/s (back-to-back %7.2f us %5.2f)\n", "delta comp. + clearing dQ", bytes / 1e6,
                t.flushed_us, bytes / (t.flushed_us * 1e-6) / 1e12, t.streamed_us, bytes / (t.streamed_us * 1e-6) / 1e12);
    fill(acc, 4, Fill::fp32_values);  // the conversion below reads it
  }
  const Timing c_old = time_launches([&] { old_convert.template operator()<false>(p); }, flush, repeats);
  const Timing c_new = time_launches([&] { new_convert.template operator()<false>(p); }, flush, repeats);
  print_row("dQ conversion", double(acc.bytes()) + bf16_tensor, c_old, c_new, convert_same ? "same bits" : "DIFFERENT");
  // the workspace memset of execute_backward (dQ part; the deterministic turn counters are tiny)
  const Timing m = time_launches([&] { check_cuda(cudaMemsetAsync(acc.ptr, 0, acc.bytes(), stream), "cudaMemsetAsync"); }, flush,
                                 repeats);
  std::printf("  %-26s %8.1f MB | %7.2f us %5.2f TB/s (back-to-back %7.2f us %5.2f)\n", "dQ workspace memset",
              double(acc.bytes()) / 1e6, m.flushed_us, double(acc.bytes()) / (m.flushed_us * 1e-6) / 1e12, m.streamed_us,
              double(acc.bytes()) / (m.streamed_us * 1e-6) / 1e12);
  return differing;
}

}  // namespace

int run_backward_parts(const std::string& shapes, int repeats) {
  int device = 0;
  cudaDeviceProp prop{};
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  std::printf("backward parts on %s: old = lab/backward_small_v1.cuh, new = production; us = median of %d single launches "
              "after an L2 flush (as ncu), back-to-back = mean of %d launches in a row; TB/s = bytes read + written / time\n",
              prop.name, repeats, repeats);
  DeviceBuffer<char> flush(std::size_t(prop.l2CacheSize) * 4);
  int differing = 0;
  for (const Shape& s : parse_shapes(shapes))
    for (const Case& c : kCases)
      with_kernels(s.dim, false, [&]<int D, bool>() { differing += run_case<D>(s, c, flush, std::max(repeats, 1)); });
  std::printf(differing ? "%d outputs with different bits\n" : "all outputs bit-identical (old vs new)\n", differing);
  return differing ? 1 : 0;
}

}  // namespace stableflash::attention::cuda::lab
