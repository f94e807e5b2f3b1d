// CudaOptimizer: owns the device state and turns each step into launches (see cuda_optimizer.hpp).
// The per-step scalars are computed here on the host, rounded to FP32 exactly where
// Optimizer<float> rounds them, so both optimizers apply the same numbers; the clipping factor is
// computed on the device from the gradient norm (the same formula, the same bits) and read there
// by the update kernels.
#include "stableflash/optim/cuda_optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "optimizer_kernels.cuh"
#include "stableflash/model/cuda/device_array.hpp"

namespace stableflash::optim {

using model::cuda::check_cuda;
using model::cuda::DeviceArray;

struct CudaOptimizer::Impl {
  explicit Impl(model::cuda::Blas& b) : blas(b) {}
  ~Impl() {
    if (norm_copied) cudaStreamSynchronize(blas.stream()), cudaEventDestroy(norm_copied);
    if (host_sums) cudaFreeHost(host_sums);
    if (host_scale) cudaFreeHost(host_scale);
  }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  model::cuda::Blas& blas;
  std::int64_t total = 0;           // flat parameter count (the end of the last tensor)
  std::int64_t state_count = 0;     // values per moment: total, or the shard's
  bool sharded = false;
  DeviceArray<float> m, v;          // [state_count] each; Muon's momentum lives in m
  DeviceArray<cuda_detail::AdamwChunk> chunks;
  // [first, end) of each part's chunks: the buckets when sharded, else the update parts (one
  // part, everything, when none were given).
  std::vector<std::pair<int, int>> bucket_chunks;
  std::vector<cuda_detail::MuonTensor> muon;  // the hidden matrices when config.kind is muon
  std::vector<std::pair<int, int>> part_muon;  // not sharded: [first, end) of each part's Muon matrices
  std::vector<FlatRange> norm_slices;         // what this rank adds to the gradient norm
  DeviceArray<__nv_bfloat16> x, y, gram, poly;
  DeviceArray<double> partials, sums;         // the gradient norm's; sums: one per norm slice
  DeviceArray<double> muon_partials, muon_sum;  // Muon's Frobenius norms'
  double* host_sums = nullptr;  // pinned, so the norm's copy is a true async copy on the stream
  // scales[0]: the pending clipping (set by the norm, read by the next step()); scales[1]: no
  // clipping, {0, 1, 0}, what a step() without a clip since the previous step() reads.
  DeviceArray<cuda_detail::StepScale> scales;
  bool clip_pending = false;
  cuda_detail::StepScale* host_scale = nullptr;  // pinned: the last device norm, copied behind norm_copied
  cudaEvent_t norm_copied = nullptr;
  bool norm_on_device = false;  // the last norm is host_scale's (after norm_copied), else host_norm
  double host_norm = 0;

