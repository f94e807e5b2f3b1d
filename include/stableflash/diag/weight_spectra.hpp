// Spectral norms of a GPT-2's weight matrices for the trainer's probes: every 2-D tensor (wte, wpe,
// and per layer attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj), each layer's W_Q, W_K, W_V (the
// column blocks of c_attn [C, 3C]) and, per head h, W_Q, W_K, W_V's columns [hD, (h + 1)D) and
// W_O's rows [hD, (h + 1)D) (c_proj [C, C] in [in, out] layout: the rows head h's output feeds).
// One definition for the CPU and the GPU trainer: the GPU's FP32 master weights are copied to the
// host and measured by the same code (spectral_norm: FP64 power iteration, warm-started from the
// previous probe, until a round changes the estimate by at most `tolerance` of itself, within a cap
// of rounds: 200 cold / 50 warm for the W_Q scope, 50 cold / 4 warm for scope `all`, whose slowly
// converging large matrices then continue their iteration over successive probes).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "stableflash/model/gpt2.hpp"

namespace stableflash::diag {

// A matrix inside the flat parameters: rows x cols, row-major with leading dimension ld.
struct MatrixView {
  std::string name;  // "wte", "h.3.attn.c_attn", "h.3.wq", "h.3.wq.head.5", "h.3.wo.head.5", ...
  std::int64_t offset = 0;
  int rows = 0, cols = 0;
  std::int64_t ld = 0;
};

// Which matrices a probe measures.
enum class SpectraScope : std::uint8_t {
  wq,         // each layer's W_Q and its heads (the paper's indicator; every train.probe_every steps)
  all,        // every matrix listed above (every probe.sigma_every steps)
};

struct WeightSpectraResult {
  std::vector<std::pair<std::string, double>> matrices;  // scope `all`: every 2-D tensor by name ("wte", "h.0.attn.c_attn", ...)
  std::vector<double> wq, wk, wv;                        // [layer] (wk, wv: scope `all`)
  std::vector<std::vector<double>> wq_heads, wk_heads, wv_heads, wo_heads;  // [layer][head] (wk, wv, wo: scope `all`)
};

class WeightSpectra {
 public:
  explicit WeightSpectra(const model::Gpt2Config& config, double tolerance = 1e-6);
  // The views a scope measures, in the order they are computed.
  const std::vector<MatrixView>& views(SpectraScope scope) const { return scope == SpectraScope::wq ? wq_views_ : all_views_; }
  // params: the flat FP32 parameters in parameter_layout order (host memory).
  WeightSpectraResult measure(std::span<const float> params, SpectraScope scope);

 private:
  double tolerance_;
  int layers_, heads_;
  std::vector<MatrixView> wq_views_, all_views_;
  std::vector<std::vector<double>> warm_;  // per view name slot: the last right singular vector (by index into all_views_ / wq_views_)
  std::vector<std::vector<double>> warm_wq_;
};

}  // namespace stableflash::diag
