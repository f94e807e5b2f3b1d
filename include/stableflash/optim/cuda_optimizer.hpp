// The optimizers of the CUDA trainer: AdamW and Muon on the device, and deterministic global
// gradient-norm clipping. Same rules and state layout as the CPU Optimizer<float>
// (stableflash/optim/optimizer.hpp), so checkpoints move between devices: the first and second
// moments are laid out like the flat parameters, and Muon keeps its momentum in `first`.
//
// Precision: FP32 master weights and FP32 state; after every update a BF16 copy of every parameter
// is written (what the BF16 matmuls read, as autocast would cast the weights). Muon's
// Newton-Schulz iteration runs on BF16 matrices with BF16 GEMMs (FP32 accumulation), as
// torch.optim.Muon does.
//
// ZeRO-1 (data parallel): given a ShardPlan and a rank, the optimizer updates and keeps state for
// that rank's owned ranges only (plan.owned(rank)); its moments are those ranges concatenated
// (state_count() values, the "compact" layout of optim/sharding.hpp). The gradients it reads there
// must be the sums over the ranks (the reduce-scatter leaves them in place); the parameters
// outside them are not touched: the caller all-gathers them after each bucket (step()'s
// after_part). With no plan it is the one-device optimizer, every value owned; given update parts
// it updates them one after the other, so a caller can let the next forward start on the parts
// already done (the one-GPU trainer runs the update on a second stream, train/cuda_engine.cpp).
//
// Clipping never needs the host: the gradient norm and the clipping factor are computed on the
// device and the update kernels read the factor from device memory; the norm reaches the host
// through pinned memory behind an event, read when the host asks for it (last_grad_norm()).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include <functional>

#include "stableflash/model/cuda/blas.hpp"
#include "stableflash/model/gpt2.hpp"
#include "stableflash/optim/optimizer.hpp"
#include "stableflash/optim/sharding.hpp"

namespace stableflash::optim {

class CudaOptimizer {
 public:
  // `tensors` is the model's parameter layout; the optimizer owns its state on the current device.
  // Everything it does is queued on blas.stream(), and `blas` runs Muon's products. `shard_plan`:
  // ZeRO-1, this optimizer is rank `rank` of the plan (null: not sharded). Throws
  // std::logic_error when the plan puts one of Muon's matrices in a sharded bucket.
  // `update_parts` (unsharded only): non-empty ranges, ascending and contiguous from 0 to the
  // parameter count, that step() updates one after the other (after_part); empty: one part.
  CudaOptimizer(const OptimizerConfig& config, const std::vector<model::ParamTensor>& tensors, model::cuda::Blas& blas,
                const ShardPlan* shard_plan = nullptr, int rank = 0, const std::vector<FlatRange>& update_parts = {});
  ~CudaOptimizer();
  CudaOptimizer(const CudaOptimizer&) = delete;
  CudaOptimizer& operator=(const CudaOptimizer&) = delete;

  const OptimizerConfig& config() const { return config_; }

  // Global L2 norm of the device gradients (sum of squares in FP64, fixed order), returned (the
  // norm before clipping). Clipping is applied lazily: when max_norm > 0 and the norm exceeds it,
  // the factor FP32(max_norm / (norm + 1e-6)) (PyTorch's clip_grad_norm_) is remembered, else 1,
  // and the next step() multiplies every gradient by it as it reads it: g' = FP32(g * factor),
  // one rounding, the very values an in-place grads *= factor would have left, so the update is
  // bit for bit that of step() on pre-scaled gradients. grads are NOT rescaled in place: after
  // clip_grad_norm (and after step()) they still hold the unclipped values. Each call replaces
  // the pending factor; step() uses it once, then resets it to 1, so call clip_grad_norm before
  // every step() that should be clipped, on the gradients that step() then receives.
  // A norm that is not finite makes the next step() write nothing at all (the trainer stops there,
  // "before updating the weights"). Synchronizes to return the norm: queue_clip_grad_norm() then
  // last_grad_norm().
  double clip_grad_norm(const float* grads, double max_norm);
  // The same without waiting: queues the sum of squares (the fixed order of grad_sum_of_squares),
  // the norm and the factor (the formula of clip_with_sum_of_squares, the same bits) into device
  // memory for the next step(), and a copy of the norm into pinned host memory.
  void queue_clip_grad_norm(const float* grads, double max_norm);
  // The norm of the last queue_clip_grad_norm / clip_grad_norm / clip_with_sum_of_squares; waits
  // for that norm's copy only (not for anything queued after it).
  double last_grad_norm();
  // The factor the next step() will apply (synchronizes; for tests): 1 when no clip is pending,
  // NaN when the norm was not finite (the step will be skipped).
  float pending_clip_factor() const;
  // The two halves of clip_grad_norm, for sharded data parallelism: the sum of squares (FP64) of
  // this rank's part of the norm (plan.norm_slices(rank): every element counted by exactly one
  // rank; all of them when not sharded), each slice summed in a fixed tree and the slices added in
  // ascending order (synchronizes); then the clipping factor from the sum over every rank, on the
  // host, handed to the device for the next step(). Returns the norm.
  // clip_grad_norm(g, c) == clip_with_sum_of_squares(grad_sum_of_squares(g), c), bit for bit.
  double grad_sum_of_squares(const float* grads);
  double clip_with_sum_of_squares(double sum_of_squares, double max_norm);

  // One update with learning rate lr from the (averaged) device gradients, times the pending
  // clipping factor of clip_grad_norm (1 when none; consumed by this call); writes the FP32
  // params and their BF16 copy params_bf16 (same flat layout). grads are read only, unless
  // zero_grads: then each gradient is set to 0 as it is read (the next step's zero_grad, with no
  // pass of its own; unsharded only).
  // Part by part, ascending, queued on the stream: after the update of part k (its AdamW values,
  // and unsharded its Muon matrices: a matrix belongs to the part it starts in) after_part(k) runs,
  // so the caller can queue work on that part (an event, ZeRO-1's all-gather) while the next
  // updates. The parts are the update parts (unsharded) or the plan's buckets (sharded; Muon's
  // matrices, in replicated buckets, update after the last bucket). The bits of the result do not
  // depend on the parts.
  void step(float* params, __nv_bfloat16* params_bf16, float* grads, double lr, const std::function<void(int part)>& after_part = {},
            bool zero_grads = false);
  // The parts step() goes through (buckets when sharded).
  int part_count() const;

  std::int64_t steps_taken() const { return t_; }
  // Values of each moment this optimizer holds: the parameter count, or the shard's
  // (ShardPlan::owned_count()).
  std::int64_t state_count() const;
  // Host copies of the state (synchronous), and loading it back; both state_count() values long
  // (sharded: the compact layout; take_shard / put_shard convert).
  void download_state(std::span<float> first, std::span<float> second) const;
  void load_state(std::int64_t steps_taken, std::span<const float> first, std::span<const float> second);
  // The device moments (state_count() values each), for the collectives that gather them.
  const float* first_moment_device() const;
  const float* second_moment_device() const;

 private:
  struct Impl;
  OptimizerConfig config_;
  std::int64_t t_ = 0;
  std::unique_ptr<Impl> impl_;
};

// BF16 copy of FP32 values: dst[i] = BF16(src[i]) (round to nearest even). Used after loading
// weights, so the BF16 copy always equals what step() would write.
void to_bf16(__nv_bfloat16* dst, const float* src, std::int64_t n, cudaStream_t stream);

}  // namespace stableflash::optim