  cudaStream_t stream() const { return blas.stream(); }
};

namespace {

// A range this optimizer updates: flat [begin, end), its moments from state_offset on, the bucket.
struct OwnedRange {
  FlatRange flat;
  std::int64_t state_offset = 0;
  int bucket = 0;
};

}  // namespace

CudaOptimizer::CudaOptimizer(const OptimizerConfig& config, const std::vector<model::ParamTensor>& tensors, model::cuda::Blas& blas,
                             const ShardPlan* shard_plan, int rank, const std::vector<FlatRange>& update_parts)
    : config_(config), impl_(std::make_unique<Impl>(blas)) {
  config_.validate();
  Impl& s = *impl_;
  for (const auto& t : tensors) s.total = std::max(s.total, t.offset + t.size);
  s.sharded = shard_plan != nullptr;
  std::vector<OwnedRange> owned;
  if (shard_plan) {
    if (shard_plan->total() != s.total)
      throw std::invalid_argument("optimizer: the shard plan covers " + std::to_string(shard_plan->total()) + " parameters, the model has " +
                                  std::to_string(s.total));
    if (rank < 0 || rank >= shard_plan->world())
      throw std::invalid_argument("optimizer: rank " + std::to_string(rank) + " is not in the shard plan's " +
                                  std::to_string(shard_plan->world()) + " ranks");
    const auto& buckets = shard_plan->buckets();
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      const FlatRange r = buckets[b].owned(rank, shard_plan->world());
      if (!r.empty()) owned.push_back({r, s.state_count, int(b)});
      s.state_count += r.size();
    }
    s.norm_slices = shard_plan->norm_slices(rank);
    s.bucket_chunks.assign(buckets.size(), {0, 0});
  } else if (!update_parts.empty()) {
    std::int64_t at = 0;
    for (std::size_t k = 0; k < update_parts.size(); ++k) {
      const FlatRange& r = update_parts[k];
      if (r.begin != at || r.empty())
        throw std::invalid_argument("optimizer: update part " + std::to_string(k) + " is [" + std::to_string(r.begin) + ", " +
                                    std::to_string(r.end) + "); the parts must be non-empty, ascending and contiguous from 0");
      owned.push_back({r, r.begin, int(k)});
      at = r.end;
    }
    if (at != s.total)
      throw std::invalid_argument("optimizer: the update parts end at " + std::to_string(at) + ", the model has " + std::to_string(s.total) +
                                  " parameters");
    s.state_count = s.total;
    s.norm_slices = {{0, s.total}};
    s.bucket_chunks.assign(update_parts.size(), {0, 0});
  } else {
    owned.push_back({{0, s.total}, 0, 0});
    s.state_count = s.total;
    s.norm_slices = {{0, s.total}};
    s.bucket_chunks.assign(1, {0, 0});
  }
  if (shard_plan && !update_parts.empty()) throw std::invalid_argument("optimizer: update parts are for the unsharded optimizer");
  s.part_muon.assign(s.bucket_chunks.size(), {0, 0});
  if (shard_plan && config_.kind == OptimizerKind::muon)
    for (const auto& t : tensors) {
      if (t.role != model::ParamRole::hidden_matrix) continue;
      const auto [first, last] = shard_plan->buckets_touching({t.offset, t.offset + t.size});
      for (int b = first; b < last; ++b)
        if (!shard_plan->buckets()[std::size_t(b)].replicated)
          throw std::logic_error("optimizer: rank " + std::to_string(rank) + ": the shard plan shards Muon's matrix " + t.name +
                                 " (bucket " + std::to_string(b) + "); Newton-Schulz needs it whole");
    }
  std::vector<const model::ParamTensor*> by_offset;
  for (const auto& t : tensors) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->offset < b->offset; });

  std::vector<cuda_detail::AdamwChunk> chunks;
  // Sharded or in parts, a launch covers a bucket or a layer: smaller chunks keep it at hundreds
  // of blocks (and let an overlapped update fill the forward's gaps at a finer grain).
  const std::int64_t chunk = s.sharded || s.bucket_chunks.size() > 1 ? cuda_detail::kAdamwShardChunk : cuda_detail::kAdamwChunk;
  std::int64_t max_wide = 0, max_gram = 0;
  for (const OwnedRange& o : owned) {
    s.bucket_chunks[std::size_t(o.bucket)].first = int(chunks.size());
    s.part_muon[std::size_t(o.bucket)].first = int(s.muon.size());
    for (const model::ParamTensor* tp : by_offset) {
      const model::ParamTensor& t = *tp;
      const std::int64_t lo = std::max(t.offset, o.flat.begin), hi = std::min(t.offset + t.size, o.flat.end);
      if (lo >= hi) continue;
      const std::int64_t state = o.state_offset + (lo - o.flat.begin);
      if (config_.kind == OptimizerKind::muon && t.role == model::ParamRole::hidden_matrix) {
        if (!t.is_2d() || t.shape[0] * t.shape[1] != t.size)
          throw std::invalid_argument("optimizer: Muon needs a 2-D tensor, " + t.name + " is not one");
        // Newton-Schulz needs the whole matrix: the plan keeps Muon's matrices in replicated buckets
        // (checked above), which are owned whole and adjacent in the compact state.
        if (lo != t.offset) continue;  // the rest of a matrix that began in an earlier bucket
        const int rows = int(t.shape[0]), cols = int(t.shape[1]);
        s.muon.push_back({t.offset, state, rows, cols});
        max_wide = std::max(max_wide, t.size);
        max_gram = std::max(max_gram, std::int64_t(std::min(rows, cols)) * std::min(rows, cols));
        continue;
      }
      for (std::int64_t at = lo; at < hi; at += chunk)
        chunks.push_back({at, state + (at - lo), std::int32_t(std::min<std::int64_t>(chunk, hi - at)), t.is_2d() ? 1 : 0});
    }
    s.bucket_chunks[std::size_t(o.bucket)].second = int(chunks.size());
    s.part_muon[std::size_t(o.bucket)].second = int(s.muon.size());
  }
  const cudaStream_t stream = s.stream();
  s.m = DeviceArray<float>(std::size_t(s.state_count));
  s.v = DeviceArray<float>(std::size_t(s.state_count));
  s.m.zero(stream);
  s.v.zero(stream);
  s.chunks = DeviceArray<cuda_detail::AdamwChunk>(chunks.size());
  if (!chunks.empty()) s.chunks.upload(chunks.data(), chunks.size(), stream);
  s.x = DeviceArray<__nv_bfloat16>(std::size_t(max_wide));
  s.y = DeviceArray<__nv_bfloat16>(std::size_t(max_wide));
  s.gram = DeviceArray<__nv_bfloat16>(std::size_t(max_gram));
  s.poly = DeviceArray<__nv_bfloat16>(std::size_t(max_gram));
  s.partials = DeviceArray<double>(cuda_detail::kMaxPartials);
  s.sums = DeviceArray<double>(std::max<std::size_t>(1, s.norm_slices.size()));
  s.muon_partials = DeviceArray<double>(cuda_detail::kMaxPartials);
  s.muon_sum = DeviceArray<double>(1);
  check_cuda(cudaMallocHost(&s.host_sums, s.sums.size() * sizeof(double)), "cudaMallocHost (gradient norm)");
  check_cuda(cudaMallocHost(&s.host_scale, sizeof(cuda_detail::StepScale)), "cudaMallocHost (gradient norm)");
  check_cuda(cudaEventCreateWithFlags(&s.norm_copied, cudaEventDisableTiming), "cudaEventCreate (gradient norm)");
  s.scales = DeviceArray<cuda_detail::StepScale>(2);
  const cuda_detail::StepScale no_clip[2] = {{}, {}};
  s.scales.upload(no_clip, 2, stream);
  // `chunks` is a local: the upload must finish before it goes away.
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize (optimizer setup)");
}

