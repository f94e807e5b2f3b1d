// The CUDA engine: Gpt2Cuda and CudaOptimizer behind TrainingEngine (see engine.hpp). Weights
// start from the same host initialisation as the CPU model's, and checkpoints go through host
// copies in the CPU layout.
//
// Data parallel (several ranks): every rank holds the whole model and optimizer state. During the
// backward of a step's last micro-batch each finished range of gradients (ln_f, each layer, the
// embeddings) is summed over the ranks by an NCCL all-reduce on a second stream, overlapping the
// rest of the backward; then every rank runs the same deterministic optimizer step on the same
// summed gradients and keeps identical weights. The loss is summed the same way.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#include "engine.hpp"
#include "stableflash/model/cuda/blas.hpp"
#include "stableflash/model/cuda/device_array.hpp"
#include "stableflash/model/gpt2_cuda.hpp"
#include "stableflash/optim/cuda_optimizer.hpp"

namespace stableflash::train {
namespace {

using model::cuda::check_cuda;

void check_nccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw std::runtime_error(std::string("NCCL error in ") + what + ": " + ncclGetErrorString(r));
}

double env_seconds(const char* name, double fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atof(v) : fallback;
}

// NCCL between the ranks of a data-parallel run: the communicator, its stream, and the liveness
// watch of the rendezvous (a rank that dies or hangs ends every rank, naming it).
class Collectives {
 public:
  Collectives(const World& world, cudaStream_t compute, std::int64_t buckets) : world_(world), compute_(compute) {
    ncclUniqueId id{};
    if (world.rank == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    rendezvous_ = std::make_unique<Rendezvous>(world, std::vector<char>(id.internal, id.internal + sizeof id.internal),
                                               env_seconds("STABLEFLASH_RENDEZVOUS_TIMEOUT", 300),
                                               env_seconds("STABLEFLASH_HANG_TIMEOUT", 600));
    std::copy(rendezvous_->payload().begin(), rendezvous_->payload().end(), id.internal);
    rendezvous_->start_monitor([rank = world.rank](const std::string& why) {
      std::fprintf(stderr, "stableflash: rank %d: %s\n", rank, why.c_str());
      std::fflush(stderr);
      std::_Exit(3);  // NCCL calls of this process may be blocked for good; the OS frees the GPU
    });
    check_nccl(ncclCommInitRank(&comm_, world.size, id, world.rank), "ncclCommInitRank");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    events_.resize(std::size_t(buckets) + 1);
    for (auto& e : events_) check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaMalloc(&scalar_, sizeof(double)), "cudaMalloc");
  }
  ~Collectives() {
    if (stream_) cudaStreamSynchronize(stream_);
    for (auto e : events_) cudaEventDestroy(e);
    if (scalar_) cudaFree(scalar_);
    if (comm_) ncclCommDestroy(comm_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  // Sums grads[offset, offset + count) over the ranks once the compute stream got there.
  void all_reduce_after_compute(float* data, std::int64_t count) {
    cudaEvent_t e = events_[next_event_++ % (events_.size() - 1)];
    check_cuda(cudaEventRecord(e, compute_), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(stream_, e), "cudaStreamWaitEvent");
    check_nccl(ncclAllReduce(data, data, std::size_t(count), ncclFloat, ncclSum, comm_, stream_), "ncclAllReduce (gradients)");
  }
  // The compute stream waits for every all-reduce queued so far.
  void join_compute() {
    cudaEvent_t e = events_.back();
    check_cuda(cudaEventRecord(e, stream_), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(compute_, e), "cudaStreamWaitEvent");
    next_event_ = 0;
  }
  double sum(double value) {
    check_cuda(cudaMemcpyAsync(scalar_, &value, sizeof value, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync");
    check_nccl(ncclAllReduce(scalar_, scalar_, 1, ncclDouble, ncclSum, comm_, stream_), "ncclAllReduce (loss)");
    check_cuda(cudaMemcpyAsync(&value, scalar_, sizeof value, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync");
    check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    return value;
  }
  Rendezvous& rendezvous() { return *rendezvous_; }

 private:
  World world_;
  cudaStream_t compute_ = nullptr, stream_ = nullptr;
  std::unique_ptr<Rendezvous> rendezvous_;
  ncclComm_t comm_ = nullptr;
  std::vector<cudaEvent_t> events_;
  std::size_t next_event_ = 0;
  double* scalar_ = nullptr;
};

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
  CudaEngine(const TrainConfig& config, int device, const World& world)
      : device_(select_device(device)),
        model_(config.model, config.layer_attention(), config.train.batch_size, config.train.seq_len, config.train.deterministic),
        optimizer_(config.optim, model_.tensors(), *static_cast<model::cuda::Blas*>(model_.blas())),
        params_(std::size_t(model_.parameter_count())),
        first_(params_.size()),
        second_(params_.size()) {
    if (world.distributed())
      collectives_ = std::make_unique<Collectives>(world, static_cast<cudaStream_t>(model_.stream()), config.model.n_layer + 2);
  }

  std::string describe() const override {
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, device_);
    return "cuda:" + std::to_string(device_) + " (" + prop.name + ")" + (collectives_ ? ", data parallel over NCCL" : "");
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

  void read_parameters(std::int64_t offset, std::span<float> out) override {
    if (offset < 0 || offset + std::int64_t(out.size()) > model_.parameter_count()) throw std::out_of_range("read_parameters: past the model");
    check_cuda(cudaMemcpyAsync(out.data(), model_.params() + offset, out.size() * sizeof(float), cudaMemcpyDeviceToHost,
                               static_cast<cudaStream_t>(model_.stream())),
               "cudaMemcpyAsync (parameters)");
    check_cuda(cudaStreamSynchronize(static_cast<cudaStream_t>(model_.stream())), "cudaStreamSynchronize");
  }

  std::span<const float> parameters_on_host() override {
    model_.get_params(params_);  // synchronous: the probe step's weights after its update
    return params_;
  }
  void request_capture(const model::CaptureRequest& request) override { model_.request_capture(request); }
  model::Capture take_capture() override { return model_.take_capture(); }

  void zero_grad() override { model_.zero_grad(); }
  void train_micro_batch(std::span<const int> tokens, std::span<const int> targets, int batch, int len, float loss_scale,
                         bool last) override {
    if (!collectives_ || !last) return model_.train_micro_batch(tokens, targets, batch, len, loss_scale);
    float* grads = model_.grads();
    model_.set_gradient_ready([this, grads](std::int64_t offset, std::int64_t count) {
      collectives_->all_reduce_after_compute(grads + offset, count);
    });
    model_.train_micro_batch(tokens, targets, batch, len, loss_scale);
    model_.set_gradient_ready({});
    collectives_->join_compute();
  }
  void eval_micro_batch(std::span<const int> tokens, std::span<const int> targets, int batch, int len) override {
    model_.eval_micro_batch(tokens, targets, batch, len);
  }
  double take_loss_sum() override {
    const double local = model_.take_loss_sum();
    return collectives_ ? collectives_->sum(local) : local;
  }
  double clip_grad_norm(double max_norm) override { return optimizer_.clip_grad_norm(model_.grads(), max_norm); }
  void optimizer_step(double lr) override {
    optimizer_.step(model_.params(), static_cast<__nv_bfloat16*>(model_.params_bf16()), model_.grads(), lr);
  }
  bool any_rank(bool local) override { return collectives_ ? collectives_->sum(local ? 1.0 : 0.0) > 0.5 : local; }
  void heartbeat(std::int64_t step) override {
    if (collectives_) collectives_->rendezvous().heartbeat(step);
  }
  void finish() override {
    if (collectives_) collectives_->rendezvous().finish();
  }

 private:
  int device_;
  model::Gpt2Cuda model_;
  optim::CudaOptimizer optimizer_;
  std::vector<float> params_, first_, second_;  // host copies for checkpoints
  std::unique_ptr<Collectives> collectives_;     // data parallel only
};

}  // namespace

std::unique_ptr<TrainingEngine> make_cuda_engine(const TrainConfig& config, int device, const World& world) {
  return std::make_unique<CudaEngine>(config, device, world);
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
