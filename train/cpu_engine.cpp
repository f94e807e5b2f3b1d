// The CPU engine: Gpt2<float> and Optimizer<float> behind TrainingEngine (see engine.hpp).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "engine.hpp"
#include "stableflash/model/gpt2.hpp"
#include "stableflash/optim/optimizer.hpp"

namespace stableflash::train {
namespace {

class CpuEngine final : public TrainingEngine {
 public:
  CpuEngine(const TrainConfig& config, bool bf16_autocast)
      : model_(config.model, config.layer_attention()), optimizer_(config.optim, model_.tensors()) {
    if (bf16_autocast) model_.set_bf16_autocast(true);
  }

  std::string describe() const override { return "cpu (" + std::to_string(omp_get_max_threads()) + " threads)"; }
  bool asynchronous() const override { return false; }

  void init_weights(std::uint64_t seed) override { model_.init_weights(seed); }
  void load(const Checkpoint& checkpoint) override {
    load_weights(checkpoint, model_);
    load_optimizer(checkpoint, optimizer_);
  }
  TrainingSnapshot snapshot() override { return snapshot_of(model_, optimizer_); }
  void read_parameters(std::int64_t offset, std::span<float> out) override {
    const auto p = model_.params().subspan(std::size_t(offset), out.size());
    std::copy(p.begin(), p.end(), out.begin());
  }

  std::span<const float> parameters_on_host() override { return model_.params(); }
  void request_capture(const model::CaptureRequest& request) override { model_.request_capture(request); }
  model::Capture take_capture() override { return model_.take_capture(); }

  void zero_grad() override { model_.zero_grad(); }
  void train_micro_batch(std::span<const int> tokens, std::span<const int> targets, int batch, int len, float loss_scale, bool) override {
    loss_sum_ += double(model_.forward(tokens, targets, batch, len));
    model_.backward(loss_scale);
  }
  void eval_micro_batch(std::span<const int> tokens, std::span<const int> targets, int batch, int len) override {
    loss_sum_ += double(model_.forward(tokens, targets, batch, len));
  }
  double take_loss_sum() override { return std::exchange(loss_sum_, 0.0); }
  void clip_grad_norm(double max_norm) override {
    norm_ = optim::clip_grad_norm(model_.grads(), max_norm);
    skip_step_ = !std::isfinite(norm_);
  }
  double grad_norm() override { return norm_; }
  // As the GPU's: the step after a norm that is not finite changes nothing.
  void optimizer_step(double lr) override {
    if (!skip_step_) optimizer_.step(model_.params(), model_.grads(), lr);
    skip_step_ = false;
  }

 private:
  model::Gpt2<float> model_;
  optim::Optimizer<float> optimizer_;
  double loss_sum_ = 0.0;
  double norm_ = 0.0;       // of the last clip_grad_norm
  bool skip_step_ = false;  // that norm was not finite
};

}  // namespace

std::unique_ptr<TrainingEngine> make_cpu_engine(const TrainConfig& config, bool bf16_autocast) {
  return std::make_unique<CpuEngine>(config, bf16_autocast);
}

}  // namespace stableflash::train
