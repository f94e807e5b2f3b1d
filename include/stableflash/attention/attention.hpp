// The public attention entry points: forward and backward in `paper` or `fused` numerics with any
// shift policy, and the FP64 `reference` oracle. Tensors are BF16 in [B, H, T, D] or [B, T, H, D]
// (head_dim contiguous), or any strided views of them (ForwardStrides / BackwardStrides); lse is
// FP32 [B, H, Tq]. Causal masking is bottom-right aligned.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "stableflash/attention/modes.hpp"
#include "stableflash/attention/shift_policies.hpp"
#include "stableflash/numerics/bf16.hpp"

namespace stableflash::attention {

inline constexpr int kMaxHeadDim = 256;

enum class Layout : std::uint8_t { bhtd, bthd };
std::string_view to_string(Layout v);
std::optional<Layout> parse_layout(std::string_view s);

// Where attention runs. For `cuda`, every tensor pointer in ForwardArgs/BackwardArgs is a device
// pointer (stableflash/attention/cuda.hpp has helpers that stage host tensors).
enum class Device : std::uint8_t { cpu, cuda };
inline std::string_view to_string(Device d) { return d == Device::cuda ? "cuda" : "cpu"; }
inline std::optional<Device> parse_device(std::string_view s) {
  if (s == "cpu") return Device::cpu;
  if (s == "cuda") return Device::cuda;
  return std::nullopt;
}

// Grouped-query / multi-query attention: K and V (and dK, dV) have kv_heads heads (0: = heads),
// which must divide heads; query head h reads K/V head h / (heads / kv_heads). Both devices sum the
// dK/dV of a KV head over its query heads in ascending head order (docs/numerics-contract.md).
struct AttentionShape {
  int batch = 1, heads = 1, q_len = 1, k_len = 1, head_dim = 64;
  int kv_heads = 0;  // 0: = heads (multi-head attention)

  int resolved_kv_heads() const { return kv_heads > 0 ? kv_heads : heads; }
  int group_size() const { return heads / resolved_kv_heads(); }  // query heads per KV head
  int kv_head_of(int h) const { return h / group_size(); }
  std::int64_t q_elements() const { return std::int64_t(batch) * heads * q_len * head_dim; }
  std::int64_t k_elements() const { return std::int64_t(batch) * resolved_kv_heads() * k_len * head_dim; }
  std::int64_t rows() const { return std::int64_t(batch) * heads * q_len; }
};

// delta_source `auto` takes `exact` in `fused` numerics up to this many keys, else `compensated`.
// Both are clean there (docs/numerics-findings.md; in `paper` numerics only `compensated` is: P
// inherits the BF16 row sum through lse). Up to here the exact delta is the cheaper: one CUDA
// backward block holds every key of its rows (cuda/plan.hpp kBackwardBlockK), so it forms
// rowsum(dP * P) from products it computes anyway, and the forward writes no residual
// (docs/benchmarks.md measured it below even the rounded delta's time there). Above, the exact
// delta needs its own pass over the keys (two more products); the residual costs one BF16 tensor
// written and read.
inline constexpr int kAutoExactMaxKeys = 128;

// Element offsets of (b, h, t, 0) for a tensor of sequence length `len` in a layout.
struct HeadStrides {
  std::int64_t b = 0, h = 0, t = 0;
  static HeadStrides of(Layout layout, int heads, int len, int head_dim);
  std::int64_t at(int b_, int h_, int t_) const { return b_ * b + h_ * h + t_ * t; }
  bool operator==(const HeadStrides&) const = default;
};

// Optional element strides (batch, head, token; head_dim always contiguous) per tensor, for views
// that are not packed: q = base, k = base + C, v = base + 2C of one interleaved [B, T, 3, H, D]
// product (token stride 3C, head stride D, C = H * D), or PyTorch views from .split / .transpose.
// An unset field means the tensor is packed in the args' `layout` (heads and length its own:
// H_kv and Tk for k, v, dk, dv). o_residual follows o; lse and delta stay head-major [B, H, Tq].
// The CUDA path has alignment rules for them (cuda::check_supported_args, docs/cuda-kernels.md).
struct ForwardStrides {
  std::optional<HeadStrides> q, k, v, o;
};
struct BackwardStrides {
  std::optional<HeadStrides> q, k, v, o, d_o, dq, dk, dv;
};
// A tensor's strides: `set`, else packed in `layout`. A dimension of extent 1 (batch 1, one head,
// length 1) is never stepped, so its stride is replaced by the packed one (PyTorch gives such
// dimensions arbitrary strides; the CUDA alignment rules should not see them).
HeadStrides resolve_strides(const std::optional<HeadStrides>& set, Layout layout, int batch, int heads, int len, int head_dim);

// The knobs of docs/numerics-contract.md. Tile sizes of 0 mean the mode's default (paper: 512 x 512 as the
// authors' code; fused: 128 x 128 as production Hopper kernels). Only the key-tile width changes
// the numerics (per-tile rounding and tie detection); the query-tile height is work granularity.
struct AttentionOptions {
  Numerics numerics = Numerics::fused;
  ShiftPolicy policy = ShiftPolicy::standard;
  PolicyParams policy_params{};
  bool causal = false;
  float scale = 0.0f;  // 0: 1/sqrt(head_dim)
  int tile_q = 0, tile_k = 0;
  Normalizer normalizer = Normalizer::fp32;
  int round_bits = 7;  // output-side significand bits; 7 = BF16 (an experiment knob below 7)
  DeltaSource delta_source = DeltaSource::rounded;
  Device device = Device::cpu;
  // CUDA only: accumulate dQ in a fixed order (no atomics) so the backward is bitwise reproducible.
  // The CPU path is always deterministic.
  bool deterministic = false;
  void* cuda_stream = nullptr;  // CUDA only: a cudaStream_t to run on (nullptr: the default stream)

