// GPT-2 on the GPU (see gpt2_cuda.hpp): buffers, the forward and backward wiring of the layers,
// the chunked classifier and the batch staging. The math lives in layer_kernels.cu,
// standard_attention.cu, blas.cu and the attention kernels of attention/cuda.
#include "stableflash/model/gpt2_cuda.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <compare>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>

#include "stableflash/attention/attention.hpp"
#include "stableflash/attention/cuda.hpp"
#include "stableflash/model/cuda/blas.hpp"
#include "stableflash/model/cuda/device_array.hpp"
#include "stableflash/model/cuda/layer_kernels.hpp"
#include "stableflash/model/cuda/standard_attention.hpp"
#include "stableflash/model/cuda/stream_graph.hpp"
#include "stableflash/model/token_groups.hpp"

namespace stableflash::model {

using cuda::bf16_matrix;
using cuda::bf16_t;
using cuda::check_cuda;
using cuda::DeviceArray;
using cuda::f32_matrix;
using cuda::GemmOptions;
using Tr = cuda::Trans;

namespace {

// BF16 logits of at most this many bytes (and up to 127 rows of rounding) exist at a time: one
// chunk of rows of the classifier. GPT-2 124M at B 16 x T 1024 runs 4 chunks of 4,096 rows (412 MB,
// peak 8.30 GiB against the compiled PyTorch peer's 8.45): 0.1-0.2 ms a step faster than 7 chunks
// of 2,560 rows in two H200 calls, no difference in a third (docs/benchmarks.md).
constexpr std::int64_t kLogitsChunkBytes = std::int64_t(448) << 20;

// Rows per classifier chunk: the fewest chunks whose logits fit kLogitsChunkBytes, the rows split
// evenly between them and rounded up to a multiple of 128 (the products' tile), so no short last
// chunk runs the three products at low occupancy.
std::int64_t logits_chunk_rows(std::int64_t rows, std::int64_t padded_vocab) {
  const std::int64_t row_bytes = 2 * padded_vocab;
  const std::int64_t chunks = std::max<std::int64_t>(1, (rows * row_bytes + kLogitsChunkBytes - 1) / kLogitsChunkBytes);
  const std::int64_t even = (rows + chunks - 1) / chunks;
  return std::min(rows, (even + 127) / 128 * 128);
}

// Offsets of one layer's tensors in the flat parameter buffer (-1: absent bias).
struct LayerOffsets {
  std::int64_t ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fcproj_w, fcproj_b;
};

// A micro-batch on the host in one pinned block, copied to the device in one transfer: tokens and
// targets [N], then the rows grouped by token for the deterministic embedding backward
// (distinct ids [N], group offsets [N + 1], rows [N], the group count [1]). Everything a step
// reads that depends on its batch is here, in device memory: a step replayed from a CUDA graph
// sees no launch parameter change.
struct BatchLayout {
  std::int64_t n;
  std::int64_t ints() const { return 5 * n + 2; }
  std::int64_t tokens() const { return 0; }
  std::int64_t targets() const { return n; }
  std::int64_t ids() const { return 2 * n; }
  std::int64_t offsets() const { return 3 * n; }
  std::int64_t rows() const { return 4 * n + 1; }
  std::int64_t distinct() const { return 5 * n + 1; }
};

// What a recorded micro-batch baked in besides the fixed buffers: its shape and the loss scale
// (a launch parameter of the cross-entropy), compared by its bits.
struct GraphKey {
  int batch = 0, seq = 0;
  std::uint32_t loss_scale_bits = 0;
  auto operator<=>(const GraphKey&) const = default;
};

// Graphs kept at once: the trainer uses one shape; a caller alternating shapes (the benchmark's
// parts) needs a few. Past this many, all are dropped and recorded again as needed.
constexpr std::size_t kMaxGraphs = 4;

}  // namespace

struct Gpt2Cuda::Impl {
  Gpt2Config config;
  std::vector<LayerAttention> attention;
  std::vector<ParamTensor> tensors;
  int max_batch = 0, len = 0;
  bool deterministic = false;

  cudaStream_t stream = nullptr;
  std::unique_ptr<cuda::Blas> blas;

  DeviceArray<float> params, grads;  // [P]
  DeviceArray<bf16_t> params16;      // [P] BF16 copy read by the matmuls
  std::vector<LayerOffsets> offsets;
  std::int64_t wte = 0, wpe = 0, lnf_w = 0, lnf_b = -1;

  // Activations kept for the backward, per layer. N = batch * len rows, C features.
  struct Layer {
    DeviceArray<bf16_t> ln1;             // [N, C]
    DeviceArray<float> ln1_mean, ln1_rstd;  // [N]
    DeviceArray<bf16_t> qkv;             // [N, 3C] = [B, T, 3, H, D]: q, k, v column blocks (flash)
    DeviceArray<float> qkv32, probs;     // [N, 3C], [B, H, T, T] (standard)
    DeviceArray<bf16_t> atty;            // [N, C] attention output, heads concatenated
    DeviceArray<bf16_t> o_residual;      // [N, C] delta_source = compensated
    DeviceArray<float> lse;              // [B, H, T] (flash)
    DeviceArray<float> res2;             // [N, C] x + attention branch
    DeviceArray<bf16_t> ln2;             // [N, C]
    DeviceArray<float> ln2_mean, ln2_rstd;
    DeviceArray<bf16_t> fch;             // [N, 4C] the GELU's input (BF16, from the fc product's epilogue)
    DeviceArray<bf16_t> gelu;            // [N, 4C] the GELU's output: kept, since recomputing it in the
                                         // backward for W_fcproj's gradient cost 60 us per layer on the H200
    DeviceArray<float> res3;             // [N, C] block output
  };
  std::vector<Layer> layers;
  DeviceArray<float> x0;                     // [N, C] embeddings
  DeviceArray<bf16_t> branch;                // [N, C] a projection's output before its residual add
  DeviceArray<bf16_t> lnf;                   // [N, C]
  DeviceArray<float> lnf_mean, lnf_rstd;     // [N]
  DeviceArray<bf16_t> logits;                // [chunk_rows, Vp]
  std::int64_t chunk_rows = 0;
  DeviceArray<float> losses;                 // [N]
  DeviceArray<float> loss_sum;               // [1]
  // Backward.
  DeviceArray<float> d_res;                  // [N, C] d loss / d residual stream
  DeviceArray<bf16_t> d_res16;               // [N, C] its BF16 rounding (what a BF16 branch output receives)
  DeviceArray<bf16_t> d_ln;                  // [N, C] d loss / d LayerNorm output: a BF16 product's output, as
                                             // under PyTorch autocast (and the CPU model's emulation of it)
  DeviceArray<bf16_t> d_big;                 // [N, 4C]
  DeviceArray<bf16_t> d_atty;                // [N, C]
  DeviceArray<bf16_t> d_qkv;                 // [N, 3C] dq, dk, dv column blocks
  DeviceArray<float> scratch;                // deterministic reductions
  DeviceArray<char> attention_workspace;     // the flash backward's dQ accumulator and delta (one layer at a time)
  // Standard attention layers only.
  DeviceArray<float> o32, d_atty32, d_qkv32, d_probs;  // d_qkv32 [N, 3C]

