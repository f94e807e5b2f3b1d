// GPT-2 forward and backward on the CPU (see gpt2.hpp). The layer math lives in layers.hpp; this
// file wires the blocks, owns the parameter layout and the activation buffers.
#include "stableflash/model/gpt2.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <utility>

#include "stableflash/attention/standard_fp32.hpp"
#include "stableflash/model/layers.hpp"
#include "stableflash/numerics/bf16.hpp"
#include "stableflash/numerics/random.hpp"

namespace stableflash::model {

using layers::Index;

void Gpt2Config::validate() const {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument(what);
  };
  need(n_layer >= 1, "model.n_layer must be >= 1 (got " + std::to_string(n_layer) + ")");
  need(n_head >= 1, "model.n_head must be >= 1 (got " + std::to_string(n_head) + ")");
  need(n_embd >= 1 && n_embd % n_head == 0,
       "model.n_embd must be a positive multiple of model.n_head (got " + std::to_string(n_embd) + " and " + std::to_string(n_head) + ")");
  need(head_dim() <= attention::kMaxHeadDim, "model.n_embd / model.n_head (the head dim) must be <= " + std::to_string(attention::kMaxHeadDim));
  need(block_size >= 1, "model.block_size must be >= 1 (got " + std::to_string(block_size) + ")");
  need(vocab_size >= 1 && vocab_size <= 65536, "model.vocab_size must be in [1, 65536] (tokens are uint16 in shards; got " + std::to_string(vocab_size) + ")");
  need(padded_vocab_size >= vocab_size, "model.padded_vocab_size must be >= model.vocab_size (got " + std::to_string(padded_vocab_size) + ")");
  need(init_std > 0 && std::isfinite(init_std), "model.init_std must be a positive number");
  need(layernorm_eps > 0 && std::isfinite(layernorm_eps), "model.layernorm_eps must be a positive number");
}

std::vector<ParamTensor> parameter_layout(const Gpt2Config& c) {
  c.validate();
  std::vector<ParamTensor> out;
  std::int64_t offset = 0;
  auto add = [&](std::string name, std::vector<std::int64_t> shape, ParamRole role) {
    std::int64_t size = 1;
    for (auto d : shape) size *= d;
    out.push_back({std::move(name), std::move(shape), offset, size, role});
    offset += size;
  };
  const std::int64_t C = c.n_embd;
  add("transformer.wte.weight", {c.padded_vocab_size, C}, ParamRole::embedding);
  add("transformer.wpe.weight", {c.block_size, C}, ParamRole::embedding);
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = "transformer.h." + std::to_string(l) + ".";
    add(p + "ln_1.weight", {C}, ParamRole::vector);
    if (c.bias) add(p + "ln_1.bias", {C}, ParamRole::vector);
    add(p + "attn.c_attn.weight", {C, 3 * C}, ParamRole::hidden_matrix);  // [in, out]
    if (c.bias) add(p + "attn.c_attn.bias", {3 * C}, ParamRole::vector);
    add(p + "attn.c_proj.weight", {C, C}, ParamRole::hidden_matrix);
    if (c.bias) add(p + "attn.c_proj.bias", {C}, ParamRole::vector);
    add(p + "ln_2.weight", {C}, ParamRole::vector);
    if (c.bias) add(p + "ln_2.bias", {C}, ParamRole::vector);
    add(p + "mlp.c_fc.weight", {C, 4 * C}, ParamRole::hidden_matrix);
    if (c.bias) add(p + "mlp.c_fc.bias", {4 * C}, ParamRole::vector);
    add(p + "mlp.c_proj.weight", {4 * C, C}, ParamRole::hidden_matrix);
    if (c.bias) add(p + "mlp.c_proj.bias", {C}, ParamRole::vector);
  }
  add("transformer.ln_f.weight", {C}, ParamRole::vector);
  if (c.bias) add("transformer.ln_f.bias", {C}, ParamRole::vector);
  return out;
}

