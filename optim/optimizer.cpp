// AdamW, Muon, the schedule and clipping (see optimizer.hpp).
#include "stableflash/optim/optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>

#include "stableflash/model/gemm.hpp"

namespace stableflash::optim {

std::string_view to_string(OptimizerKind k) { return k == OptimizerKind::muon ? "muon" : "adamw"; }

std::optional<OptimizerKind> parse_optimizer(std::string_view s) {
  if (s == "adamw") return OptimizerKind::adamw;
  if (s == "muon") return OptimizerKind::muon;
  return std::nullopt;
}

void OptimizerConfig::validate() const {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument(what);
  };
  auto finite_pos = [](double x) { return std::isfinite(x) && x > 0; };
  need(finite_pos(lr), "optim.lr must be a positive number (got " + std::to_string(lr) + ")");
  need(std::isfinite(min_lr) && min_lr >= 0 && min_lr <= lr, "optim.min_lr must be in [0, optim.lr] (got " + std::to_string(min_lr) + ")");
  need(warmup_steps >= 0, "optim.warmup_steps must be >= 0");
  need(decay_steps > warmup_steps, "optim.decay_steps must be > optim.warmup_steps (got " + std::to_string(decay_steps) + " <= " +
                                       std::to_string(warmup_steps) + ")");
  need(beta1 >= 0 && beta1 < 1, "optim.beta1 must be in [0, 1)");
  need(beta2 >= 0 && beta2 < 1, "optim.beta2 must be in [0, 1)");
  need(finite_pos(eps), "optim.eps must be a positive number");
  need(std::isfinite(weight_decay) && weight_decay >= 0, "optim.weight_decay must be >= 0");
  need(std::isfinite(grad_clip) && grad_clip >= 0, "optim.grad_clip must be >= 0 (0 disables clipping)");
  need(muon_momentum >= 0 && muon_momentum < 1, "optim.muon_momentum must be in [0, 1)");
  need(muon_ns_steps >= 1 && muon_ns_steps <= 20, "optim.muon_ns_steps must be in [1, 20]");
}

double learning_rate(const OptimizerConfig& c, std::int64_t step) {
  if (step < c.warmup_steps) return c.lr * double(step + 1) / double(c.warmup_steps + 1);
  if (step > c.decay_steps) return c.min_lr;
  const double ratio = double(step - c.warmup_steps) / double(c.decay_steps - c.warmup_steps);
  const double coeff = 0.5 * (1.0 + std::cos(std::numbers::pi * ratio));
  return c.min_lr + coeff * (c.lr - c.min_lr);
}

template <class T>
double clip_grad_norm(std::span<T> grads, double max_norm) {
  double sum = 0;
  for (T g : grads) sum += double(g) * double(g);
  const double norm = std::sqrt(sum);
  if (max_norm > 0 && norm > max_norm) {
    const T factor = T(max_norm / (norm + 1e-6));
    for (T& g : grads) g *= factor;
  }
  return norm;
}

template <class T>
void newton_schulz(T* X, int rows, int cols, int steps) {
  using model::gemm;
  using model::Trans;
  constexpr double a = 3.4445, b = -4.7750, c = 2.0315;
  const std::size_t n = std::size_t(rows) * cols;
  double sq = 0;
  for (std::size_t i = 0; i < n; ++i) sq += double(X[i]) * double(X[i]);
  const T inv = T(1.0 / std::max(std::sqrt(sq), 1e-7));  // X / ||X||.clamp(min=eps)
  // Work on the wide orientation [r, k] with r <= k, so X X^T is the small Gram matrix.
  const bool tall = rows > cols;
  const int r = tall ? cols : rows, k = tall ? rows : cols;
  std::vector<T> x(n), gram(std::size_t(r) * r), poly(std::size_t(r) * r), next(n);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) (tall ? x[std::size_t(j) * k + i] : x[std::size_t(i) * k + j]) = X[std::size_t(i) * cols + j] * inv;
  for (int s = 0; s < steps; ++s) {
    gemm<T>(Trans::no, Trans::yes, r, r, k, x.data(), k, x.data(), k, gram.data(), r, false);         // A = X X^T
    gemm<T>(Trans::no, Trans::no, r, r, r, gram.data(), r, gram.data(), r, poly.data(), r, false);   // A A
    for (std::size_t i = 0; i < poly.size(); ++i) poly[i] = T(b) * gram[i] + T(c) * poly[i];       // B = b A + c A A
    gemm<T>(Trans::no, Trans::no, r, k, r, poly.data(), r, x.data(), k, next.data(), k, false);      // B X
    for (std::size_t i = 0; i < n; ++i) x[i] = T(a) * x[i] + next[i];                               // X = a X + B X
  }
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) X[std::size_t(i) * cols + j] = tall ? x[std::size_t(j) * k + i] : x[std::size_t(i) * k + j];
}