  // Batch staging: two pinned host blocks, so the host fills one while the other's copy is queued.
  DeviceArray<int> batch_dev;
  struct Slot {
    int* pinned = nullptr;
    cudaEvent_t copied = nullptr;
  } slots[2];
  int next_slot = 0;
  std::vector<int> token_starts;  // [Vp + 1] the counting sort's bucket starts (host scratch)
  int distinct = 0;               // distinct token ids of the staged micro-batch (the host's copy of bl.distinct())
  GradientReady gradient_ready;
  ParametersNeeded parameters_needed;
  float* embedding_rows = nullptr;        // the token embedding split's lookup rows [N, C], or none
  std::function<void()> embedding_dense_ready;
  float* loss_host = nullptr;  // pinned

  // Probes (request_capture): allocated on the first probe step that needs them.
  CaptureRequest capture_request;
  bool capturing = false;  // during the train_micro_batch after request_capture (never an eval forward)
  Capture capture;
  std::vector<std::vector<bf16>> capture_x16;          // [capture] ln_1's BF16 output, widened in take_capture
  std::vector<DeviceArray<bf16_t>> probe_residual;     // [layer] O's rounding error where delta_source is not compensated
  DeviceArray<bf16_t> count_o, count_residual;         // the counting forward's scratch outputs
  DeviceArray<float> count_lse;
  LayerCapture* captured(int l) {
    if (!capturing) return nullptr;
    for (auto& c : capture.layers)
      if (c.layer == l) return &c;
    return nullptr;
  }
  void begin_capture(int batch, int seq);

  // CUDA graphs of train micro-batches (set_cuda_graph).
  bool graphs_on = false;
  std::map<GraphKey, cuda::StreamGraph> graphs;
  std::set<GraphKey> ran_once;  // shapes run without recording: their first uses are done
  GraphUse graph_use;
  bool replay(const GraphKey& key, float loss_scale);
  void count_ties(int l, const attention::ForwardArgs& trained);
  void capture_forward(int l, LayerCapture& c, int seq);

  std::int64_t n_max() const { return std::int64_t(max_batch) * len; }
  float* param(std::int64_t off) { return params.get() + off; }
  bf16_t* param16(std::int64_t off) { return off < 0 ? nullptr : params16.get() + off; }
  float* grad(std::int64_t off) { return off < 0 ? nullptr : grads.get() + off; }
  const float* param_or_null(std::int64_t off) { return off < 0 ? nullptr : params.get() + off; }

  attention::AttentionOptions flash_options(int l) const {
    attention::AttentionOptions o = attention[l].options;
    o.device = attention::Device::cuda;
    o.causal = true;
    o.deterministic = deterministic;
    o.cuda_stream = stream;
    return o;
  }
  bool is_flash(int l) const { return attention[l].kind == AttentionKind::flash; }
  // q, k, v (and dq, dk, dv) as column blocks of an [N, 3C] = [B, T, 3, H, D] buffer: token stride
  // 3C, head stride D.
  attention::HeadStrides qkv_strides(int seq) const {
    const std::int64_t C3 = 3 * std::int64_t(config.n_embd);
    return {.b = seq * C3, .h = config.head_dim(), .t = C3};
  }