// Activations of one forward, kept for the backward. Sized for (batch, len) on first use.
template <class T>
struct Gpt2<T>::Activations {
  struct Layer {
    std::vector<T> ln1, ln1_mean, ln1_rstd;  // [N, C], [N], [N]
    std::vector<T> qkv;                      // [N, 3C]
    std::vector<T> atty;                     // [N, C] attention output (heads concatenated)
    std::vector<T> probs;                    // [B, H, T, T] standard attention only
    std::vector<bf16> q16, k16, v16, o16, o_residual16;  // [B, T, H, D] flash attention only
    std::vector<float> lse;                  // [B, H, T] flash attention only
    std::vector<bf16> probe_residual16;      // [N, C] probes: O's rounding error for a layer without compensated delta
    std::vector<T> res2;                     // [N, C] x + attention projection
    std::vector<T> ln2, ln2_mean, ln2_rstd;
    std::vector<T> fch, fch_gelu;            // [N, 4C]
    std::vector<T> res3;                     // [N, C] block output
  };
  int batch = 0, len = 0;
  bool has_targets = false;   // probabilities kept for backward()
  bool logits_valid = false;  // logits holds raw logits (a forward without targets)
  std::vector<int> targets;                    // [N]
  std::vector<int> tokens;                     // [N]
  std::vector<T> encoded;                      // [N, C]
  std::vector<Layer> layer;
  std::vector<T> lnf, lnf_mean, lnf_rstd;      // [N, C], [N], [N]
  std::vector<T> logits;                       // [N, Vp]: logits, then probabilities, then their gradient
  std::vector<T> losses;                       // [N]
  // Backward scratch.
  std::vector<T> d_res, d_tmp, d_big, d_big2, d_qkv;   // [N, C], [N, C], [N, 4C], [N, 4C], [N, 3C]
  std::vector<bf16> d_o16, dq16, dk16, dv16;           // [N, C] flash backward
  std::vector<T> bf16_x, bf16_w, bf16_b;               // autocast emulation: BF16-rounded operand copies
};

template <class T>
Gpt2<T>::Gpt2(const Gpt2Config& config, std::vector<LayerAttention> attention)
    : config_(config), attention_(std::move(attention)), tensors_(parameter_layout(config)) {
  if (int(attention_.size()) != config_.n_layer)
    throw std::invalid_argument("model: " + std::to_string(attention_.size()) + " attention settings for " +
                                std::to_string(config_.n_layer) + " layers");
  for (int l = 0; l < config_.n_layer; ++l) {
    auto& la = attention_[l];
    la.options.causal = true;
    if (la.kind == AttentionKind::flash) {
      if constexpr (!std::is_same_v<T, float>)
        throw std::invalid_argument("attention.layer." + std::to_string(l) +
                                    ": flash attention runs on BF16 inputs; the FP64 model supports `standard` attention only");
      if (la.options.numerics == attention::Numerics::reference)
        throw std::invalid_argument("attention.layer." + std::to_string(l) + ".numerics: `reference` is an FP64 oracle, not a training path (use standard, paper or fused)");
      attention::AttentionShape shape{1, config_.n_head, config_.block_size, config_.block_size, config_.head_dim()};
      try {
        la.options.validate(shape);
      } catch (const std::exception& e) {
        throw std::invalid_argument("attention.layer." + std::to_string(l) + ": " + e.what());
      }
    }
  }
  std::int64_t total = 0;
  for (const auto& t : tensors_) total += t.size;
  params_.assign(std::size_t(total), T(0));
  grads_.assign(std::size_t(total), T(0));
  auto index_of = [&](const std::string& name) -> int {
    for (std::size_t i = 0; i < tensors_.size(); ++i)
      if (tensors_[i].name == name) return int(i);
    return -1;
  };
  wte_ = index_of("transformer.wte.weight");
  wpe_ = index_of("transformer.wpe.weight");
  lnf_w_ = index_of("transformer.ln_f.weight");
  lnf_b_ = index_of("transformer.ln_f.bias");
  for (int l = 0; l < config_.n_layer; ++l) {
    const std::string p = "transformer.h." + std::to_string(l) + ".";
    layer_index_.push_back({index_of(p + "ln_1.weight"), index_of(p + "ln_1.bias"), index_of(p + "attn.c_attn.weight"),
                            index_of(p + "attn.c_attn.bias"), index_of(p + "attn.c_proj.weight"), index_of(p + "attn.c_proj.bias"),
                            index_of(p + "ln_2.weight"), index_of(p + "ln_2.bias"), index_of(p + "mlp.c_fc.weight"),
                            index_of(p + "mlp.c_fc.bias"), index_of(p + "mlp.c_proj.weight"), index_of(p + "mlp.c_proj.bias")});
  }
}