double muon_rms_scale(std::int64_t rows, std::int64_t cols) { return 0.2 * std::sqrt(double(std::max(rows, cols))); }

template <class T>
Optimizer<T>::Optimizer(const OptimizerConfig& config, const std::vector<model::ParamTensor>& tensors) : config_(config), tensors_(tensors) {
  config_.validate();
  std::int64_t total = 0;
  for (const auto& t : tensors_) total = std::max(total, t.offset + t.size);
  m_.assign(std::size_t(total), T(0));
  v_.assign(std::size_t(total), T(0));
}

template <class T>
void Optimizer<T>::step(std::span<T> params, std::span<const T> grads, double lr) {
  if (params.size() != m_.size() || grads.size() != m_.size()) throw std::invalid_argument("optimizer: parameter count changed");
  ++t_;
  for (const auto& t : tensors_) {
    T* p = params.data() + t.offset;
    const T* g = grads.data() + t.offset;
    if (config_.kind == OptimizerKind::muon && t.role == model::ParamRole::hidden_matrix)
      muon_tensor(t, p, g, lr);
    else
      adamw_tensor(t, p, g, lr);
  }
}

// PyTorch's AdamW (decoupled decay; bias corrections applied as torch.optim.AdamW does).
template <class T>
void Optimizer<T>::adamw_tensor(const model::ParamTensor& t, T* p, const T* g, double lr) {
  T* m = m_.data() + t.offset;
  T* v = v_.data() + t.offset;
  const T b1 = T(config_.beta1), b2 = T(config_.beta2), eps = T(config_.eps);
  const T bc1 = T(1 - std::pow(config_.beta1, double(t_)));
  const T bc2_sqrt = T(std::sqrt(1 - std::pow(config_.beta2, double(t_))));
  const T step_size = T(lr) / bc1;
  const T decay = t.is_2d() ? T(1 - lr * config_.weight_decay) : T(1);
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < t.size; ++i) {
    p[i] *= decay;
    m[i] = b1 * m[i] + (T(1) - b1) * g[i];
    v[i] = b2 * v[i] + (T(1) - b2) * g[i] * g[i];
    const T denom = std::sqrt(v[i]) / bc2_sqrt + eps;
    p[i] -= step_size * (m[i] / denom);
  }
}

// Muon as torch.optim.Muon defines it (EMA momentum by lerp, Nesterov look-ahead, Newton-Schulz,
// decoupled weight decay with the unscaled lr) with adjust_lr_fn = "match_rms_adamw" (Moonlight's
// RMS-matched scale), but orthogonalized in the model's precision instead of torch's BF16 copy.
template <class T>
void Optimizer<T>::muon_tensor(const model::ParamTensor& t, T* p, const T* g, double lr) {
  T* buf = m_.data() + t.offset;
  const T mu = T(config_.muon_momentum);
  scratch_.resize(std::size_t(t.size));
  for (std::int64_t i = 0; i < t.size; ++i) {
    buf[i] += (T(1) - mu) * (g[i] - buf[i]);                               // buf.lerp_(g, 1 - mu)
    scratch_[i] = config_.muon_nesterov ? g[i] + mu * (buf[i] - g[i]) : buf[i];  // g.lerp(buf, mu)
  }
  const int rows = int(t.shape[0]), cols = int(t.shape[1]);
  newton_schulz(scratch_.data(), rows, cols, config_.muon_ns_steps);
  const T decay = T(1 - lr * config_.weight_decay);
  const T scaled_lr = T(lr * muon_rms_scale(rows, cols));
  for (std::int64_t i = 0; i < t.size; ++i) p[i] = p[i] * decay - scaled_lr * scratch_[i];
}

template <class T>
void Optimizer<T>::load_state(std::int64_t steps_taken, std::span<const T> first, std::span<const T> second) {
  if (first.size() != m_.size() || second.size() != v_.size())
    throw std::invalid_argument("optimizer state holds " + std::to_string(first.size()) + " values, the model has " +
                                std::to_string(m_.size()) + " parameters");
  if (steps_taken < 0) throw std::invalid_argument("optimizer state: negative step count");
  t_ = steps_taken;
  std::copy(first.begin(), first.end(), m_.begin());
  std::copy(second.begin(), second.end(), v_.begin());
}

template double clip_grad_norm<float>(std::span<float>, double);
template double clip_grad_norm<double>(std::span<double>, double);
template void newton_schulz<float>(float*, int, int, int);
template void newton_schulz<double>(double*, int, int, int);
template class Optimizer<float>;
template class Optimizer<double>;

}  // namespace stableflash::optim