CudaOptimizer::~CudaOptimizer() = default;

double CudaOptimizer::grad_sum_of_squares(const float* grads) {
  Impl& s = *impl_;
  const cudaStream_t stream = s.stream();
  // One fixed-order sum per slice (the partials are reused in stream order), then the slices in
  // ascending order on the host: the same bits every call.
  for (std::size_t k = 0; k < s.norm_slices.size(); ++k)
    cuda_detail::launch_sum_squares(grads + s.norm_slices[k].begin, s.norm_slices[k].size(), s.partials.get(), s.sums.get() + k, stream);
  if (s.norm_slices.empty()) return 0.0;
  check_cuda(cudaMemcpyAsync(s.host_sums, s.sums.get(), s.norm_slices.size() * sizeof(double), cudaMemcpyDeviceToHost, stream),
             "cudaMemcpyAsync (gradient norm)");
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize (gradient norm)");
  double sum = 0;
  for (std::size_t k = 0; k < s.norm_slices.size(); ++k) sum += s.host_sums[k];
  return sum;
}

double CudaOptimizer::clip_with_sum_of_squares(double sum_of_squares, double max_norm) {
  Impl& s = *impl_;
  const double norm = std::sqrt(sum_of_squares);
  // Lazy clipping: no pass over the gradients here; step() multiplies each one by the factor as it
  // reads it (the same FP32 product an in-place rescale would store). The device kernel of
  // queue_clip_grad_norm computes the same formula.
  cuda_detail::StepScale scale;
  scale.norm = norm;
  scale.factor = max_norm > 0 && norm > max_norm ? float(max_norm / (norm + 1e-6)) : 1.0f;
  scale.skip = std::isfinite(norm) ? 0 : 1;
  cuda_detail::launch_set_scale(s.scales.get(), scale, s.stream());
  s.clip_pending = true;
  s.norm_on_device = false;
  s.host_norm = norm;
  return norm;
}