template <class T>
Gpt2<T>::~Gpt2() = default;
template <class T>
Gpt2<T>::Gpt2(Gpt2&&) noexcept = default;
template <class T>
Gpt2<T>& Gpt2<T>::operator=(Gpt2&&) noexcept = default;

template <class T>
const ParamTensor& Gpt2<T>::tensor(std::string_view name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return t;
  throw std::out_of_range("model has no tensor '" + std::string(name) + "'");
}

template <class T>
void init_parameters(const Gpt2Config& config, const std::vector<ParamTensor>& tensors, std::uint64_t seed, std::span<T> params) {
  const double residual_std = config.init_std / std::sqrt(2.0 * config.n_layer);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const ParamTensor& t = tensors[i];
    if (t.offset + t.size > std::int64_t(params.size())) throw std::invalid_argument("init_parameters: buffer smaller than the layout");
    T* p = params.data() + t.offset;
    const bool is_weight = t.name.ends_with(".weight");
    if (t.role == ParamRole::vector) {
      // LayerNorm weights start at 1, every bias at 0.
      std::fill_n(p, t.size, T(is_weight && t.name.find("ln_") != std::string::npos ? 1 : 0));
      continue;
    }
    const bool residual_projection = t.name.ends_with("attn.c_proj.weight") || t.name.ends_with("mlp.c_proj.weight");
    const double std = residual_projection ? residual_std : config.init_std;
    SplitMix64 rng(seed, /*stream=*/i);
    for (std::int64_t k = 0; k < t.size; ++k) p[k] = T(std * rng.normal());
  }
}

template <class T>
void Gpt2<T>::init_weights(std::uint64_t seed) {
  init_parameters<T>(config_, tensors_, seed, params_);
}

namespace {
template <class T>
void round_to_bf16(T* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) x[i] = T(bf16::from_float(float(x[i])).to_float());
}
// A BF16-rounded copy of x[0, n) in `buf` (or nullptr for a null x).
template <class T>
const T* bf16_copy(std::vector<T>& buf, const T* x, std::int64_t n) {
  if (!x) return nullptr;
  buf.assign(x, x + n);
  round_to_bf16(buf.data(), n);
  return buf.data();
}
}  // namespace

template <class T>
void Gpt2<T>::set_bf16_autocast(bool on) {
  if (on && !std::is_same_v<T, float>) throw std::invalid_argument("BF16 autocast emulation needs the FP32 model");
  if (!acts_) acts_ = std::make_unique<Activations>();
  bf16_autocast_ = on;
}

template <class T>
void Gpt2<T>::linear(T* out, const T* x, const T* w, const T* b, std::int64_t n, int in, int out_features) {
  if (!bf16_autocast_) return layers::linear_forward(out, x, w, b, n, in, out_features);
  Activations& a = *acts_;
  layers::linear_forward(out, bf16_copy(a.bf16_x, x, n * in), bf16_copy(a.bf16_w, w, std::int64_t(in) * out_features),
                         bf16_copy(a.bf16_b, b, out_features), n, in, out_features);
  round_to_bf16(out, n * out_features);
}

