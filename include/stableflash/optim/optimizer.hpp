// Optimizers of the CPU trainer: AdamW and Muon (with AdamW for embeddings, head and 1-D tensors),
// the paper's learning-rate schedule and global gradient-norm clipping. Templated on the scalar so
// the FP64 golden comparison and the FP32 trainer run one implementation.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "stableflash/model/gpt2.hpp"

namespace stableflash::optim {

enum class OptimizerKind : std::uint8_t { adamw, muon };
std::string_view to_string(OptimizerKind k);
std::optional<OptimizerKind> parse_optimizer(std::string_view s);

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::adamw;
  double lr = 1e-3;             // peak learning rate
  double min_lr = 1e-5;         // the cosine decays to this
  std::int64_t warmup_steps = 2000;
  std::int64_t decay_steps = 600000;  // the step at which the cosine reaches min_lr (fixed, so resuming with more --steps keeps the schedule)
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double weight_decay = 0.0;    // decoupled; applied to 2-D tensors only (never to LayerNorm weights or biases)
  double grad_clip = 1.0;       // global L2 norm; 0 disables
  double muon_momentum = 0.95;
  bool muon_nesterov = true;
  int muon_ns_steps = 5;

  // Throws std::invalid_argument naming the field ("optim.lr", ...).
  void validate() const;
  bool operator==(const OptimizerConfig&) const = default;
};

// The paper's schedule (nanoGPT's get_lr): linear warm-up lr * (step + 1) / (warmup + 1) for
// step < warmup, then cosine from lr to min_lr reached at decay_steps, then min_lr. step is 0-based.
double learning_rate(const OptimizerConfig& c, std::int64_t step);

// Scales grads so their global L2 norm is at most max_norm (PyTorch's clip_grad_norm_: factor
// max_norm / (norm + 1e-6) when norm > max_norm). Returns the norm before clipping. The sum of
// squares runs in FP64 in index order (deterministic). max_norm <= 0: only measures.
template <class T>
double clip_grad_norm(std::span<T> grads, double max_norm);

// Newton-Schulz orthogonalization of X [rows, cols] in place (Muon's zeropower_via_newtonschulz5:
// quintic coefficients (3.4445, -4.7750, 2.0315), X / max(||X||_F, 1e-7) first, computed on the
// wide orientation, as torch.optim.Muon does).
template <class T>
void newton_schulz(T* X, int rows, int cols, int steps);

// Muon's update scale that matches the RMS of AdamW updates (Moonlight): 0.2 * sqrt(max(rows, cols)).
double muon_rms_scale(std::int64_t rows, std::int64_t cols);

template <class T>
class Optimizer {
 public:
  Optimizer(const OptimizerConfig& config, const std::vector<model::ParamTensor>& tensors);

  const OptimizerConfig& config() const { return config_; }
  // Applies one update with learning rate lr. grads are already averaged and clipped.
  void step(std::span<T> params, std::span<const T> grads, double lr);

  std::int64_t steps_taken() const { return t_; }
  // State for checkpoints: first and second moments (Muon keeps its momentum buffer in `first`
  // for hidden matrices; `second` is unused there), both laid out like the parameters.
  std::span<const T> first_moment() const { return m_; }
  std::span<const T> second_moment() const { return v_; }
  void load_state(std::int64_t steps_taken, std::span<const T> first, std::span<const T> second);

 private:
  void adamw_tensor(const model::ParamTensor& t, T* p, const T* g, double lr);
  void muon_tensor(const model::ParamTensor& t, T* p, const T* g, double lr);

  OptimizerConfig config_;
  std::vector<model::ParamTensor> tensors_;
  std::vector<T> m_, v_;
  std::vector<T> scratch_;
  std::int64_t t_ = 0;
};

extern template class Optimizer<float>;
extern template class Optimizer<double>;

}  // namespace stableflash::optim
