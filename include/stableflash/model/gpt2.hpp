// GPT-2 on the CPU: configuration, parameter layout with Hugging Face names, forward and backward.
// Pre-LayerNorm blocks, tanh-GELU MLP, learned positions, tied input/output embeddings, optional
// biases (the paper trains without), nanoGPT initialisation. Templated on the scalar: FP32 for
// training, FP64 for the finite-difference checks (FP64 supports `standard` attention only).
//
// Mixed precision where the paper has it: a `flash` layer rounds q, k, v to BF16, runs the CPU
// flash attention (paper or fused numerics, any policy), and its BF16 output feeds the FP32 rest;
// in the backward dO is rounded to BF16 and dq, dk, dv come back as BF16.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "stableflash/attention/attention.hpp"
#include "stableflash/model/attention_capture.hpp"

namespace stableflash::model {

struct Gpt2Config {
  int n_layer = 12, n_head = 12, n_embd = 768, block_size = 1024;
  int vocab_size = 50257;         // GPT-2's tokens; sampling draws from these only
  int padded_vocab_size = 50304;  // rows of wte and logits (nanoGPT pads to a multiple of 64)
  bool bias = false;              // biases in linear layers and LayerNorms (the paper: off)
  double init_std = 0.02;
  double layernorm_eps = 1e-5;

  int head_dim() const { return n_embd / n_head; }
  // Throws std::invalid_argument naming the field ("model.n_head", ...).
  void validate() const;
  bool operator==(const Gpt2Config&) const = default;
};

// Attention of one layer: `standard` is the materialized softmax in the model's precision;
// `flash` calls attention_forward/backward with `options` (its causal flag is forced on).
enum class AttentionKind : std::uint8_t { standard, flash };

struct LayerAttention {
  AttentionKind kind = AttentionKind::flash;
  attention::AttentionOptions options{};
};

// Which optimizer rule a tensor gets (optim/): Muon orthogonalizes hidden matrices only.
enum class ParamRole : std::uint8_t {
  embedding,      // wte (also the output head), wpe: 2-D, AdamW even under Muon
  hidden_matrix,  // attention and MLP weights: Muon's target
  vector,         // LayerNorm weights and biases: 1-D, no weight decay
};

struct ParamTensor {
  std::string name;                // Hugging Face GPT-2 name, e.g. "transformer.h.0.attn.c_attn.weight"
  std::vector<std::int64_t> shape;  // Conv1D weights are [in, out], as Hugging Face stores them
  std::int64_t offset = 0, size = 0;
  ParamRole role = ParamRole::vector;
  bool is_2d() const { return shape.size() == 2; }
};

// The tensors of a config, in storage order (one flat buffer).
std::vector<ParamTensor> parameter_layout(const Gpt2Config& config);

// nanoGPT initialisation of a flat parameter buffer laid out as `tensors` (see Gpt2::init_weights);
// the CPU and CUDA models start from the same values.
template <class T>
void init_parameters(const Gpt2Config& config, const std::vector<ParamTensor>& tensors, std::uint64_t seed, std::span<T> params);

template <class T>
class Gpt2 {
 public:
  // `attention` holds one entry per layer.
  Gpt2(const Gpt2Config& config, std::vector<LayerAttention> attention);
  ~Gpt2();
  Gpt2(Gpt2&&) noexcept;
  Gpt2& operator=(Gpt2&&) noexcept;

  const Gpt2Config& config() const { return config_; }
  const std::vector<LayerAttention>& attention() const { return attention_; }
  const std::vector<ParamTensor>& tensors() const { return tensors_; }
  const ParamTensor& tensor(std::string_view name) const;  // throws naming the tensor

  std::span<T> params() { return params_; }
  std::span<const T> params() const { return params_; }
  std::span<T> grads() { return grads_; }
  std::span<const T> grads() const { return grads_; }
  std::int64_t parameter_count() const { return std::int64_t(params_.size()); }

  // nanoGPT initialisation: N(0, init_std) for weights and embeddings, N(0, init_std/sqrt(2L))
  // for the residual projections (attn.c_proj, mlp.c_proj), LayerNorm weights 1, biases 0.
  // One SplitMix64 stream per tensor, so the draw does not depend on the thread count.
  void init_weights(std::uint64_t seed);

  // tokens, targets: [B, T] ids. With targets, returns the mean cross-entropy over B*T positions
  // and keeps what backward() needs; without (empty span), returns 0 and logits() holds [B, T, Vp].
  T forward(std::span<const int> tokens, std::span<const int> targets, int batch, int len);
  std::span<const T> logits() const;

  // Emulates PyTorch's BF16 autocast (FP32 model only): every matmul reads BF16-rounded operands
  // and its output is rounded to BF16, GELU runs on and returns BF16 values, the logits and their
  // gradient are BF16; LayerNorm, embeddings, residual stream and weight gradients stay FP32.
  // The honest naive BF16 implementation that the CUDA trainer's error is judged against.
  void set_bf16_autocast(bool on);

  // Probes: the next forward with targets and its backward keep what `request` asks for
  // (attention_capture.hpp); take_capture() hands it over and clears the request. Capturing
  // changes no output (the counters only count; the extra residual is written beside O).
  void request_capture(const CaptureRequest& request);
  Capture take_capture();

  void zero_grad();
  // Adds d(loss_scale * mean loss)/d(params) into grads() (gradient accumulation: call once per
  // micro-batch with loss_scale = 1/accumulation_steps). Needs a forward with targets.
  void backward(T loss_scale);

 private:
  struct Activations;
  void forward_attention(int layer, Activations& a, int batch, int len);
  void backward_attention(int layer, Activations& a, int batch, int len, const T* d_out, T* d_qkv);
  T* param(std::size_t index) { return params_.data() + tensors_[index].offset; }
  T* grad(std::size_t index) { return grads_.data() + tensors_[index].offset; }

  Gpt2Config config_;
  std::vector<LayerAttention> attention_;
  std::vector<ParamTensor> tensors_;
  std::vector<T> params_, grads_;
  std::unique_ptr<Activations> acts_;
  bool bf16_autocast_ = false;
  CaptureRequest capture_request_;
  bool capture_pending_ = false;  // the next forward with targets starts the capture...
  bool capturing_ = false;        // ...which lasts until the end of its backward (a validation forward in between is not captured)
  Capture capture_;
  LayerCapture* captured(int layer);  // the layer's capture in progress, or null
  // The linear layers and the tied head, exact or with autocast's BF16 roundings.
  void linear(T* out, const T* x, const T* w, const T* b, std::int64_t n, int in, int out_features);
  void linear_backward(T* dx, T* dw, T* db, const T* dout, const T* x, const T* w, std::int64_t n, int in, int out_features);
  // Index of each tensor of layer l (or -1 without biases), resolved once.
  struct LayerIndex {
    int ln1_w, ln1_b, qkv_w, qkv_b, attproj_w, attproj_b, ln2_w, ln2_b, fc_w, fc_b, fcproj_w, fcproj_b;
  };
  std::vector<LayerIndex> layer_index_;
  int wte_ = 0, wpe_ = 0, lnf_w_ = 0, lnf_b_ = -1;
};

extern template class Gpt2<float>;
extern template class Gpt2<double>;

}  // namespace stableflash::model