void CudaOptimizer::queue_clip_grad_norm(const float* grads, double max_norm) {
  Impl& s = *impl_;
  const cudaStream_t stream = s.stream();
  // The same fixed-order sums as grad_sum_of_squares, then the factor on the device.
  for (std::size_t k = 0; k < s.norm_slices.size(); ++k)
    cuda_detail::launch_sum_squares(grads + s.norm_slices[k].begin, s.norm_slices[k].size(), s.partials.get(), s.sums.get() + k, stream);
  cuda_detail::launch_clip_factor(s.sums.get(), int(s.norm_slices.size()), max_norm, s.scales.get(), stream);
  // The norm for the logs: copied behind an event, read by last_grad_norm() when the host wants it.
  check_cuda(cudaMemcpyAsync(s.host_scale, s.scales.get(), sizeof(cuda_detail::StepScale), cudaMemcpyDeviceToHost, stream),
             "cudaMemcpyAsync (gradient norm)");
  check_cuda(cudaEventRecord(s.norm_copied, stream), "cudaEventRecord (gradient norm)");
  s.clip_pending = true;
  s.norm_on_device = true;
}

double CudaOptimizer::last_grad_norm() {
  Impl& s = *impl_;
  if (!s.norm_on_device) return s.host_norm;
  check_cuda(cudaEventSynchronize(s.norm_copied), "cudaEventSynchronize (gradient norm)");
  return s.host_scale->norm;
}

double CudaOptimizer::clip_grad_norm(const float* grads, double max_norm) {
  queue_clip_grad_norm(grads, max_norm);
  return last_grad_norm();
}

float CudaOptimizer::pending_clip_factor() const {
  const Impl& s = *impl_;
  if (!s.clip_pending) return 1.0f;
  cuda_detail::StepScale scale;
  s.scales.download(&scale, 1, s.stream());
  check_cuda(cudaStreamSynchronize(s.stream()), "cudaStreamSynchronize (clip factor)");
  return scale.skip ? std::numeric_limits<float>::quiet_NaN() : scale.factor;
}

int CudaOptimizer::part_count() const { return int(impl_->bucket_chunks.size()); }

