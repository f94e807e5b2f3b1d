// The CUDA engine: Gpt2Cuda and CudaOptimizer behind TrainingEngine (see engine.hpp). Weights
// start from the same host initialisation as the CPU model's, and checkpoints go through host
// copies in the CPU layout.
//
// Data parallel (several ranks, data_parallel_sync.hpp): during the backward of a step's last
// micro-batch the gradients are summed over the ranks bucket by bucket on a second stream,
// overlapping the rest of the backward. With dist.zero_stage = 1 (ZeRO-1, the default) the
// buckets are reduce-scattered: each rank ends up with the summed gradients of its shard, updates
// only those parameters (and keeps only their optimizer state), and all-gathers the updated FP32
// parameters bucket by bucket while the rest updates and the next forward starts; the gradient
// norm is summed from per-rank parts in rank order. With dist.zero_stage = 0 the buckets are
// all-reduced and every rank runs the whole, identical optimizer step. Either way every rank
// keeps identical weights; the loss is summed the same way. With dist.split_embedding (the
// default) the tied wte's classifier gradient is reduced right after the classifier and only the
// embedding lookup's rows at the end (data_parallel_sync.hpp).
//
// One process (and stage 0), with train.overlap_optimizer (off by default): the optimizer step runs
// on a second stream (update_overlap.hpp): the norm and the clipping factor are computed on the
// device, the parameters are updated part by part in the order the forward reads them, and the
// next forward waits per layer for its part, through the same parameters-needed hook ZeRO-1 uses
// for its all-gather. The update also zeroes the gradients as it reads them, so zero_grad() has
// nothing left to do. Without the overlap the same kernels run on the compute stream.
//
// CUDA graphs (train.cuda_graph, on by default): with one process and no overlap, each micro-batch's
// forward and backward is replayed from a graph (Gpt2Cuda::set_cuda_graph), the batch staged into
// device memory before the launch. The gradient norm, the clipping factor and the update stay
// launches of their own: the trainer reads the loss on the host between the backward and the update
// (to stop before updating on a loss that is not finite), so they could not join the backward's
// graph, and as a graph of their own they would save 4 of the step's ~316 launch gaps (AdamW's
// learning rate and step count, launch parameters today, would have to move to device memory).
// Data parallelism and the overlapped update keep their launches: their hooks queue work and event
// waits on other streams from host callbacks inside the forward and backward.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <stdexcept>

#include "cuda_collectives.hpp"
#include "data_parallel_sync.hpp"
#include "engine.hpp"
#include "update_overlap.hpp"
#include "stableflash/model/cuda/blas.hpp"
#include "stableflash/model/cuda/device_array.hpp"
#include "stableflash/model/gpt2_cuda.hpp"
#include "stableflash/optim/cuda_optimizer.hpp"
#include "stableflash/optim/sharding.hpp"

namespace stableflash::train {
namespace {

using model::cuda::check_cuda;

int select_device(int device) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)
    throw std::runtime_error("--device cuda: no CUDA GPU is visible (use --device cpu)");
  if (device < 0 || device >= count)
    throw std::runtime_error("--device cuda: GPU " + std::to_string(device) + " does not exist (" + std::to_string(count) + " visible)");
  if (cudaSetDevice(device) != cudaSuccess) throw std::runtime_error("cudaSetDevice(" + std::to_string(device) + ") failed");
  return device;
}

// The shard plan of a data-parallel run (none for one process): ZeRO-1 shards every AdamW bucket,
// stage 0 replicates them all.
std::optional<optim::ShardPlan> plan_for(const TrainConfig& config, const model::Gpt2Cuda& model, const World& world) {
  if (!world.uses_collectives()) return std::nullopt;
  const auto bucket_elements = std::max<std::int64_t>(world.size, std::int64_t(config.dist.bucket_mb * 1e6 / sizeof(float)));
  return optim::ShardPlan::make(model.tensors(), config.optim.kind, world.size, bucket_elements,
                                /*replicate_all=*/config.dist.zero_stage == 0, config.dist.split_embedding);
}

// The overlapped optimizer step where it applies (one process or stage 0, train.overlap_optimizer).
std::unique_ptr<UpdateOverlap> overlap_for(const TrainConfig& config, const model::Gpt2Cuda& model, bool zero) {
  if (zero || !config.train.overlap_optimizer) return nullptr;
  return std::make_unique<UpdateOverlap>(optim::forward_order_parts(model.tensors()), static_cast<cudaStream_t>(model.stream()));
}

