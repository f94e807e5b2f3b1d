// The CUDA engine: Gpt2Cuda and CudaOptimizer behind TrainingEngine (see engine.hpp). Weights
// start from the same host initialisation as the CPU model's, and checkpoints go through host
// copies in the CPU layout.
#include <cuda_runtime.h>

#include <stdexcept>

#include "engine.hpp"
#include "stableflash/model/cuda/blas.hpp"
#include "stableflash/model/gpt2_cuda.hpp"
#include "stableflash/optim/cuda_optimizer.hpp"

namespace stableflash::train {
namespace {

int select_device(int device) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)
    throw std::runtime_error("--device cuda: no CUDA GPU is visible (use --device cpu)");
  if (device < 0 || device >= count)
    throw std::runtime_error("--device cuda: GPU " + std::to_string(device) + " does not exist (" + std::to_string(count) + " visible)");
  if (cudaSetDevice(device) != cudaSuccess) throw std::runtime_error("cudaSetDevice(" + std::to_string(device) + ") failed");
  return device;
}

class CudaEngine final : public TrainingEngine {
 public:
  CudaEngine(const TrainConfig& config, int device)
      : device_(select_device(device)),
        model_(config.model, config.layer_attention(), config.train.batch_size, config.train.seq_len, config.train.deterministic),
        optimizer_(config.optim, model_.tensors(), *static_cast<model::cuda::Blas*>(model_.blas())),
        params_(std::size_t(model_.parameter_count())),
        first_(params_.size()),
        second_(params_.size()) {}

  std::string describe() const override {
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, device_);
    return "cuda:" + std::to_string(device_) + " (" + prop.name + ")";
  }
  bool asynchronous() const override { return true; }

  void init_weights(std::uint64_t seed) override {
    model::init_parameters<float>(model_.config(), model_.tensors(), seed, params_);
    model_.set_params(params_);
  }
  void load(const Checkpoint& checkpoint) override {
    load_weights(checkpoint, model_.tensors(), params_);
    model_.set_params(params_);
    const OptimizerState st = read_optimizer_state(checkpoint, model_.parameter_count());
    optimizer_.load_state(st.steps_taken, st.first_moment, st.second_moment);
  }
  TrainingSnapshot snapshot() override {
    model_.get_params(params_);
    optimizer_.download_state(first_, second_);
    TrainingSnapshot s;
    s.model_config = &model_.config();
    s.tensors = &model_.tensors();
    s.params = params_;
    s.optimizer = optimizer_.config().kind;
    s.steps_taken = optimizer_.steps_taken();
    s.first_moment = first_;
    s.second_moment = second_;
    return s;
  }

  void zero_grad() override { model_.zero_grad(); }
  void train_micro_batch(std::span<const int> tokens, std::span<const int> targets, int batch, int len, float loss_scale) override {
    model_.train_micro_batch(tokens, targets, batch, len, loss_scale);
  }
  void eval_micro_batch(std::span<const int> tokens, std::span<const int> targets, int batch, int len) override {
    model_.eval_micro_batch(tokens, targets, batch, len);
  }
  double take_loss_sum() override { return model_.take_loss_sum(); }
  double clip_grad_norm(double max_norm) override { return optimizer_.clip_grad_norm(model_.grads(), max_norm); }
  void optimizer_step(double lr) override {
    optimizer_.step(model_.params(), static_cast<__nv_bfloat16*>(model_.params_bf16()), model_.grads(), lr);
  }

 private:
  int device_;
  model::Gpt2Cuda model_;
  optim::CudaOptimizer optimizer_;
  std::vector<float> params_, first_, second_;  // host copies for checkpoints
};

}  // namespace

std::unique_ptr<TrainingEngine> make_cuda_engine(const TrainConfig& config, int device) {
  return std::make_unique<CudaEngine>(config, device);
}

std::int64_t cuda_memory_in_use() {
  std::size_t free_bytes = 0, total = 0;
  if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) return -1;
  return std::int64_t(total - free_bytes);
}

bool cuda_training_available() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

}  // namespace stableflash::train