// Every caller zeroes dx first, so rounding dx in place rounds this product alone.
template <class T>
void Gpt2<T>::linear_backward(T* dx, T* dw, T* db, const T* dout, const T* x, const T* w, std::int64_t n, int in, int out_features) {
  if (!bf16_autocast_) return layers::linear_backward(dx, dw, db, dout, x, w, n, in, out_features);
  Activations& a = *acts_;
  std::vector<T> dout16(dout, dout + n * out_features);
  round_to_bf16(dout16.data(), n * out_features);
  layers::linear_backward(dx, dw, db, dout16.data(), bf16_copy(a.bf16_x, x, n * in), bf16_copy(a.bf16_w, w, std::int64_t(in) * out_features),
                          n, in, out_features);
  round_to_bf16(dx, n * in);
}

template <class T>
void Gpt2<T>::request_capture(const CaptureRequest& request) {
  capture_request_ = request;
  capture_pending_ = !request.empty();
  capturing_ = false;
  capture_ = {};
}

template <class T>
Capture Gpt2<T>::take_capture() {
  capture_request_ = {};
  capture_pending_ = capturing_ = false;
  return std::exchange(capture_, Capture{});
}

template <class T>
LayerCapture* Gpt2<T>::captured(int layer) {
  if (!capturing_) return nullptr;
  for (auto& c : capture_.layers)
    if (c.layer == layer) return &c;
  return nullptr;
}

template <class T>
void Gpt2<T>::zero_grad() {
  std::fill(grads_.begin(), grads_.end(), T(0));
}

template <class T>
std::span<const T> Gpt2<T>::logits() const {
  if (!acts_ || !acts_->logits_valid) throw std::logic_error("logits() needs a forward without targets");
  return acts_->logits;
}

namespace {
template <class V>
void ensure(V& v, std::size_t n) {
  if (v.size() != n) v.assign(n, typename V::value_type{});
}

// The standard attention's view of one layer: q, k, v interleaved in the [N, 3C] qkv buffer, the
// output and the materialized probabilities.
template <class T, class LayerActivations>
attention::StandardAttentionArgs<T> standard_args(LayerActivations& L, int batch, int heads, int len, int head_dim, int C) {
  return {batch, heads, len, head_dim, 3 * C, /*causal=*/true,
          L.qkv.data(), L.qkv.data() + C, L.qkv.data() + 2 * C, L.atty.data(), L.probs.data()};
}

// The fused attention's view of one layer: BF16 q, k, v, O (and residual) in [B, T, H, D] and the
// FP32 lse, which its forward writes and its backward reads (ForwardArgs and BackwardArgs share
// these fields).
template <class Args, class LayerActivations>
Args fused_args(LayerActivations& L, int batch, int heads, int len, int head_dim) {
  Args args;
  args.shape = {batch, heads, len, len, head_dim};
  args.layout = attention::Layout::bthd;
  args.q = L.q16.data(), args.k = L.k16.data(), args.v = L.v16.data();
  args.o = L.o16.data(), args.lse = L.lse.data();
  args.o_residual = L.o_residual16.empty() ? nullptr : L.o_residual16.data();
  return args;
}
}  // namespace