class CudaEngine final : public TrainingEngine {
 public:
  CudaEngine(const TrainConfig& config, int device, const World& world)
      : device_(select_device(device)),
        world_(world),
        model_(config.model, config.layer_attention(), config.train.batch_size, config.train.seq_len, config.train.deterministic),
        plan_(plan_for(config, model_, world)),
        zero_(plan_ && config.dist.zero_stage == 1),
        overlap_(overlap_for(config, model_, zero_)),
        // Muon's products on the optimizer's stream: a cuBLASLt handle of its own, tuned like the model's.
        overlap_blas_(overlap_ ? std::make_unique<model::cuda::Blas>(overlap_->stream(), /*tune=*/!config.train.deterministic) : nullptr),
        optimizer_(config.optim, model_.tensors(), overlap_ ? *overlap_blas_ : *static_cast<model::cuda::Blas*>(model_.blas()),
                   zero_ ? &*plan_ : nullptr, world.rank, overlap_ ? overlap_->parts() : std::vector<optim::FlatRange>{}),
        params_(std::size_t(model_.parameter_count())) {
    if (overlap_) model_.set_parameters_needed([this](std::int64_t offset, std::int64_t count) { overlap_->parameters_needed(offset, count); });
    graph_off_ = !config.train.cuda_graph ? "train.cuda_graph = false"
                 : plan_                  ? "data parallel: NCCL's hooks queue work from inside the backward"
                 : overlap_               ? "train.overlap_optimizer: the forward waits per layer for the update's events"
                                          : "";
    model_.set_cuda_graph(graph_off_.empty());
    if (!plan_) return;
    const auto compute = static_cast<cudaStream_t>(model_.stream());
    collectives_ = std::make_unique<Collectives>(world, compute);
    sync_ = std::make_unique<DataParallelSync>(*collectives_, *plan_, compute, std::int64_t(config.train.batch_size) * config.train.seq_len);
    if (zero_) model_.set_parameters_needed([this](std::int64_t offset, std::int64_t count) { sync_->parameters_needed(offset, count); });
  }

