// Helpers of the GPU attention tests: device buffers with guard zones, seeded inputs, and runs of
// the GPU path on device pointers (not the staging helpers, so guards and poison can be checked).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "plan.hpp"
#include "stableflash/attention/attention.hpp"
#include "stableflash/attention/cuda.hpp"

namespace stableflash::attention::gpu_test {

// Whether two tensors hold the same bits, element for element (and the same size).
template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Skips the current test where no GPU is present (CPU-only CI runs exclude the label anyway).
#define SF_REQUIRE_GPU()                                       \
  do {                                                         \
    if (!::stableflash::attention::cuda::has_device()) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

// A device array with kGuard elements of a poison pattern on each side and a poisoned interior:
// after a kernel, the guards must be intact (no out-of-bounds writes) and, for outputs, no
// interior element may still hold the poison (every element written).
template <class T>
class GuardedBuffer {
 public:
  static constexpr std::size_t kGuard = 64;  // elements; keeps the interior 16-byte aligned
  explicit GuardedBuffer(std::size_t n);
  GuardedBuffer(std::size_t n, const std::vector<T>& init);
  ~GuardedBuffer();
  GuardedBuffer(const GuardedBuffer&) = delete;
  GuardedBuffer& operator=(const GuardedBuffer&) = delete;

  T* get() const { return base_ + kGuard; }
  std::size_t size() const { return n_; }
  std::vector<T> download() const;
  // Guards intact; with `fully_written`, no interior element still equal to the poison.
  ::testing::AssertionResult intact(bool fully_written) const;

 private:
  T* base_ = nullptr;
  std::size_t n_;
};

struct Inputs {
  AttentionShape shape;
  Layout layout = Layout::bhtd;
  std::vector<bf16> q, k, v, d_o;
};
// Normal q, k, v, dO from a seed; q multiplied by `logit_scale` (logits scale with it).
Inputs random_inputs(const AttentionShape& s, Layout layout, std::uint64_t seed, double logit_scale = 1.0);
// q, k with 4-bit values in [-1, 1] (k/8): every FP32 dot product over D <= 128 is exact, so S
// is bitwise the same whatever the accumulation order (paper-mode S comparisons).
Inputs exact_dot_inputs(const AttentionShape& s, Layout layout, std::uint64_t seed);

struct Outputs {
  std::vector<bf16> o, residual, dq, dk, dv;
  std::vector<float> lse, delta;
  TieCounts ties;
};

// The launch plan a forward of shape `s` with `opt` gets on this device (cuda::plan_forward, the
// device's multiprocessors in plan.sms), for tests that look for a grid where a planned feature runs:
// the plan reads the tensors' addresses only for their alignment, so aligned stand-ins serve.
cuda::ForwardPlan plan_on_this_device(const AttentionShape& s, const AttentionOptions& opt);

// GPU forward (+ backward when `backward`) on guarded device buffers; every guard checked with
// EXPECT (a failure names the tensor).
Outputs run_gpu(const Inputs& in, const AttentionOptions& opt, bool backward, bool count_ties = false);
// Forward + backward `runs` times: how many runs give any output (o, lse, the residual, delta, dq,
// dk, dv) with other bits than the first run's. The bitwise-reproducibility tests expect 0.
int runs_differing_from_first(const Inputs& in, const AttentionOptions& opt, int runs);
// A backward's inputs on the device, for tests that call attention_backward or attention_delta
// themselves: q, k, v, dO from `in`; o, lse and (when the forward wrote one) the residual from a
// forward's outputs. args() points a BackwardArgs at them (shape, layout; gradients left to the test).
struct BackwardInputsOnDevice {
  BackwardInputsOnDevice(const Inputs& in, const Outputs& forward);
  BackwardArgs args() const;
  AttentionShape shape;
  Layout layout;
  GuardedBuffer<bf16> q, k, v, d_o, o, residual;
  GuardedBuffer<float> lse;
};
// The CPU oracle in the same mode.
Outputs run_cpu(const Inputs& in, const AttentionOptions& opt, bool backward);

// max |a - ref| over finite elements, and the count of non-finite a.
double max_err(const std::vector<bf16>& a, const std::vector<double>& ref, std::int64_t* nonfinite = nullptr);
double max_abs(const std::vector<double>& x);

// The bound of stableflash/attention/error_bound.hpp per tensor, with the references it was computed from.
struct Bounds {
  double o, dq, dk, dv;
  std::vector<double> ref_o, ref_dq, ref_dk, ref_dv, ref_lse, ref_delta;
};
Bounds fused_bounds(const Inputs& in, const AttentionOptions& opt, bool backward);

// Elements of a and b that differ, and the largest difference in BF16 ulps of max|b|.
struct Agreement {
  std::int64_t differing = 0, elements = 0, nonfinite = 0;
  double max_ulps = 0.0;
  std::string str() const;
};
template <class T>
Agreement agreement(const std::vector<T>& a, const std::vector<T>& b);

}  // namespace stableflash::attention::gpu_test