template <class T>
T Gpt2<T>::forward(std::span<const int> tokens, std::span<const int> targets, int batch, int len) {
  const int C = config_.n_embd, Vp = config_.padded_vocab_size;
  if (batch < 1 || len < 1 || len > config_.block_size)
    throw std::invalid_argument("forward: sequence length " + std::to_string(len) + " outside [1, block_size = " +
                                std::to_string(config_.block_size) + "]");
  const Index N = Index(batch) * len;
  if (Index(tokens.size()) != N || (!targets.empty() && Index(targets.size()) != N))
    throw std::invalid_argument("forward: tokens/targets do not hold batch * len ids");
  for (int t : tokens)
    if (t < 0 || t >= Vp) throw std::out_of_range("forward: token id " + std::to_string(t) + " outside [0, " + std::to_string(Vp) + ")");
  for (int t : targets)
    if (t < 0 || t >= Vp) throw std::out_of_range("forward: target id " + std::to_string(t) + " outside [0, " + std::to_string(Vp) + ")");

  if (!acts_) acts_ = std::make_unique<Activations>();
  Activations& a = *acts_;
  if (a.batch != batch || a.len != len) {
    a = Activations{};
    a.batch = batch, a.len = len;
    const std::size_t nc = std::size_t(N) * C;
    a.encoded.resize(nc);
    a.layer.resize(config_.n_layer);
    for (int l = 0; l < config_.n_layer; ++l) {
      auto& L = a.layer[l];
      for (auto* v : {&L.ln1, &L.atty, &L.res2, &L.ln2, &L.res3}) v->resize(nc);
      for (auto* v : {&L.ln1_mean, &L.ln1_rstd, &L.ln2_mean, &L.ln2_rstd}) v->resize(std::size_t(N));
      L.qkv.resize(3 * nc);
      L.fch.resize(4 * nc), L.fch_gelu.resize(4 * nc);
      if (attention_[l].kind == AttentionKind::standard) {
        L.probs.resize(std::size_t(batch) * config_.n_head * len * len);
      } else {
        for (auto* v : {&L.q16, &L.k16, &L.v16, &L.o16}) v->resize(nc);
        if (attention_[l].options.needs_residual({batch, config_.n_head, len, len, config_.head_dim()})) L.o_residual16.resize(nc);
        L.lse.resize(std::size_t(batch) * config_.n_head * len);
      }
    }
    a.lnf.resize(nc), a.lnf_mean.resize(std::size_t(N)), a.lnf_rstd.resize(std::size_t(N));
    a.logits.resize(std::size_t(N) * Vp);
    a.losses.resize(std::size_t(N));
  }
  a.tokens.assign(tokens.begin(), tokens.end());
  a.has_targets = !targets.empty();
  a.logits_valid = targets.empty();
  a.targets.assign(targets.begin(), targets.end());

  capturing_ = capture_pending_ && a.has_targets;
  if (capturing_) {
    capture_pending_ = false;
    capture_ = {};
    capture_.head_ties.assign(capture_request_.count_ties ? std::size_t(config_.n_layer) : 0, {});
    for (int l : capture_request_.layers) {
      if (l < 0 || l >= config_.n_layer || attention_[std::size_t(l)].kind != AttentionKind::flash) continue;
      LayerCapture c;
      c.layer = l;
      c.options = attention_[std::size_t(l)].options;
      c.shape = {std::min(capture_request_.sequences, batch), config_.n_head, len, len, config_.head_dim()};
      capture_.layers.push_back(std::move(c));
    }
  }

  const T eps = T(config_.layernorm_eps);
  auto opt = [&](int idx) -> const T* { return idx < 0 ? nullptr : param(std::size_t(idx)); };
  layers::embedding_forward(a.encoded.data(), a.tokens.data(), param(wte_), param(wpe_), batch, len, C);
  const T* x = a.encoded.data();  // [N, C] residual stream
  for (int l = 0; l < config_.n_layer; ++l) {
    auto& L = a.layer[l];
    const LayerIndex& ix = layer_index_[l];
    layers::layernorm_forward(L.ln1.data(), L.ln1_mean.data(), L.ln1_rstd.data(), x, opt(ix.ln1_w), opt(ix.ln1_b), N, C, eps);
    linear(L.qkv.data(), L.ln1.data(), opt(ix.qkv_w), opt(ix.qkv_b), N, C, 3 * C);
    forward_attention(l, a, batch, len);
    // res2 = x + atty * W_proj (+ b)
    linear(L.res2.data(), L.atty.data(), opt(ix.attproj_w), opt(ix.attproj_b), N, C, C);
    for (Index i = 0; i < N * C; ++i) L.res2[i] += x[i];
    layers::layernorm_forward(L.ln2.data(), L.ln2_mean.data(), L.ln2_rstd.data(), L.res2.data(), opt(ix.ln2_w), opt(ix.ln2_b), N, C, eps);
    linear(L.fch.data(), L.ln2.data(), opt(ix.fc_w), opt(ix.fc_b), N, C, 4 * C);
    layers::gelu_forward(L.fch_gelu.data(), L.fch.data(), 4 * N * C);
    if (bf16_autocast_) round_to_bf16(L.fch_gelu.data(), 4 * N * C);
    linear(L.res3.data(), L.fch_gelu.data(), opt(ix.fcproj_w), opt(ix.fcproj_b), N, 4 * C, C);
    for (Index i = 0; i < N * C; ++i) L.res3[i] += L.res2[i];
    x = L.res3.data();
  }
  layers::layernorm_forward(a.lnf.data(), a.lnf_mean.data(), a.lnf_rstd.data(), x, opt(lnf_w_), opt(lnf_b_), N, C, eps);
  // Tied head: logits [N, Vp] = lnf [N, C] * wte^T.
  if (bf16_autocast_) {
    gemm<T>(Trans::no, Trans::yes, int(N), Vp, C, bf16_copy(a.bf16_x, a.lnf.data(), N * C), C, bf16_copy(a.bf16_w, param(wte_), std::int64_t(Vp) * C),
            C, a.logits.data(), Vp, /*accumulate=*/false);
    round_to_bf16(a.logits.data(), N * Vp);
  } else {
    gemm<T>(Trans::no, Trans::yes, int(N), Vp, C, a.lnf.data(), C, param(wte_), C, a.logits.data(), Vp, /*accumulate=*/false);
  }
  if (!a.has_targets) return T(0);
  return layers::softmax_cross_entropy_forward(a.logits.data(), a.losses.data(), a.targets.data(), N, Vp);
}

