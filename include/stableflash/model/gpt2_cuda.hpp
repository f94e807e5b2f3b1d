// GPT-2 on the GPU: the CUDA twin of Gpt2<float> (stableflash/model/gpt2.hpp), llm.c style, in
// the mixed precision of PyTorch's BF16 autocast (the paper's setting):
//   - FP32 master weights, FP32 gradients; a BF16 copy of the weights feeds every matmul;
//   - BF16 matmuls with FP32 accumulation through cuBLASLt; BF16 activations between matmuls;
//   - the residual stream, LayerNorm statistics and embeddings in FP32;
//   - each layer's attention as the config says: the flash kernels of attention/cuda (paper or
//     fused numerics, any policy, delta source, round_bits, tiles) on BF16 q, k, v, or the
//     materialized FP32 `standard` attention;
//   - the classifier and cross-entropy in row chunks: BF16 logits exist for one chunk at a time
//     and are replaced in place by their gradient, so FP32 logits are never materialized.
// Every reduction runs in a fixed order, and with `deterministic` the attention backward does
// too, so a step on the same weights and batch gives the same bits (bitwise resume).
//
// No CUDA types in this header. It exists in CUDA builds only (model/cuda/); the trainer reaches it
// through its CUDA engine (train/cuda_engine.cpp), which a CPU-only build replaces by a stub.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "stableflash/model/gpt2.hpp"

namespace stableflash::model {

class Gpt2Cuda {
 public:
  // Sized for micro-batches of up to `batch` sequences of `len` tokens. Throws
  // std::invalid_argument naming the layer for attention settings the kernels cannot run.
  Gpt2Cuda(const Gpt2Config& config, std::vector<LayerAttention> attention, int batch, int len, bool deterministic);
  ~Gpt2Cuda();
  Gpt2Cuda(const Gpt2Cuda&) = delete;
  Gpt2Cuda& operator=(const Gpt2Cuda&) = delete;

  const Gpt2Config& config() const;
  const std::vector<ParamTensor>& tensors() const;
  std::int64_t parameter_count() const;

  // The stream everything runs on (a cudaStream_t), and the cuBLASLt wrapper on it
  // (a stableflash::model::cuda::Blas), for the optimizer.
  void* stream() const;
  void* blas() const;

  // Device memory, flat in parameter_layout order: FP32 weights, their BF16 copy
  // (an __nv_bfloat16 array) and FP32 gradients.
  float* params();
  void* params_bf16();
  float* grads();

  // Host <-> device weights (synchronous); set_params also refreshes the BF16 copy.
  void set_params(std::span<const float> host);
  void get_params(std::span<float> host) const;
  void get_grads(std::span<float> host) const;

  void zero_grad();
  // Forward and backward of one micro-batch (tokens, targets: [batch, len] ids on the host),
  // adding d(loss_scale * mean loss)/d(params) into grads() and the mean loss into the loss sum.
  // Asynchronous: returns once the work is queued.
  void train_micro_batch(std::span<const int> tokens, std::span<const int> targets, int batch, int len, float loss_scale);
  // Forward only; adds the mean loss into the loss sum.
  void eval_micro_batch(std::span<const int> tokens, std::span<const int> targets, int batch, int len);
  // The sum of the mean losses since the last call (synchronizes), then resets it.
  double take_loss_sum();

  // Probes (attention_capture.hpp), as Gpt2::request_capture: the next train_micro_batch keeps
  // what `request` asks for (host copies queued on the stream); take_capture() waits for them and
  // hands them over. The kernels' counters come from a second forward of each flash layer into
  // scratch outputs: a counting run walks keys in numerics tiles, which would change a `fused`
  // layer's output under a policy that needs no tie count (attention/cuda.hpp).
  void request_capture(const CaptureRequest& request);
  Capture take_capture();

  // Called during train_micro_batch's backward, in stream order, each time a range of grads() has
  // its final value for this micro-batch: ln_f, then each layer from the last to the first, then
  // the embeddings (wte, wpe). Data-parallel training starts each range's all-reduce there, so
  // communication overlaps the rest of the backward. Empty: no calls.
  using GradientReady = std::function<void(std::int64_t offset, std::int64_t count)>;
  void set_gradient_ready(GradientReady hook);
  // Called during every forward, in stream order, before the first kernel that reads a range of
  // params()/params_bf16(): the embeddings (wte, wpe) before the encoder, then layer 0's range,
  // then at the end of each layer the next layer's range (before the LayerNorm that reads it
  // first), after the last ln_f's. The calls cover every parameter, in ascending order. ZeRO-1
  // makes the stream wait there for that range's all-gather, the one-GPU trainer for that range's
  // update on the optimizer's stream, so either overlaps the forward. Empty: no calls.
  using ParametersNeeded = GradientReady;
  void set_parameters_needed(ParametersNeeded hook);
  // Data parallel: the tied token embedding's gradient in two parts (optim/sharding.hpp, "Token
  // embedding split"). With `rows` set, the backward calls dense_ready() first, in stream order
  // after the classifier: from there on wte's gradient in grads() is final for this micro-batch
  // except for the embedding lookup's rows; and the lookup's backward writes those rows, for the
  // staged distinct ids u (staged_token_ids()), to rows[u C, (u + 1) C) instead of adding them to
  // grads() (the same FP32 sum per row; adding it afterwards gives the plain backward's bits).
  // rows: [batch len, C] FP32, owned by the caller. nullptr: the plain backward.
  void set_token_embedding_split(float* rows, std::function<void()> dense_ready);
  // The distinct token ids of the last staged micro-batch, ascending, on the host (valid until the
  // next-but-one staging) and on the device (until the next one).
  std::span<const int> staged_token_ids() const;
  const int* staged_token_ids_device() const;

  // CUDA graphs (model/cuda/stream_graph.hpp), off until turned on: train_micro_batch then replays
  // the forward and backward from a graph, one per (batch, len, loss_scale). The first micro-batch
  // of such a shape runs as usual, so that every first use (cuBLASLt's algorithm timing, kernel
  // attributes, module loading) is done; the second is recorded and replayed. The host's per-step
  // inputs reach a replay through device memory at fixed addresses: the staged batch (tokens,
  // targets, the rows grouped by token and their group count) is copied there before the launch.
  // Never recorded: a micro-batch with a capture requested (probes: host copies and a synchronous
  // counting forward) or with a hook set (data parallel, the overlapped optimizer: their host
  // callbacks queue work on other streams per layer), and eval_micro_batch. A recording that fails
  // turns the graphs off for good (graph_use().failure says why) and that micro-batch runs as usual.
  // A replay computes the same bits as the launches it recorded (tests/train_gpu/cuda_graph_gpu_test.cpp).
  void set_cuda_graph(bool on);
  struct GraphUse {
    bool on = false;                                     // set_cuda_graph(true) and no failure since
    std::int64_t captures = 0, replays = 0, eager = 0;   // train micro-batches since set_cuda_graph(true)
    std::string failure;                                 // why a recording failed (graphs then off)
  };
  GraphUse graph_use() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace stableflash::model