  std::string describe() const override {
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, device_);
    std::string d = "cuda:" + std::to_string(device_) + " (" + prop.name + ")";
    if (collectives_) d += zero_ ? ", data parallel over NCCL, ZeRO-1" : ", data parallel over NCCL, all-reduce";
    if (plan_) d += ", " + std::to_string(plan_->buckets().size()) + " gradient buckets";
    if (overlap_) d += ", optimizer overlapped with the forward";
    d += graph_off_.empty() ? ", micro-batches replayed from CUDA graphs" : ", no CUDA graphs (" + graph_off_ + ")";
    return d;
  }
  bool asynchronous() const override { return true; }

  void init_weights(std::uint64_t seed) override {
    model::init_parameters<float>(model_.config(), model_.tensors(), seed, params_);
    wait_for_all_parameters();
    model_.set_params(params_);
  }
  void load(const Checkpoint& checkpoint) override {
    load_weights(checkpoint, model_.tensors(), params_);
    wait_for_all_parameters();
    model_.set_params(params_);
    OptimizerState st = read_optimizer_state(checkpoint, model_.parameter_count());
    if (zero_) {  // every rank reads the whole state and keeps its shard: any world size resumes
      std::vector<float> first(std::size_t(optimizer_.state_count())), second(first.size());
      optim::take_shard(*plan_, world_.rank, st.first_moment, first);
      optim::take_shard(*plan_, world_.rank, st.second_moment, second);
      st.first_moment = std::move(first), st.second_moment = std::move(second);
    }
    optimizer_.load_state(st.steps_taken, st.first_moment, st.second_moment);
  }
  // Collective under ZeRO-1: every rank calls it, rank 0 gathers the optimizer shards. Only rank
  // 0's snapshot holds weights and state (it alone writes checkpoints).
  TrainingSnapshot snapshot() override {
    wait_for_all_parameters();  // the moments are read on the optimizer's own stream, after its update
    TrainingSnapshot s;
    s.model_config = &model_.config();
    s.tensors = &model_.tensors();
    s.optimizer = optimizer_.config().kind;
    s.steps_taken = optimizer_.steps_taken();
    if (zero_) {
      if (world_.rank == 0) first_.resize(params_.size()), second_.resize(params_.size());
      gather_moment(optimizer_.first_moment_device(), first_);
      gather_moment(optimizer_.second_moment_device(), second_);
    }
    if (world_.rank != 0) return s;  // only rank 0 writes checkpoints
    if (!zero_) {
      first_.resize(params_.size()), second_.resize(params_.size());
      optimizer_.download_state(first_, second_);
    }
    model_.get_params(params_);
    s.params = params_;
    s.first_moment = first_;
    s.second_moment = second_;
    return s;
  }

  void read_parameters(std::int64_t offset, std::span<float> out) override {
    if (offset < 0 || offset + std::int64_t(out.size()) > model_.parameter_count()) throw std::out_of_range("read_parameters: past the model");
    wait_for_all_parameters();
    check_cuda(cudaMemcpyAsync(out.data(), model_.params() + offset, out.size() * sizeof(float), cudaMemcpyDeviceToHost,
                               static_cast<cudaStream_t>(model_.stream())),
               "cudaMemcpyAsync (parameters)");
    check_cuda(cudaStreamSynchronize(static_cast<cudaStream_t>(model_.stream())), "cudaStreamSynchronize");
  }

  std::span<const float> parameters_on_host() override {
    wait_for_all_parameters();
    model_.get_params(params_);  // synchronous: the probe step's weights after its update
    return params_;
  }
  void request_capture(const model::CaptureRequest& request) override { model_.request_capture(request); }
  model::Capture take_capture() override { return model_.take_capture(); }

  void zero_grad() override {
    if (grads_zeroed_) return;  // the last optimizer step zeroed them as it read them
    // No update can still be reading them on the optimizer's stream (one that ran set
    // grads_zeroed_, and the forward since waited for it); this wait only makes sure. Not for
    // ZeRO-1's gathers, which write parameters only and overlap the next forward.
    if (overlap_) overlap_->wait_for_all_parameters();
    model_.zero_grad();
  }
  void train_micro_batch(std::span<const int> tokens, std::span<const int> targets, int batch, int len, float loss_scale,
                         bool last) override {
    grads_zeroed_ = false;
    if (!sync_ || !last) {
      model_.train_micro_batch(tokens, targets, batch, len, loss_scale);
      return check_forward_waited();
    }
    sync_->begin_backward(model_.grads(), tokens);
    model_.set_gradient_ready([this](std::int64_t offset, std::int64_t count) { sync_->gradient_ready(offset, count); });
    if (sync_->splits_token_embedding())
      model_.set_token_embedding_split(sync_->embedding_rows(), [this] { sync_->token_embedding_dense_ready(); });
    model_.train_micro_batch(tokens, targets, batch, len, loss_scale);
    model_.set_gradient_ready({});
    model_.set_token_embedding_split(nullptr, {});
    sync_->end_backward(model_.staged_token_ids(), model_.staged_token_ids_device());
    check_forward_waited();
  }
  void eval_micro_batch(std::span<const int> tokens, std::span<const int> targets, int batch, int len) override {
    model_.eval_micro_batch(tokens, targets, batch, len);
    check_forward_waited();
  }
  double take_loss_sum() override {
    const double local = model_.take_loss_sum();
    if (overlap_) overlap_->synchronize();  // in a step the previous update is long done (the forward waited for it)
    return collectives_ ? collectives_->sum(local) : local;
  }
  void clip_grad_norm(double max_norm) override {
    if (!zero_) {
      // The norm and the factor on the device, for the update that follows; nothing waits here.
      if (overlap_) overlap_->after_compute();
      optimizer_.queue_clip_grad_norm(model_.grads(), max_norm);
      return;
    }
    // Each rank's part of the sum of squares, added in rank order on every rank: the same clipping
    // factor everywhere, the same bits every run (NCCL's summation order does not enter).
    const std::vector<double> parts = collectives_->gather(optimizer_.grad_sum_of_squares(model_.grads()));
    double sum = 0;
    for (double p : parts) sum += p;
    optimizer_.clip_with_sum_of_squares(sum, max_norm);
  }
  double grad_norm() override { return optimizer_.last_grad_norm(); }
  void optimizer_step(double lr) override {
    auto* params16 = static_cast<__nv_bfloat16*>(model_.params_bf16());
    if (!zero_) {
      // The update zeroes each gradient once read (the next step's zero_grad). Overlapped, it runs
      // after everything queued on the compute stream (the backward, a reduction) and announces
      // each part to the next forward; the compute stream writes no gradient or parameter before
      // that forward has waited for every part (train_micro_batch always starts with it, and
      // zero_grad has nothing to do until one ran).
      std::function<void(int)> announce;
      if (overlap_) {
        overlap_->after_compute();
        announce = [this](int part) { overlap_->part_updated(part); };
      }
      optimizer_.step(model_.params(), params16, model_.grads(), lr, announce, /*zero_grads=*/true);
      grads_zeroed_ = true;
      return;
    }
    sync_->wait_for_all_parameters();  // a no-op after a forward; guards against writing what a gather still writes
    optimizer_.step(model_.params(), params16, model_.grads(), lr,
                    [this, params16](int bucket) { sync_->gather_after_update(bucket, model_.params(), params16); });
  }
  bool any_rank(bool local) override { return collectives_ ? collectives_->sum(local ? 1.0 : 0.0) > 0.5 : local; }
  std::vector<double> from_every_rank(double local) override { return collectives_ ? collectives_->gather(local) : std::vector<double>{local}; }
  void measure_communication(bool on) override {
    if (sync_) sync_->measure_waits(on);
    if (overlap_) overlap_->measure_waits(on);
  }
  double take_communication_wait_ms() override { return sync_ ? sync_->take_wait_ms() : 0.0; }
  double take_update_wait_ms() override { return overlap_ ? overlap_->take_wait_ms() : 0.0; }
  bool optimizer_overlaps() const override { return overlap_ != nullptr; }
  std::int64_t graph_replays() const override { return model_.graph_use().replays; }
  std::string execution_summary() const override {
    if (!graph_off_.empty()) return "CUDA graphs: off (" + graph_off_ + ")";
    const model::Gpt2Cuda::GraphUse u = model_.graph_use();
    std::string s = "CUDA graphs: " + std::to_string(u.replays) + " of " + std::to_string(u.replays + u.eager) +
                    " train micro-batches replayed (" + std::to_string(u.captures) + " recorded; the others ran as launches: the first "
                    "of each shape, probe captures)";
    if (!u.failure.empty()) s += "; recording failed, graphs off since: " + u.failure;
    return s;
  }
  void heartbeat(std::int64_t step) override {
    if (collectives_) collectives_->rendezvous().heartbeat(step);
  }
  void finish() override {
    if (collectives_) collectives_->rendezvous().finish();
  }

 private:
  // One optimizer moment from every rank's shard into `full` on rank 0 (collective).
  void gather_moment(const float* device_shard, std::vector<float>& full) {
    collectives_->gather_to_rank_zero(device_shard, optimizer_.state_count(), [&](int rank, std::span<const float> shard) {
      optim::put_shard(*plan_, rank, shard, full);
    });
  }
  // Every forward must announce every range it reads, or it would have read parameters whose
  // all-gather (or overlapped update) was still running.
  void check_forward_waited() const {
    if ((zero_ && sync_->parameters_pending()) || (overlap_ && overlap_->parameters_pending()))
      throw std::logic_error("rank " + std::to_string(world_.rank) +
                             ": the forward did not announce every parameter range it reads (set_parameters_needed); "
                             "it may have read parameters before their " + std::string(zero_ ? "all-gather" : "update") + " finished");
  }
  // Before anything but a forward reads or writes the parameters: the compute stream waits for
  // every pending all-gather (ZeRO-1) or part of the overlapped update.
  void wait_for_all_parameters() {
    if (sync_) sync_->wait_for_all_parameters();
    if (overlap_) overlap_->wait_for_all_parameters();
  }

  int device_;
  World world_;
  model::Gpt2Cuda model_;
  std::optional<optim::ShardPlan> plan_;         // data parallel only
  std::string graph_off_;                        // why micro-batches are not replayed from graphs (empty: they are)
  bool zero_ = false;                            // ZeRO-1: the optimizer holds this rank's shard
  std::unique_ptr<UpdateOverlap> overlap_;       // the optimizer's stream and its events (overlapped update only)
  std::unique_ptr<model::cuda::Blas> overlap_blas_;  // on overlap_'s stream (Muon's products)
  optim::CudaOptimizer optimizer_;
  bool grads_zeroed_ = false;                    // by the last optimizer step, and not written since
  std::vector<float> params_, first_, second_;   // host copies for checkpoints
  std::unique_ptr<Collectives> collectives_;     // data parallel only
  std::unique_ptr<DataParallelSync> sync_;       // data parallel only
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