void CudaOptimizer::step(float* params, __nv_bfloat16* params_bf16, float* grads, double lr,
                         const std::function<void(int part)>& after_part, bool zero_grads) {
  Impl& s = *impl_;
  if (zero_grads && s.sharded) throw std::invalid_argument("optimizer: zero_grads with a sharded optimizer (it reads only its shard)");
  ++t_;
  const cuda_detail::StepScale* scale = s.clip_pending ? s.scales.get() : s.scales.get() + 1;
  s.clip_pending = false;  // the factor is used by this step only
  // As Optimizer<float>::adamw_tensor: constants cast to FP32 one by one, 1 - beta and lr / bc1
  // then computed in FP32.
  cuda_detail::AdamwScalars a;
  a.beta1 = float(config_.beta1);
  a.beta2 = float(config_.beta2);
  a.one_minus_beta1 = 1.0f - a.beta1;
  a.one_minus_beta2 = 1.0f - a.beta2;
  a.eps = float(config_.eps);
  const float bc1 = float(1 - std::pow(config_.beta1, double(t_)));
  a.bc2_sqrt = float(std::sqrt(1 - std::pow(config_.beta2, double(t_))));
  a.step_size = float(lr) / bc1;
  a.decay = float(1 - lr * config_.weight_decay);
  a.scale = scale;
  a.zero_grads = zero_grads ? 1 : 0;
  cuda_detail::MuonScalars mu;
  mu.mu = float(config_.muon_momentum);
  mu.one_minus_mu = 1.0f - mu.mu;
  mu.nesterov = config_.muon_nesterov;
  mu.decay = float(1 - lr * config_.weight_decay);
  mu.ns_steps = config_.muon_ns_steps;
  mu.scale = scale;
  mu.zero_grads = a.zero_grads;
  const cuda_detail::MuonScratch scratch{s.x.get(), s.y.get(), s.gram.get(), s.poly.get(), s.muon_partials.get(), s.muon_sum.get()};
  auto muon = [&](int first, int end) {
    for (int k = first; k < end; ++k) {
      const auto& t = s.muon[std::size_t(k)];
      mu.scaled_lr = float(lr * muon_rms_scale(t.rows, t.cols));
      cuda_detail::muon_tensor(t, mu, params, params_bf16, grads, s.m.get(), scratch, s.blas);
    }
  };
  // Part by part (bucket by bucket when sharded), in ascending order. Every element's arithmetic
  // is the same in any order: the parts only decide when after_part can announce a finished one.
  const cuda_detail::AdamwBuffers buffers{params, params_bf16, grads, s.m.get(), s.v.get()};
  for (std::size_t b = 0; b < s.bucket_chunks.size(); ++b) {
    const auto [first, end] = s.bucket_chunks[b];
    cuda_detail::launch_adamw(s.chunks.get() + first, end - first, a, buffers, s.stream());
    if (!s.sharded) muon(s.part_muon[b].first, s.part_muon[b].second);
    if (after_part) after_part(int(b));
  }
  // Sharded: Muon's matrices (in replicated buckets) after every bucket, as they always were.
  if (s.sharded) muon(0, int(s.muon.size()));
}

std::int64_t CudaOptimizer::state_count() const { return impl_->state_count; }
const float* CudaOptimizer::first_moment_device() const { return impl_->m.get(); }
const float* CudaOptimizer::second_moment_device() const { return impl_->v.get(); }

namespace {
std::string holds(bool sharded, std::int64_t state_count, std::int64_t total) {
  return sharded ? "this rank's shard holds " + std::to_string(state_count) + " (of " + std::to_string(total) + " parameters)"
                 : "the model has " + std::to_string(total) + " parameters";
}
}  // namespace

void CudaOptimizer::download_state(std::span<float> first, std::span<float> second) const {
  const Impl& s = *impl_;
  if (std::int64_t(first.size()) != s.state_count || std::int64_t(second.size()) != s.state_count)
    throw std::invalid_argument("optimizer state: asked to download into " + std::to_string(first.size()) + " and " +
                                std::to_string(second.size()) + " values, " + holds(s.sharded, s.state_count, s.total));
  s.m.download(first.data(), first.size(), s.stream());
  s.v.download(second.data(), second.size(), s.stream());
  check_cuda(cudaStreamSynchronize(s.stream()), "cudaStreamSynchronize (optimizer state download)");
}

void CudaOptimizer::load_state(std::int64_t steps_taken, std::span<const float> first, std::span<const float> second) {
  Impl& s = *impl_;
  if (std::int64_t(first.size()) != s.state_count || std::int64_t(second.size()) != s.state_count)
    throw std::invalid_argument("optimizer state holds " + std::to_string(first.size()) + " and " + std::to_string(second.size()) +
                                " values, " + holds(s.sharded, s.state_count, s.total));
  if (steps_taken < 0) throw std::invalid_argument("optimizer state: negative step count");
  s.m.upload(first.data(), first.size(), s.stream());
  s.v.upload(second.data(), second.size(), s.stream());
  // The host spans may be freed once we return.
  check_cuda(cudaStreamSynchronize(s.stream()), "cudaStreamSynchronize (optimizer state load)");
  t_ = steps_taken;
}

}  // namespace stableflash::optim