  float resolved_scale(int head_dim) const;
  // The delta source a call of this shape uses: `auto` resolved (kAutoExactMaxKeys), the others as set.
  DeltaSource resolved_delta_source(const AttentionShape& shape) const;
  // These options with delta_source `auto` resolved for the shape. Each entry point (CPU and CUDA
  // forward, backward, delta) resolves once on entry; below it delta_source is never `auto`.
  AttentionOptions for_shape(const AttentionShape& shape) const;
  // Calls with more keys than this write (forward) and read (backward) o_residual, i.e. their
  // resolved delta_source is `compensated`: 0 for compensated (and auto outside `fused`),
  // kAutoExactMaxKeys for auto, INT_MAX for rounded and exact. Callers size their buffers by
  // needs_residual.
  int residual_above_keys() const;
  bool needs_residual(const AttentionShape& shape) const { return shape.k_len > residual_above_keys(); }
  // The forward's and backward's argument check of it (CPU and CUDA): std::invalid_argument naming
  // the rule when the call needs o_residual and has none. `what`: the buffer, as the message says it.
  void require_residual(const AttentionShape& shape, bool present, const char* what) const;
  int resolved_tile_q() const;
  int resolved_tile_k() const;
  // Throws std::invalid_argument naming the offending field.
  void validate(const AttentionShape& shape) const;
};

// Rows that saw the events the audit counts (docs/numerics-contract.md "The audit's measures").
struct TieCounts {
  std::int64_t rows = 0;               // rows processed
  std::int64_t tie_event_rows = 0;     // some key tile fed >= 2 BF16(P-bar) == 1.0 into P-bar*V
  std::int64_t repeated_max_rows = 0;  // the row's S has its maximum at >= 2 keys (before any policy)
  std::int64_t fallback_rows = 0;      // the policy fell back to the standard shift in some tile
  std::int64_t masked_rows = 0;        // rows with no visible key (o = 0, lse = +inf)
};

struct ForwardArgs {
  AttentionShape shape;
  Layout layout = Layout::bhtd;
  const bf16* q = nullptr;   // [B, H, Tq, D]
  const bf16* k = nullptr;   // [B, H_kv, Tk, D]
  const bf16* v = nullptr;   // [B, H_kv, Tk, D]
  bf16* o = nullptr;         // [B, H, Tq, D]
  float* lse = nullptr;      // [B, H, Tq], always head-major
  bf16* o_residual = nullptr;  // [B, H, Tq, D] with o's strides; required when delta_source == compensated
  TieCounts* ties = nullptr;   // optional event counters
  // Optional, [heads]: the same counters per query head (the probes' layer x head statistics).
  // Counting never changes the CPU's outputs; on the GPU a counting run walks keys in numerics
  // tiles, which for `fused` with a policy that needs no tie count changes the shift decisions
  // (cuda.hpp), so the trainer counts on the GPU in a separate forward into scratch outputs.
  TieCounts* head_ties = nullptr;
  ForwardStrides strides;      // optional per-tensor strides; unset: packed in `layout`