template <class T>
void Gpt2<T>::forward_attention(int l, Activations& a, int batch, int len) {
  auto& L = a.layer[l];
  const int C = config_.n_embd, H = config_.n_head, D = config_.head_dim();
  const Index N = Index(batch) * len;
  if (attention_[l].kind == AttentionKind::standard) {
    attention::standard_attention_forward(standard_args<T>(L, batch, H, len, D, C));
    return;
  }
  if constexpr (std::is_same_v<T, float>) {
    // The paper's mixed precision: BF16 q, k, v in [B, T, H, D] (= [N, C] per tensor).
#pragma omp parallel for schedule(static)
    for (Index n = 0; n < N; ++n)
      for (int c = 0; c < C; ++c) {
        const float* row = L.qkv.data() + n * 3 * C;
        L.q16[n * C + c] = bf16::from_float(row[c]);
        L.k16[n * C + c] = bf16::from_float(row[C + c]);
        L.v16[n * C + c] = bf16::from_float(row[2 * C + c]);
      }
    auto args = fused_args<attention::ForwardArgs>(L, batch, H, len, D);
    LayerCapture* cap = captured(l);
    if (capturing_ && capture_request_.count_ties) {
      capture_.head_ties[std::size_t(l)].assign(std::size_t(H), {});
      args.head_ties = capture_.head_ties[std::size_t(l)].data();
    }
    if (cap && !args.o_residual) {  // written beside O, read by nobody but the probes
      ensure(L.probe_residual16, std::size_t(N * C));
      args.o_residual = L.probe_residual16.data();
    }
    attention::attention_forward(args, attention_[l].options);
    for (Index i = 0; i < N * C; ++i) L.atty[i] = L.o16[i].to_float();
    if (cap) {
      const int S = cap->shape.batch;
      const auto tokens = std::size_t(S) * std::size_t(len) * std::size_t(C);  // the leading S sequences of [B, T, H, D]
      cap->q.assign(L.q16.begin(), L.q16.begin() + tokens), cap->k.assign(L.k16.begin(), L.k16.begin() + tokens);
      cap->v.assign(L.v16.begin(), L.v16.begin() + tokens), cap->o.assign(L.o16.begin(), L.o16.begin() + tokens);
      cap->o_residual.assign(args.o_residual, args.o_residual + tokens);
      cap->lse.assign(L.lse.begin(), L.lse.begin() + std::size_t(S) * H * len);  // [B, H, T]: leading S too
      cap->x.assign(L.ln1.begin(), L.ln1.begin() + tokens);
    }
  }
}

