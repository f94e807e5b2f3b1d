// What the probes read from a training step's attention (train/probes.hpp): for chosen layers,
// the first sequences of the step's last micro-batch as the flash attention saw and produced them,
// and the kernels' event counters per head. The CPU model (Gpt2<float>) and the GPU model
// (Gpt2Cuda) fill the same structure, so one host computation (diag/attention_probes.hpp) serves
// both. Taking a capture never changes what the step computes (tested bitwise on the CPU and, with
// train.deterministic, on the GPU).
#pragma once

#include <cstdint>
#include <vector>

#include "stableflash/attention/attention.hpp"
#include "stableflash/numerics/bf16.hpp"

namespace stableflash::model {

// What to keep during the next train_micro_batch (set before the step's last micro-batch).
struct CaptureRequest {
  std::vector<int> layers;  // flash layers to capture (a `standard` layer is skipped: no BF16 q, k, v)
  int sequences = 1;        // leading sequences of the micro-batch kept per layer
  bool count_ties = false;  // the kernels' event counters per layer and head, over the whole micro-batch
  bool empty() const { return layers.empty() && !count_ties; }
};

// One layer, `sequences` x `len` tokens, in [S, T, H, D] (q, k, v, o, o_residual, d_o) and
// [S, H, T] (lse), exactly the values the layer's attention read and wrote.
struct LayerCapture {
  int layer = 0;
  attention::AttentionOptions options;  // the layer's attention (causal; device cpu)
  attention::AttentionShape shape;      // batch = sequences, heads, q_len = k_len = len, head_dim
  std::vector<bf16> q, k, v, o;
  // BF16(O_fp32 - O): the output's rounding error, written by the forward for every captured
  // layer (not only `compensated` ones), so O + o_residual is the output before its last rounding.
  std::vector<bf16> o_residual;
  std::vector<bf16> d_o;  // the backward's BF16 dO
  std::vector<float> lse;
  std::vector<float> x;   // [S, T, C] the input of attn.c_attn (ln_1's output; BF16 values on the GPU)
};

struct Capture {
  std::vector<LayerCapture> layers;
  // [layer][head] the kernels' counters over every row of the micro-batch (empty when not
  // requested; a `standard` layer's entry is empty).
  std::vector<std::vector<attention::TieCounts>> head_ties;
};

}  // namespace stableflash::model