  // The strides each tensor is addressed with (resolve_strides).
  HeadStrides q_strides() const;
  HeadStrides k_strides() const;
  HeadStrides v_strides() const;
  HeadStrides o_strides() const;  // o and o_residual
};

struct BackwardArgs {
  AttentionShape shape;
  Layout layout = Layout::bhtd;
  const bf16 *q = nullptr, *k = nullptr, *v = nullptr;
  const bf16* o = nullptr;           // the forward's BF16 output
  const float* lse = nullptr;        // [B, H, Tq]
  const bf16* o_residual = nullptr;  // required when delta_source == compensated
  const bf16* d_o = nullptr;         // [B, H, Tq, D]
  bf16 *dq = nullptr, *dk = nullptr, *dv = nullptr;  // dk, dv: [B, H_kv, Tk, D]
  float* delta = nullptr;            // optional out [B, H, Tq]: the delta the backward used
  BackwardStrides strides;           // optional per-tensor strides; unset: packed in `layout`
  // Optional, CUDA only: device scratch of at least cuda::backward_workspace_bytes(args, options)
  // bytes (256-byte aligned) that the backward uses instead of an allocation from the stream-ordered
  // pool per call; no other work may use it concurrently. The trainer passes one so that a step
  // captured into a CUDA graph allocates nothing (model/cuda/gpt2_cuda.cpp).
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;

  // The strides each tensor is addressed with (resolve_strides).
  HeadStrides q_strides() const;
  HeadStrides k_strides() const;
  HeadStrides v_strides() const;
  HeadStrides o_strides() const;  // o and o_residual
  HeadStrides d_o_strides() const;
  HeadStrides dq_strides() const;
  HeadStrides dk_strides() const;
  HeadStrides dv_strides() const;
};

// `paper` and `fused` numerics on options.device: the CPU implementations (OpenMP across
// (B, H, row tiles)) or the CUDA kernels (attention/cuda/, head_dim 64 and 128).
void attention_forward(const ForwardArgs& args, const AttentionOptions& options);
void attention_backward(const BackwardArgs& args, const AttentionOptions& options);

// The delta = rowsum(dO * O) the backward uses, per options.delta_source, without the rest of the
// backward (the audit measures it). `o_residual` is needed for `compensated`.
void attention_delta(const BackwardArgs& args, const AttentionOptions& options, float* delta /*[B, H, Tq]*/);

// The FP64 oracle (docs/numerics-contract.md `reference`), from the BF16 input values (read with the args'
// strides). With kv_heads < heads the dK/dV of a KV head is the FP64 sum of its query heads' dK/dV,
// added in ascending head order. Its outputs are vectors packed in args.layout, whatever the strides.
struct ReferenceForward {
  std::vector<double> o;    // [B, H, Tq, D] packed in args.layout
  std::vector<double> lse;  // [B, H, Tq]; +inf for fully masked rows
};
struct ReferenceBackward {
  std::vector<double> dq, dk, dv;  // packed in args.layout: [B, H, Tq, D], [B, H_kv, Tk, D] x 2
  std::vector<double> delta;       // [B, H, Tq]
};
ReferenceForward reference_forward(const ForwardArgs& args, const AttentionOptions& options);
ReferenceBackward reference_backward(const BackwardArgs& args, const AttentionOptions& options);

// The same oracle on FP64 inputs (head-major [B, H, T, D]), for finite-difference checks.
struct Fp64Inputs {
  AttentionShape shape;
  const double *q = nullptr, *k = nullptr, *v = nullptr, *d_o = nullptr;
};
ReferenceForward reference_forward(const Fp64Inputs& in, const AttentionOptions& options);
ReferenceBackward reference_backward(const Fp64Inputs& in, const AttentionOptions& options);

// A naive BF16 attention as an unfused framework would compute it (materialized softmax): the
// honest low-precision baseline that error bounds are derived from. S = BF16(FP32-dot * scale),
// P = BF16(softmax_fp32(S)), O = BF16(FP32-dot(P, V)); backward with BF16 intermediates
// (dP, dS) and FP32 accumulation. Writes o (and dq, dk, dv when args.d_o is set).
void naive_bf16_forward(const ForwardArgs& args, const AttentionOptions& options);
void naive_bf16_backward(const BackwardArgs& args, const AttentionOptions& options);

// The last visible key of query row i (bottom-right aligned causal), or k_len - 1.
inline int last_visible_key(int i, int q_len, int k_len, bool causal) {
  if (!causal) return k_len - 1;
  const int last = i + k_len - q_len;
  return last < k_len - 1 ? last : k_len - 1;
}

}  // namespace stableflash::attention