template <class T>
void Gpt2<T>::backward_attention(int l, Activations& a, int batch, int len, const T* d_out, T* d_qkv) {
  auto& L = a.layer[l];
  const int C = config_.n_embd, H = config_.n_head, D = config_.head_dim();
  const Index N = Index(batch) * len;
  if (attention_[l].kind == AttentionKind::standard) {
    attention::standard_attention_backward(standard_args<T>(L, batch, H, len, D, C), d_out, d_qkv, d_qkv + C, d_qkv + 2 * C);
    return;
  }
  if constexpr (std::is_same_v<T, float>) {
    ensure(a.d_o16, std::size_t(N * C));
    ensure(a.dq16, std::size_t(N * C)), ensure(a.dk16, std::size_t(N * C)), ensure(a.dv16, std::size_t(N * C));
    for (Index i = 0; i < N * C; ++i) a.d_o16[i] = bf16::from_float(d_out[i]);
    auto args = fused_args<attention::BackwardArgs>(L, batch, H, len, D);
    args.d_o = a.d_o16.data();
    args.dq = a.dq16.data(), args.dk = a.dk16.data(), args.dv = a.dv16.data();
    attention::attention_backward(args, attention_[l].options);
    if (LayerCapture* cap = captured(l))
      cap->d_o.assign(a.d_o16.begin(), a.d_o16.begin() + std::size_t(cap->shape.batch) * std::size_t(len) * std::size_t(C));
#pragma omp parallel for schedule(static)
    for (Index n = 0; n < N; ++n)
      for (int c = 0; c < C; ++c) {
        float* row = d_qkv + n * 3 * C;
        row[c] = a.dq16[n * C + c].to_float();
        row[C + c] = a.dk16[n * C + c].to_float();
        row[2 * C + c] = a.dv16[n * C + c].to_float();
      }
  }
}