  void allocate();
  void stage(std::span<const int> tokens, std::span<const int> targets, int batch, int seq);
  void forward(int batch, int seq);
  void classifier(int batch, int seq, float loss_scale, bool backward);
  void backward(int batch, int seq);
  // What a train micro-batch queues after staging: the work a graph records.
  void forward_backward(int batch, int seq, float loss_scale) {
    forward(batch, seq);
    classifier(batch, seq, loss_scale, /*backward=*/true);
    backward(batch, seq);
  }
  void linear(bf16_t* out, const bf16_t* x, std::int64_t w, std::int64_t b, std::int64_t n, int in, int out_features);
  void linear_backward(float* dx_f32, bf16_t* dx_bf16, const bf16_t* dy, const bf16_t* x, std::int64_t w, std::int64_t b,
                       std::int64_t n, int in, int out_features, const GemmOptions& dx_options = {});
};

Gpt2Cuda::Gpt2Cuda(const Gpt2Config& config, std::vector<LayerAttention> attention, int batch, int len, bool deterministic)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  config.validate();
  m.config = config;
  m.attention = std::move(attention);
  m.tensors = parameter_layout(config);
  m.max_batch = batch, m.len = len, m.deterministic = deterministic;
  if (int(m.attention.size()) != config.n_layer)
    throw std::invalid_argument("model: " + std::to_string(m.attention.size()) + " attention settings for " +
                                std::to_string(config.n_layer) + " layers");
  if (batch < 1 || len < 1 || len > config.block_size)
    throw std::invalid_argument("CUDA model: batch must be >= 1 and the sequence length in [1, block_size = " +
                                std::to_string(config.block_size) + "]");
  for (int l = 0; l < config.n_layer; ++l) {
    if (!m.is_flash(l)) continue;
    if (m.attention[l].options.numerics == attention::Numerics::reference)
      throw std::invalid_argument("attention.layer." + std::to_string(l) + ".numerics: `reference` is an FP64 oracle, not a training path");
    try {
      attention::cuda::check_supported(attention::AttentionShape{batch, config.n_head, len, len, config.head_dim()}, m.flash_options(l));
    } catch (const std::exception& e) {
      throw std::invalid_argument("attention.layer." + std::to_string(l) + " on the GPU: " + e.what());
    }
  }
  // One priority level above the device's lowest: an optimizer step overlapping the next forward
  // on a lowest-priority stream (train/update_overlap.hpp) fills the forward's gaps instead of
  // delaying its kernels; NCCL's stream (the highest) still goes first.
  int least = 0, greatest = 0;
  check_cuda(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
  check_cuda(cudaStreamCreateWithPriority(&m.stream, cudaStreamNonBlocking, greatest < least ? least - 1 : least), "cudaStreamCreate");
  // Products tuned by timing at their first use, except where runs must repeat bit for bit.
  m.blas = std::make_unique<cuda::Blas>(m.stream, /*tune=*/!deterministic);
  auto offset_of = [&](const std::string& name) -> std::int64_t {
    for (const auto& t : m.tensors)
      if (t.name == name) return t.offset;
    return -1;
  };
  m.wte = offset_of("transformer.wte.weight"), m.wpe = offset_of("transformer.wpe.weight");
  m.lnf_w = offset_of("transformer.ln_f.weight"), m.lnf_b = offset_of("transformer.ln_f.bias");
  for (int l = 0; l < config.n_layer; ++l) {
    const std::string p = "transformer.h." + std::to_string(l) + ".";
    m.offsets.push_back({offset_of(p + "ln_1.weight"), offset_of(p + "ln_1.bias"), offset_of(p + "attn.c_attn.weight"),
                         offset_of(p + "attn.c_attn.bias"), offset_of(p + "attn.c_proj.weight"), offset_of(p + "attn.c_proj.bias"),
                         offset_of(p + "ln_2.weight"), offset_of(p + "ln_2.bias"), offset_of(p + "mlp.c_fc.weight"),
                         offset_of(p + "mlp.c_fc.bias"), offset_of(p + "mlp.c_proj.weight"), offset_of(p + "mlp.c_proj.bias")});
  }
  m.allocate();
}

Gpt2Cuda::~Gpt2Cuda() {
  if (!impl_) return;
  Impl& m = *impl_;
  if (m.stream) cudaStreamSynchronize(m.stream);
  for (auto& s : m.slots) {
    if (s.copied) cudaEventDestroy(s.copied);
    if (s.pinned) cudaFreeHost(s.pinned);
  }
  if (m.loss_host) cudaFreeHost(m.loss_host);
  m.blas.reset();
  if (m.stream) cudaStreamDestroy(m.stream);
}

void Gpt2Cuda::Impl::allocate() {
  const std::int64_t P = tensors.back().offset + tensors.back().size;
  const std::int64_t N = n_max(), C = config.n_embd, Vp = config.padded_vocab_size;
  const std::int64_t NC = N * C, heads_rows = std::int64_t(max_batch) * config.n_head * len;
  const std::int64_t probs_size = heads_rows * len;
  params = DeviceArray<float>(std::size_t(P));
  grads = DeviceArray<float>(std::size_t(P));
  params16 = DeviceArray<bf16_t>(std::size_t(P));
  params.zero(stream), grads.zero(stream), params16.zero(stream);
  bool any_standard = false;
  layers.resize(std::size_t(config.n_layer));
  for (int l = 0; l < config.n_layer; ++l) {
    Layer& L = layers[std::size_t(l)];
    L.ln1 = DeviceArray<bf16_t>(std::size_t(NC));
    L.ln1_mean = DeviceArray<float>(std::size_t(N)), L.ln1_rstd = DeviceArray<float>(std::size_t(N));
    if (is_flash(l)) {
      L.qkv = DeviceArray<bf16_t>(std::size_t(3 * NC));
      L.lse = DeviceArray<float>(std::size_t(heads_rows));
      if (attention[l].options.needs_residual({max_batch, config.n_head, len, len, config.head_dim()}))
        L.o_residual = DeviceArray<bf16_t>(std::size_t(NC));
    } else {
      any_standard = true;
      L.qkv32 = DeviceArray<float>(std::size_t(3 * NC));
      L.probs = DeviceArray<float>(std::size_t(probs_size));
    }
    L.atty = DeviceArray<bf16_t>(std::size_t(NC));
    L.res2 = DeviceArray<float>(std::size_t(NC));
    L.ln2 = DeviceArray<bf16_t>(std::size_t(NC));
    L.ln2_mean = DeviceArray<float>(std::size_t(N)), L.ln2_rstd = DeviceArray<float>(std::size_t(N));
    L.fch = DeviceArray<bf16_t>(std::size_t(4 * NC));
    L.gelu = DeviceArray<bf16_t>(std::size_t(4 * NC));
    L.res3 = DeviceArray<float>(std::size_t(NC));
  }
  x0 = DeviceArray<float>(std::size_t(NC));
  branch = DeviceArray<bf16_t>(std::size_t(NC));
  lnf = DeviceArray<bf16_t>(std::size_t(NC));
  lnf_mean = DeviceArray<float>(std::size_t(N)), lnf_rstd = DeviceArray<float>(std::size_t(N));
  chunk_rows = logits_chunk_rows(N, Vp);
  logits = DeviceArray<bf16_t>(std::size_t(chunk_rows * Vp));
  losses = DeviceArray<float>(std::size_t(N));
  loss_sum = DeviceArray<float>(1);
  loss_sum.zero(stream);
  d_res = DeviceArray<float>(std::size_t(NC));
  d_res16 = DeviceArray<bf16_t>(std::size_t(NC));
  d_ln = DeviceArray<bf16_t>(std::size_t(NC));
  d_big = DeviceArray<bf16_t>(std::size_t(4 * NC));
  d_atty = DeviceArray<bf16_t>(std::size_t(NC));
  d_qkv = DeviceArray<bf16_t>(std::size_t(3 * NC));
  scratch = DeviceArray<float>(std::size_t(cuda::reduction_scratch_floats(int(N), int(4 * C))));
  // The flash backward's scratch, allocated once for the largest micro-batch rather than from the
  // stream-ordered pool per call: an allocation may not sit inside a recorded graph.
  std::size_t workspace_bytes = 0;
  for (int l = 0; l < config.n_layer; ++l) {
    if (!is_flash(l)) continue;
    attention::BackwardArgs a;
    a.shape = {max_batch, config.n_head, len, len, config.head_dim()};
    a.layout = attention::Layout::bthd;
    workspace_bytes = std::max(workspace_bytes, attention::cuda::backward_workspace_bytes(a, flash_options(l)));
  }
  attention_workspace = DeviceArray<char>(workspace_bytes);
  if (any_standard) {
    o32 = DeviceArray<float>(std::size_t(NC));
    d_atty32 = DeviceArray<float>(std::size_t(NC));
    d_qkv32 = DeviceArray<float>(std::size_t(3 * NC));
    d_probs = DeviceArray<float>(std::size_t(probs_size));
  }
  const BatchLayout bl{N};
  batch_dev = DeviceArray<int>(std::size_t(bl.ints()));
  for (auto& s : slots) {
    check_cuda(cudaMallocHost(&s.pinned, std::size_t(bl.ints()) * sizeof(int)), "cudaMallocHost");
    check_cuda(cudaEventCreateWithFlags(&s.copied, cudaEventDisableTiming), "cudaEventCreate");
  }
  check_cuda(cudaMallocHost(&loss_host, sizeof(float)), "cudaMallocHost");
}

const Gpt2Config& Gpt2Cuda::config() const { return impl_->config; }
const std::vector<ParamTensor>& Gpt2Cuda::tensors() const { return impl_->tensors; }
std::int64_t Gpt2Cuda::parameter_count() const { return std::int64_t(impl_->params.size()); }
void* Gpt2Cuda::stream() const { return impl_->stream; }
void* Gpt2Cuda::blas() const { return impl_->blas.get(); }
float* Gpt2Cuda::params() { return impl_->params.get(); }
void* Gpt2Cuda::params_bf16() { return impl_->params16.get(); }
float* Gpt2Cuda::grads() { return impl_->grads.get(); }

void Gpt2Cuda::set_params(std::span<const float> host) {
  Impl& m = *impl_;
  if (host.size() != m.params.size())
    throw std::invalid_argument("set_params: " + std::to_string(host.size()) + " values for " + std::to_string(m.params.size()) + " parameters");
  m.params.upload(host.data(), host.size(), m.stream);
  cuda::cast_to_bf16(m.params16.get(), m.params.get(), std::int64_t(host.size()), m.stream);
  check_cuda(cudaStreamSynchronize(m.stream), "cudaStreamSynchronize (set_params)");
}

void Gpt2Cuda::get_params(std::span<float> host) const {
  const Impl& m = *impl_;
  if (host.size() != m.params.size()) throw std::invalid_argument("get_params: wrong size");
  m.params.download(host.data(), host.size(), m.stream);
  check_cuda(cudaStreamSynchronize(m.stream), "cudaStreamSynchronize (get_params)");
}

void Gpt2Cuda::get_grads(std::span<float> host) const {
  const Impl& m = *impl_;
  if (host.size() != m.grads.size()) throw std::invalid_argument("get_grads: wrong size");
  m.grads.download(host.data(), host.size(), m.stream);
  check_cuda(cudaStreamSynchronize(m.stream), "cudaStreamSynchronize (get_grads)");
}

void Gpt2Cuda::zero_grad() { impl_->grads.zero(impl_->stream); }

void Gpt2Cuda::set_gradient_ready(GradientReady hook) { impl_->gradient_ready = std::move(hook); }
void Gpt2Cuda::set_parameters_needed(ParametersNeeded hook) { impl_->parameters_needed = std::move(hook); }
void Gpt2Cuda::set_token_embedding_split(float* rows, std::function<void()> dense_ready) {
  impl_->embedding_rows = rows;
  impl_->embedding_dense_ready = std::move(dense_ready);
}
std::span<const int> Gpt2Cuda::staged_token_ids() const {
  const Impl& m = *impl_;
  return {m.slots[m.next_slot ^ 1].pinned + BatchLayout{m.n_max()}.ids(), std::size_t(m.distinct)};
}
const int* Gpt2Cuda::staged_token_ids_device() const { return impl_->batch_dev.get() + BatchLayout{impl_->n_max()}.ids(); }

// Copies a micro-batch to the device, with the rows of each token id grouped (ascending) for the
// embedding backward: a counting sort (token_groups.hpp), the order std::stable_sort gave, in
// 0.04 ms instead of 0.6-0.9: host time between the update's launch and the next forward's
// launches, which the GPU would wait for once the update overlaps the forward.
void Gpt2Cuda::Impl::stage(std::span<const int> tokens, std::span<const int> targets, int batch, int seq) {
  const std::int64_t N = std::int64_t(batch) * seq;
  if (batch < 1 || batch > max_batch || seq < 1 || seq > len)
    throw std::invalid_argument("CUDA model: micro-batch of " + std::to_string(batch) + " x " + std::to_string(seq) +
                                " outside the allocated " + std::to_string(max_batch) + " x " + std::to_string(len));
  if (std::int64_t(tokens.size()) != N || std::int64_t(targets.size()) != N)
    throw std::invalid_argument("CUDA model: tokens/targets do not hold batch * len ids");
  const int Vp = config.padded_vocab_size;
  for (int t : tokens)
    if (t < 0 || t >= Vp) throw std::out_of_range("forward: token id " + std::to_string(t) + " outside [0, " + std::to_string(Vp) + ")");
  for (int t : targets)
    if (t < 0 || t >= Vp) throw std::out_of_range("forward: target id " + std::to_string(t) + " outside [0, " + std::to_string(Vp) + ")");
  Slot& slot = slots[next_slot];
  next_slot ^= 1;
  check_cuda(cudaEventSynchronize(slot.copied), "cudaEventSynchronize (batch staging)");
  const BatchLayout bl{n_max()};
  int* h = slot.pinned;
  std::copy(tokens.begin(), tokens.end(), h + bl.tokens());
  std::copy(targets.begin(), targets.end(), h + bl.targets());
  distinct = h[bl.distinct()] = group_rows_by_token(tokens, Vp, h + bl.ids(), h + bl.offsets(), h + bl.rows(), token_starts);
  check_cuda(cudaMemcpyAsync(batch_dev.get(), h, std::size_t(bl.ints()) * sizeof(int), cudaMemcpyHostToDevice, stream),
             "cudaMemcpyAsync (batch)");
  check_cuda(cudaEventRecord(slot.copied, stream), "cudaEventRecord");
}

void Gpt2Cuda::Impl::linear(bf16_t* out, const bf16_t* x, std::int64_t w, std::int64_t b, std::int64_t n, int in, int out_features) {
  GemmOptions o;
  o.bias = param16(b);
  blas->gemm(Tr::no, Tr::no, bf16_matrix(x, int(n), in), bf16_matrix(param16(w), in, out_features), bf16_matrix(out, int(n), out_features), o);
}

// y [n, out] = x [n, in] W [in, out] (+ b): dW += x^T dy, db += colsum(dy), dx = dy W^T into an
// FP32 or a BF16 buffer (one of dx_f32, dx_bf16), with dx_options' epilogue.
void Gpt2Cuda::Impl::linear_backward(float* dx_f32, bf16_t* dx_bf16, const bf16_t* dy, const bf16_t* x, std::int64_t w,
                                     std::int64_t b, std::int64_t n, int in, int out_features, const GemmOptions& dx_options) {
  GemmOptions accumulate;
  accumulate.beta = 1.0f;
  blas->gemm(Tr::yes, Tr::no, bf16_matrix(x, int(n), in), bf16_matrix(dy, int(n), out_features), f32_matrix(grad(w), in, out_features), accumulate);
  if (b >= 0) cuda::bias_backward(grad(b), dy, int(n), out_features, scratch.get(), stream);
  const auto dx = dx_f32 ? f32_matrix(dx_f32, int(n), in) : bf16_matrix(dx_bf16, int(n), in);
  blas->gemm(Tr::no, Tr::yes, bf16_matrix(dy, int(n), out_features), bf16_matrix(param16(w), in, out_features), dx, dx_options);
}

void Gpt2Cuda::Impl::forward(int batch, int seq) {
  const int C = config.n_embd, H = config.n_head, D = config.head_dim();
  const std::int64_t N = std::int64_t(batch) * seq, NC = N * C;
  const float eps = float(config.layernorm_eps);
  const BatchLayout bl{n_max()};
  const int* tokens = batch_dev.get() + bl.tokens();
  // Layer l's range ends where the next begins ([wte, wpe, layer 0, ..., layer L-1, ln_f]).
  auto layer_end = [&](int l) { return l + 1 == config.n_layer ? lnf_w : offsets[std::size_t(l) + 1].ln1_w; };
  // The embeddings' range (wte, wpe: everything before layer 0), then layer 0's.
  if (parameters_needed) parameters_needed(0, offsets[0].ln1_w);
  cuda::encoder_forward(x0.get(), tokens, param(wte), param(wpe), batch, seq, C, stream);
  if (parameters_needed) parameters_needed(offsets[0].ln1_w, layer_end(0) - offsets[0].ln1_w);
  cuda::layernorm_forward(layers[0].ln1.get(), layers[0].ln1_mean.get(), layers[0].ln1_rstd.get(), nullptr, x0.get(), nullptr,
                          param(offsets[0].ln1_w), param_or_null(offsets[0].ln1_b), int(N), C, eps, stream);
  for (int l = 0; l < config.n_layer; ++l) {
    Layer& L = layers[std::size_t(l)];
    const LayerOffsets& o = offsets[std::size_t(l)];
    const float* x = l == 0 ? x0.get() : layers[std::size_t(l) - 1].res3.get();
    // qkv [N, 3C] = ln1 [N, C] W_qkv [C, 3C] (+ b) in one product; q, k, v are its column blocks,
    // which the attention reads through strides (qkv_strides).
    if (is_flash(l)) {
      linear(L.qkv.get(), L.ln1.get(), o.qkv_w, o.qkv_b, N, C, 3 * C);
    } else {
      GemmOptions opt;
      opt.bias = o.qkv_b < 0 ? nullptr : param(o.qkv_b);
      blas->gemm(Tr::no, Tr::no, bf16_matrix(L.ln1.get(), int(N), C), bf16_matrix(param16(o.qkv_w), C, 3 * C),
                 f32_matrix(L.qkv32.get(), int(N), 3 * C), opt);
    }
    if (is_flash(l)) {
      attention::ForwardArgs a;
      a.shape = {batch, H, seq, seq, D};
      a.layout = attention::Layout::bthd;
      a.q = reinterpret_cast<const bf16*>(L.qkv.get());
      a.k = a.q + C, a.v = a.q + 2 * C;
      a.strides.q = a.strides.k = a.strides.v = qkv_strides(seq);
      a.o = reinterpret_cast<bf16*>(L.atty.get());
      a.lse = L.lse.get();
      a.o_residual = L.o_residual.empty() ? nullptr : reinterpret_cast<bf16*>(L.o_residual.get());
      LayerCapture* cap = captured(l);
      if (cap && !a.o_residual) {  // written beside O (same accumulator, O's bits unchanged), read by the probes only
        auto& r = probe_residual[std::size_t(l)];
        if (r.empty()) r = DeviceArray<bf16_t>(std::size_t(n_max() * C));
        a.o_residual = reinterpret_cast<bf16*>(r.get());
      }
      attention::attention_forward(a, flash_options(l));
      if (capturing && capture_request.count_ties) count_ties(l, a);
      if (cap) capture_forward(l, *cap, seq);
    } else {
      cuda::standard_attention_forward(*blas, {batch, H, seq, D, 3 * C}, L.qkv32.get(), L.qkv32.get() + C, L.qkv32.get() + 2 * C,
                                       L.probs.get(), o32.get());
      cuda::cast_to_bf16(L.atty.get(), o32.get(), NC, stream);
    }
    linear(branch.get(), L.atty.get(), o.proj_w, o.proj_b, N, C, C);
    cuda::layernorm_forward(L.ln2.get(), L.ln2_mean.get(), L.ln2_rstd.get(), L.res2.get(), x, branch.get(), param(o.ln2_w),
                            param_or_null(o.ln2_b), int(N), C, eps, stream);
    {  // gelu = GELU(ln2 W_fc + b) in the product's epilogue, which also keeps its input in fch
      GemmOptions fused;
      fused.bias = param16(o.fc_b);
      fused.epilogue = cuda::Epilogue::gelu;
      fused.aux = L.fch.get();
      blas->gemm(Tr::no, Tr::no, bf16_matrix(L.ln2.get(), int(N), C), bf16_matrix(param16(o.fc_w), C, 4 * C),
                 bf16_matrix(L.gelu.get(), int(N), 4 * C), fused);
    }
    linear(branch.get(), L.gelu.get(), o.fcproj_w, o.fcproj_b, N, 4 * C, C);
    // res3 = res2 + MLP branch, normalized by the next layer's ln_1 (or ln_f after the last).
    const bool last = l + 1 == config.n_layer;
    Layer* next = last ? nullptr : &layers[std::size_t(l) + 1];
    const std::int64_t w = last ? lnf_w : offsets[std::size_t(l) + 1].ln1_w;
    const std::int64_t b = last ? lnf_b : offsets[std::size_t(l) + 1].ln1_b;
    if (parameters_needed) {  // the next layer's range (or ln_f's): its LayerNorm is the first reader
      const std::int64_t next_end = last ? std::int64_t(params.size()) : layer_end(l + 1);
      parameters_needed(layer_end(l), next_end - layer_end(l));
    }
    cuda::layernorm_forward(last ? lnf.get() : next->ln1.get(), last ? lnf_mean.get() : next->ln1_mean.get(),
                            last ? lnf_rstd.get() : next->ln1_rstd.get(), L.res3.get(), L.res2.get(), branch.get(), param(w),
                            param_or_null(b), int(N), C, eps, stream);
  }
}

// Tied head and cross-entropy, one chunk of rows at a time: logits [rows, Vp] = lnf wte^T in BF16,
// replaced in place by their gradient, which gives d lnf (into d_ln) and d wte before the next chunk.
void Gpt2Cuda::Impl::classifier(int batch, int seq, float loss_scale, bool backward) {
  const int C = config.n_embd, Vp = config.padded_vocab_size;
  const std::int64_t N = std::int64_t(batch) * seq;
  const BatchLayout bl{n_max()};
  const int* targets = batch_dev.get() + bl.targets();
  GemmOptions accumulate;
  accumulate.beta = 1.0f;
  for (std::int64_t r0 = 0; r0 < N; r0 += chunk_rows) {
    const int rows = int(std::min(chunk_rows, N - r0));
    const auto x = bf16_matrix(lnf.get() + r0 * C, rows, C);
    const auto logit = bf16_matrix(logits.get(), rows, Vp);
    blas->gemm(Tr::no, Tr::yes, x, bf16_matrix(param16(wte), Vp, C), logit);
    cuda::softmax_cross_entropy(logits.get(), losses.get() + r0, targets + r0, rows, Vp, backward ? loss_scale / float(N) : 0.0f, stream);
    if (!backward) continue;
    blas->gemm(Tr::no, Tr::no, logit, bf16_matrix(param16(wte), Vp, C), bf16_matrix(d_ln.get() + r0 * C, rows, C));
    blas->gemm(Tr::yes, Tr::no, logit, x, f32_matrix(grad(wte), Vp, C), accumulate);
  }
  cuda::sum_scaled(loss_sum.get(), losses.get(), N, 1.0f / float(N), /*accumulate=*/true, stream);
}

void Gpt2Cuda::Impl::backward(int batch, int seq) {
  const int C = config.n_embd, H = config.n_head, D = config.head_dim();
  const std::int64_t N = std::int64_t(batch) * seq, NC = N * C;
  const BatchLayout bl{n_max()};
  // wte's classifier part is queued (classifier()): the data-parallel trainer may reduce it now.
  if (embedding_rows && embedding_dense_ready) embedding_dense_ready();
  d_res.zero(stream);
  cuda::layernorm_backward(d_res.get(), d_res16.get(), grad(lnf_w), grad(lnf_b), d_ln.get(), layers.back().res3.get(), param(lnf_w),
                           lnf_mean.get(), lnf_rstd.get(), int(N), C, scratch.get(), stream);
  // The flat layout is [wte, wpe, layer 0, ..., layer L-1, ln_f]: each range below is contiguous.
  const std::int64_t total = std::int64_t(params.size());
  if (gradient_ready) gradient_ready(lnf_w, total - lnf_w);
  // d_res holds d loss / d (block output); the residual adds pass it through unchanged.
  for (int l = config.n_layer - 1; l >= 0; --l) {
    Layer& L = layers[std::size_t(l)];
    const LayerOffsets& o = offsets[std::size_t(l)];
    const float* x = l == 0 ? x0.get() : layers[std::size_t(l) - 1].res3.get();
    // MLP: res3 = res2 + gelu(ln2 W_fc) W_fcproj
    // d fch = (d_res W_fcproj^T) * GELU'(fch), the GELU backward in the product's epilogue
    GemmOptions through_gelu;
    through_gelu.epilogue = cuda::Epilogue::dgelu;
    through_gelu.aux = L.fch.get();
    linear_backward(nullptr, d_big.get(), d_res16.get(), L.gelu.get(), o.fcproj_w, o.fcproj_b, N, 4 * C, C, through_gelu);
    linear_backward(nullptr, d_ln.get(), d_big.get(), L.ln2.get(), o.fc_w, o.fc_b, N, C, 4 * C);
    cuda::layernorm_backward(d_res.get(), d_res16.get(), grad(o.ln2_w), grad(o.ln2_b), d_ln.get(), L.res2.get(), param(o.ln2_w),
                             L.ln2_mean.get(), L.ln2_rstd.get(), int(N), C, scratch.get(), stream);
    // Attention: res2 = x + attn(ln1 W_qkv) W_proj
    if (is_flash(l)) {
      linear_backward(nullptr, d_atty.get(), d_res16.get(), L.atty.get(), o.proj_w, o.proj_b, N, C, C);
      attention::BackwardArgs a;
      a.shape = {batch, H, seq, seq, D};
      a.layout = attention::Layout::bthd;
      a.q = reinterpret_cast<const bf16*>(L.qkv.get());
      a.k = a.q + C, a.v = a.q + 2 * C;
      a.o = reinterpret_cast<const bf16*>(L.atty.get());
      a.lse = L.lse.get();
      a.o_residual = L.o_residual.empty() ? nullptr : reinterpret_cast<const bf16*>(L.o_residual.get());
      a.d_o = reinterpret_cast<const bf16*>(d_atty.get());
      a.dq = reinterpret_cast<bf16*>(d_qkv.get());
      a.dk = a.dq + C, a.dv = a.dq + 2 * C;
      a.strides.q = a.strides.k = a.strides.v = a.strides.dq = a.strides.dk = a.strides.dv = qkv_strides(seq);
      a.workspace = attention_workspace.get(), a.workspace_bytes = attention_workspace.bytes();
      attention::attention_backward(a, flash_options(l));
      if (LayerCapture* cap = captured(l)) {
        cap->d_o.resize(cap->q.size());
        check_cuda(cudaMemcpyAsync(cap->d_o.data(), d_atty.get(), cap->d_o.size() * sizeof(bf16), cudaMemcpyDeviceToHost, stream),
                   "cudaMemcpyAsync (probe dO)");
      }
    } else {
      linear_backward(d_atty32.get(), nullptr, d_res16.get(), L.atty.get(), o.proj_w, o.proj_b, N, C, C);
      const float* q = L.qkv32.get();
      cuda::standard_attention_backward(*blas, {batch, H, seq, D, 3 * C}, q, q + C, q + 2 * C, L.probs.get(), d_atty32.get(),
                                        d_probs.get(), d_qkv32.get(), d_qkv32.get() + C, d_qkv32.get() + 2 * C);
      cuda::cast_to_bf16(d_qkv.get(), d_qkv32.get(), 3 * NC, stream);
    }
    // dW_qkv += ln1^T d_qkv, d ln1 = d_qkv W_qkv^T: one product each over the [N, 3C] gradient.
    linear_backward(nullptr, d_ln.get(), d_qkv.get(), L.ln1.get(), o.qkv_w, o.qkv_b, N, C, 3 * C);
    cuda::layernorm_backward(d_res.get(), l == 0 ? nullptr : d_res16.get(), grad(o.ln1_w), grad(o.ln1_b), d_ln.get(), x,
                             param(o.ln1_w), L.ln1_mean.get(), L.ln1_rstd.get(), int(N), C, scratch.get(), stream);
    const std::int64_t end = l + 1 == config.n_layer ? lnf_w : offsets[std::size_t(l) + 1].ln1_w;
    if (gradient_ready) gradient_ready(o.ln1_w, end - o.ln1_w);
  }
  if (embedding_rows) {  // wpe as always, wte's lookup rows apart (set_token_embedding_split; never in a CUDA graph)
    cuda::encoder_backward(nullptr, grad(wpe), d_res.get(), nullptr, nullptr, nullptr, nullptr, batch, seq, C, stream);
    cuda::embedding_rows_backward(embedding_rows, d_res.get(), batch_dev.get() + bl.offsets(), batch_dev.get() + bl.rows(), distinct, C,
                                  stream);
  } else {
    cuda::encoder_backward(grad(wte), grad(wpe), d_res.get(), batch_dev.get() + bl.ids(), batch_dev.get() + bl.offsets(),
                           batch_dev.get() + bl.rows(), batch_dev.get() + bl.distinct(), batch, seq, C, stream);
  }
  if (gradient_ready) gradient_ready(0, offsets[0].ln1_w);
}

static_assert(sizeof(bf16) == sizeof(bf16_t), "host and device BF16 share their bits");

void Gpt2Cuda::Impl::begin_capture(int batch, int seq) {
  capture = {};
  capture_x16.clear();
  probe_residual.resize(std::size_t(config.n_layer));
  capture.head_ties.assign(capture_request.count_ties ? std::size_t(config.n_layer) : 0, {});
  for (int l : capture_request.layers) {
    if (l < 0 || l >= config.n_layer || !is_flash(l)) continue;
    LayerCapture c;
    c.layer = l;
    c.options = attention[std::size_t(l)].options;
    c.options.causal = true;
    c.shape = {std::min(capture_request.sequences, batch), config.n_head, seq, seq, config.head_dim()};
    capture.layers.push_back(std::move(c));
  }
  capture_x16.resize(capture.layers.size());
}

// A second forward of layer l's attention with the event counters on, into scratch outputs: the
// training outputs stay those of the uncounted walk.
void Gpt2Cuda::Impl::count_ties(int l, const attention::ForwardArgs& trained) {
  const std::size_t nc = std::size_t(n_max() * config.n_embd);
  if (count_o.empty()) {
    count_o = DeviceArray<bf16_t>(nc), count_residual = DeviceArray<bf16_t>(nc);
    count_lse = DeviceArray<float>(std::size_t(max_batch) * config.n_head * len);
  }
  attention::ForwardArgs c = trained;
  c.o = reinterpret_cast<bf16*>(count_o.get());
  c.lse = count_lse.get();
  c.o_residual = trained.o_residual ? reinterpret_cast<bf16*>(count_residual.get()) : nullptr;
  auto& heads = capture.head_ties[std::size_t(l)];
  heads.assign(std::size_t(config.n_head), {});
  c.head_ties = heads.data();
  attention::attention_forward(c, flash_options(l));  // copies the counters back synchronously
}

// Host copies of the leading sequences of layer l's attention inputs and outputs, queued on the
// stream (take_capture waits for them). [B, T, H, D] and [B, H, T] both start with sequence 0.
void Gpt2Cuda::Impl::capture_forward(int l, LayerCapture& c, int seq) {
  Layer& L = layers[std::size_t(l)];
  const std::int64_t C = config.n_embd, NC = std::int64_t(c.shape.batch) * seq * C;
  auto get = [&](std::vector<bf16>& out, const void* src, std::size_t n, const char* what) {
    out.resize(n);
    check_cuda(cudaMemcpyAsync(out.data(), src, n * sizeof(bf16), cudaMemcpyDeviceToHost, stream), what);
  };
  // q, k, v: the column blocks of the [N, 3C] product, C of every 3C values per token.
  auto get_block = [&](std::vector<bf16>& out, int j, const char* what) {
    out.resize(std::size_t(NC));
    const std::size_t rows = std::size_t(c.shape.batch) * std::size_t(seq), width = std::size_t(C) * sizeof(bf16);
    check_cuda(cudaMemcpy2DAsync(out.data(), width, L.qkv.get() + j * C, 3 * width, width, rows, cudaMemcpyDeviceToHost, stream), what);
  };
  get_block(c.q, 0, "cudaMemcpy2DAsync (probe q)");
  get_block(c.k, 1, "cudaMemcpy2DAsync (probe k)");
  get_block(c.v, 2, "cudaMemcpy2DAsync (probe v)");
  get(c.o, L.atty.get(), std::size_t(NC), "cudaMemcpyAsync (probe o)");
  const bf16_t* residual = L.o_residual.empty() ? probe_residual[std::size_t(l)].get() : L.o_residual.get();
  get(c.o_residual, residual, std::size_t(NC), "cudaMemcpyAsync (probe residual)");
  std::size_t index = 0;
  while (&capture.layers[index] != &c) ++index;
  get(capture_x16[index], L.ln1.get(), std::size_t(NC), "cudaMemcpyAsync (probe x)");
  c.lse.resize(std::size_t(c.shape.batch) * c.shape.heads * seq);
  check_cuda(cudaMemcpyAsync(c.lse.data(), L.lse.get(), c.lse.size() * sizeof(float), cudaMemcpyDeviceToHost, stream),
             "cudaMemcpyAsync (probe lse)");
}

void Gpt2Cuda::request_capture(const CaptureRequest& request) {
  impl_->capture_request = request;
  impl_->capturing = false;
  impl_->capture = {};
}

Capture Gpt2Cuda::take_capture() {
  Impl& m = *impl_;
  check_cuda(cudaStreamSynchronize(m.stream), "cudaStreamSynchronize (probe capture)");
  for (std::size_t i = 0; i < m.capture.layers.size(); ++i) {
    auto& c = m.capture.layers[i];
    c.x.resize(m.capture_x16[i].size());
    for (std::size_t j = 0; j < c.x.size(); ++j) c.x[j] = m.capture_x16[i][j].to_float();
  }
  m.capture_request = {};
  m.capturing = false;
  m.capture_x16.clear();
  return std::exchange(m.capture, Capture{});
}

void Gpt2Cuda::train_micro_batch(std::span<const int> tokens, std::span<const int> targets, int batch, int len, float loss_scale) {
  Impl& m = *impl_;
  m.stage(tokens, targets, batch, len);
  m.capturing = !m.capture_request.empty();
  if (m.capturing) {
    m.begin_capture(batch, len);
    if (m.graphs_on) ++m.graph_use.eager;
  } else if (m.replay({batch, len, std::bit_cast<std::uint32_t>(loss_scale)}, loss_scale)) {
    return;
  }
  m.forward_backward(batch, len, loss_scale);
  m.capturing = false;  // one micro-batch only
}

// Replays the graph of `key` (recording it first where the shape has run once already); false
// where the micro-batch must run as usual instead (see set_cuda_graph).
bool Gpt2Cuda::Impl::replay(const GraphKey& key, float loss_scale) {
  if (!graphs_on) return false;
  if (gradient_ready || parameters_needed) {  // host callbacks per layer: never recorded
    ++graph_use.eager;
    return false;
  }
  auto it = graphs.find(key);
  if (it == graphs.end()) {
    if (ran_once.insert(key).second) {  // the first of its shape: every first use happens outside a recording
      ++graph_use.eager;
      return false;
    }
    try {
      cuda::StreamGraph g = cuda::StreamGraph::capture(stream, [&] { forward_backward(key.batch, key.seq, loss_scale); });
      if (graphs.size() >= kMaxGraphs) graphs.clear();
      it = graphs.emplace(key, std::move(g)).first;
      ++graph_use.captures;
    } catch (const cuda::GraphCaptureError& e) {
      graphs_on = false;
      graphs.clear();
      graph_use.on = false;
      graph_use.failure = e.what();
      ++graph_use.eager;
      return false;
    }
  }
  it->second.launch(stream);
  ++graph_use.replays;
  return true;
}

void Gpt2Cuda::set_cuda_graph(bool on) {
  Impl& m = *impl_;
  m.graphs_on = on;
  m.graphs.clear();
  m.graph_use = {};
  m.graph_use.on = on;
}

Gpt2Cuda::GraphUse Gpt2Cuda::graph_use() const { return impl_->graph_use; }

void Gpt2Cuda::eval_micro_batch(std::span<const int> tokens, std::span<const int> targets, int batch, int len) {
  Impl& m = *impl_;
  m.stage(tokens, targets, batch, len);
  m.forward(batch, len);
  m.classifier(batch, len, 0.0f, /*backward=*/false);
}

double Gpt2Cuda::take_loss_sum() {
  Impl& m = *impl_;
  check_cuda(cudaMemcpyAsync(m.loss_host, m.loss_sum.get(), sizeof(float), cudaMemcpyDeviceToHost, m.stream), "cudaMemcpyAsync (loss)");
  m.loss_sum.zero(m.stream);
  check_cuda(cudaStreamSynchronize(m.stream), "cudaStreamSynchronize (loss)");
  return double(*m.loss_host);
}

}  // namespace stableflash::model
