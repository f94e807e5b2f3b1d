// The CUDA side of the attention entry point (attention/cuda/). attention_forward/backward/delta
// call these when options.device == Device::cuda; then every tensor pointer in the args is a device
// pointer. In a build without CUDA they exist and throw, so callers need no #ifdefs.
//
// Supported on the GPU: head_dim 64 and 128 (the build option STABLEFLASH_CUDA_HEAD_DIMS may
// compile fewer), `paper` and `fused` numerics, every shift policy, both layouts and strided views
// whose rows are aligned (check_supported_args below), any Tq and Tk, grouped-query / multi-query heads.
// Key tiles: the kernels walk keys in sub-tiles of 64; the numerics' key tile (options.tile_k,
// which `paper` numerics and the published policy's tie detection depend on) must be a multiple of
// 64. `fused` numerics with a policy that needs no tie count decide the shift per key step of the
// kernel that runs (64 keys in the one-warpgroup kernel, 128 in the warp-specialized one; its error
// bound, not bitwise equality, is the contract there; docs/cuda-kernels.md).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "stableflash/attention/attention.hpp"

namespace stableflash::attention::cuda {

inline constexpr int kSubTile = 64;  // keys per kernel sub-tile; numerics tiles are multiples of it

// True when this build has the CUDA kernels; has_device() additionally asks the driver for a GPU.
bool built();
bool has_device();
// Throws std::invalid_argument when the GPU path cannot run this (shape, options) combination.
void check_supported(const AttentionShape& shape, const AttentionOptions& options);
// The same for one call: also the required tensors and each tensor's memory, naming the field.
// Every row (b, h, t) of a tensor must start aligned, i.e. its base and its strides (args.strides,
// or the packed layout) are multiples of: 16 bytes (8 elements) for q, k, v, and in the backward
// o, o_residual, do (bulk tensor copies, 16-byte loads); 8 bytes for dq, dk, dv; 4 bytes for the
// forward's o, o_residual (bulk stores when they are 16-byte aligned too, else element-wise). Strides
// are non-negative. forward/backward/delta call these first; a caller may call them ahead of time.
void check_supported_args(const ForwardArgs& args, const AttentionOptions& options);
void check_supported_args(const BackwardArgs& args, const AttentionOptions& options);  // backward and delta

// Device-pointer entry points (asynchronous on options.cuda_stream, except that event counters
// (ForwardArgs::ties) are copied back synchronously when requested).
void forward(const ForwardArgs& args, const AttentionOptions& options);
void backward(const BackwardArgs& args, const AttentionOptions& options);
void delta(const BackwardArgs& args, const AttentionOptions& options, float* delta /*[B, H, Tq], device*/);
// Bytes of device scratch a backward call with these args and options uses (BackwardArgs::workspace):
// the dQ accumulator, the deterministic dQ turn counters, delta (unless args.delta) and the
// grouped-query heads' per-head dK, dV.
std::size_t backward_workspace_bytes(const BackwardArgs& args, const AttentionOptions& options);

// What runs a forward and a backward in the host conveniences, the bench and the oracle check:
// the entry points above, or the kernel lab's comparison kernels (attention/cuda/lab, the
// `kernel_lab` program; the library itself never runs those).
struct Kernels {
  std::string name = "production";
  std::function<void(const ForwardArgs&, const AttentionOptions&)> forward = cuda::forward;
  std::function<void(const BackwardArgs&, const AttentionOptions&)> backward = cuda::backward;
};

// Host-pointer conveniences: copy the host tensors to the GPU, run, copy the outputs back, and
// synchronize. Used by `stableflash attention --device cuda`, the audit and the GPU tests. They copy
// packed tensors (args.layout) and refuse args.strides (pass device pointers to forward() instead).
// forward_from_host with event counters (ties, head_ties) returns the counts of a counting forward
// and the outputs of the same call without counters (the fast path a user's call takes, where the
// counting run would take the units walk), so that its outputs are those of cuda::forward without
// counters, what a user's call returns.
void forward_from_host(const ForwardArgs& host_args, const AttentionOptions& options, const Kernels& kernels = {});
void backward_from_host(const BackwardArgs& host_args, const AttentionOptions& options, const Kernels& kernels = {});
void delta_from_host(const BackwardArgs& host_args, const AttentionOptions& options, float* delta /*host*/);

// Timing of back-to-back calls between one pair of CUDA events, the peer script's method
// (shared/peers/torch_peers.py): warm up for `warmup_s`, size a window to last >= `min_window_ms`,
// and return the median over `windows` of the mean per-call time, in milliseconds.
struct BenchTiming {
  double fwd_ms = 0.0, bwd_ms = 0.0;
  int calls_per_window_fwd = 0, calls_per_window_bwd = 0;
};
// Random inputs (seeded, never zeros) of `shape` on the GPU; times forward then backward
// (backward = delta + main + dQ conversion, what one training step pays).
BenchTiming bench(const AttentionShape& shape, Layout layout, const AttentionOptions& options, std::uint64_t seed,
                  double warmup_s = 0.3, int windows = 7, double min_window_ms = 20.0, const Kernels& kernels = {});

std::string device_name();

// Compares the GPU with the CPU oracle on one seeded random input (normal q, k, v, dO; logits
// multiplied by `logit_scale`), as docs/numerics-contract.md says:
//   fused: max|GPU - FP64 reference| <= 2x (forward) / 3x (gradients) the naive BF16
//          implementation's error + one BF16 ulp at max|reference|, for o, dq, dk, dv;
//   paper: against the CPU `paper` oracle: elements that differ are counted, and every difference
//          must stay within `paper_ulps` BF16 ulps at the tensor's max|CPU value| (exp accuracy).
struct OracleTensorCheck {
  std::string name;
  double err = 0.0, bound = 0.0;  // fused: max error and bound; paper: max difference and its bound
  std::int64_t differing = 0, elements = 0, nonfinite = 0;
  bool pass() const { return nonfinite == 0 && err <= bound; }
};
struct OracleCheck {
  std::vector<OracleTensorCheck> tensors;  // o, lse (paper only), dq, dk, dv
  bool pass() const;
  std::string describe() const;  // one line per tensor
};
OracleCheck check_against_oracle(const AttentionShape& shape, Layout layout, const AttentionOptions& options,
                                 std::uint64_t seed, double logit_scale = 1.0, double paper_ulps = 2.0,
                                 const Kernels& kernels = {});

}  // namespace stableflash::attention::cuda