template <class T>
void Gpt2<T>::backward(T loss_scale) {
  if (!acts_ || !acts_->has_targets) throw std::logic_error("backward() needs a forward with targets");
  Activations& a = *acts_;
  const int C = config_.n_embd, Vp = config_.padded_vocab_size, batch = a.batch, len = a.len;
  const Index N = Index(batch) * len;
  const std::size_t nc = std::size_t(N) * C;
  ensure(a.d_res, nc), ensure(a.d_tmp, nc), ensure(a.d_big, 4 * nc), ensure(a.d_big2, 4 * nc), ensure(a.d_qkv, 3 * nc);
  auto opt = [&](int idx) -> const T* { return idx < 0 ? nullptr : param(std::size_t(idx)); };
  auto gopt = [&](int idx) -> T* { return idx < 0 ? nullptr : grad(std::size_t(idx)); };
  auto zero = [](std::vector<T>& v, std::size_t n) { std::fill_n(v.begin(), n, T(0)); };

  // Loss and tied head. logits holds the probabilities; they become d loss / d logits in place.
  layers::softmax_cross_entropy_backward(a.logits.data(), a.targets.data(), N, Vp, loss_scale);
  zero(a.d_tmp, nc);
  const T* head_w = param(wte_);
  const T* head_x = a.lnf.data();
  if (bf16_autocast_) {  // BF16 logit gradient and operands; d lnf rounded like any matmul output
    round_to_bf16(a.logits.data(), N * Vp);
    head_w = bf16_copy(a.bf16_w, head_w, std::int64_t(Vp) * C);
    head_x = bf16_copy(a.bf16_x, head_x, N * C);
  }
  gemm<T>(Trans::no, Trans::no, int(N), C, Vp, a.logits.data(), Vp, head_w, C, a.d_tmp.data(), C, true);      // d lnf [N, C]
  gemm<T>(Trans::yes, Trans::no, Vp, C, int(N), a.logits.data(), Vp, head_x, C, grad(wte_), C, true);         // d wte [Vp, C]
  if (bf16_autocast_) round_to_bf16(a.d_tmp.data(), N * C);
  zero(a.d_res, nc);
  const T* x_last = config_.n_layer ? a.layer.back().res3.data() : a.encoded.data();
  layers::layernorm_backward(a.d_res.data(), grad(lnf_w_), gopt(lnf_b_), a.d_tmp.data(), x_last, opt(lnf_w_), a.lnf_mean.data(),
                             a.lnf_rstd.data(), N, C);

  // d_res holds d loss / d (block output); the residual adds pass it through unchanged.
  for (int l = config_.n_layer - 1; l >= 0; --l) {
    auto& L = a.layer[l];
    const LayerIndex& ix = layer_index_[l];
    const T* x = l == 0 ? a.encoded.data() : a.layer[l - 1].res3.data();
    // MLP: res3 = res2 + gelu(ln2 W_fc) W_proj
    zero(a.d_big, 4 * nc);
    linear_backward(a.d_big.data(), grad(ix.fcproj_w), gopt(ix.fcproj_b), a.d_res.data(), L.fch_gelu.data(), opt(ix.fcproj_w), N, 4 * C, C);
    zero(a.d_big2, 4 * nc);
    layers::gelu_backward(a.d_big2.data(), L.fch.data(), a.d_big.data(), 4 * N * C);
    if (bf16_autocast_) round_to_bf16(a.d_big2.data(), 4 * N * C);
    zero(a.d_tmp, nc);
    linear_backward(a.d_tmp.data(), grad(ix.fc_w), gopt(ix.fc_b), a.d_big2.data(), L.ln2.data(), opt(ix.fc_w), N, C, 4 * C);
    layers::layernorm_backward(a.d_res.data(), grad(ix.ln2_w), gopt(ix.ln2_b), a.d_tmp.data(), L.res2.data(), opt(ix.ln2_w),
                               L.ln2_mean.data(), L.ln2_rstd.data(), N, C);
    // Attention: res2 = x + attn(ln1 W_qkv) W_proj
    zero(a.d_tmp, nc);
    linear_backward(a.d_tmp.data(), grad(ix.attproj_w), gopt(ix.attproj_b), a.d_res.data(), L.atty.data(), opt(ix.attproj_w), N, C, C);
    backward_attention(l, a, batch, len, a.d_tmp.data(), a.d_qkv.data());
    zero(a.d_tmp, nc);
    linear_backward(a.d_tmp.data(), grad(ix.qkv_w), gopt(ix.qkv_b), a.d_qkv.data(), L.ln1.data(), opt(ix.qkv_w), N, C, 3 * C);
    layers::layernorm_backward(a.d_res.data(), grad(ix.ln1_w), gopt(ix.ln1_b), a.d_tmp.data(), x, opt(ix.ln1_w), L.ln1_mean.data(),
                               L.ln1_rstd.data(), N, C);
  }
  layers::embedding_backward(grad(wte_), grad(wpe_), a.d_res.data(), a.tokens.data(), batch, len, C);
  // The probabilities were consumed; a second backward would be wrong.
  capturing_ = false;
  a.has_targets = false;
  a.targets.clear();
}

template void init_parameters<float>(const Gpt2Config&, const std::vector<ParamTensor>&, std::uint64_t, std::span<float>);
template void init_parameters<double>(const Gpt2Config&, const std::vector<ParamTensor>&, std::uint64_t, std::span<double>);
template class Gpt2<float>;
template class Gpt2<double>;

}  // namespace stableflash::model
