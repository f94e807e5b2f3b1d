// CudaOptimizer: owns the device state and turns each step into launches (see cuda_optimizer.hpp).
// The per-step scalars are computed here on the host, rounded to FP32 exactly where
// Optimizer<float> rounds them, so both optimizers apply the same numbers.
#include "stableflash/optim/cuda_optimizer.hpp"

#include <algorithm>
#include <cmath>
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
    if (host_sum) cudaFreeHost(host_sum);
  }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  model::cuda::Blas& blas;
  std::int64_t total = 0;           // flat parameter count (the end of the last tensor)
  DeviceArray<float> m, v;          // [total] each; Muon's momentum lives in m
  DeviceArray<cuda_detail::AdamwChunk> chunks;
  int n_chunks = 0;
  std::vector<cuda_detail::MuonTensor> muon;  // the hidden matrices when config.kind is muon
  DeviceArray<__nv_bfloat16> x, y, gram, poly;
  DeviceArray<double> partials, sum;
  double* host_sum = nullptr;  // pinned, so the norm's copy is a true async copy on the stream
  float clip_factor = 1.0f;    // set by clip_grad_norm, applied to the gradients by the next step()

  cudaStream_t stream() const { return blas.stream(); }
};

CudaOptimizer::CudaOptimizer(const OptimizerConfig& config, const std::vector<model::ParamTensor>& tensors, model::cuda::Blas& blas)
    : config_(config), impl_(std::make_unique<Impl>(blas)) {
  config_.validate();
  Impl& s = *impl_;
  std::vector<cuda_detail::AdamwChunk> chunks;
  std::int64_t max_wide = 0, max_gram = 0;
  for (const auto& t : tensors) {
    s.total = std::max(s.total, t.offset + t.size);
    if (config_.kind == OptimizerKind::muon && t.role == model::ParamRole::hidden_matrix) {
      if (!t.is_2d() || t.shape[0] * t.shape[1] != t.size)
        throw std::invalid_argument("optimizer: Muon needs a 2-D tensor, " + t.name + " is not one");
      const int rows = int(t.shape[0]), cols = int(t.shape[1]);
      s.muon.push_back({t.offset, rows, cols});
      const std::int64_t r = std::min(rows, cols);
      max_wide = std::max(max_wide, t.size);
      max_gram = std::max(max_gram, r * r);
      continue;
    }
    for (std::int64_t at = 0; at < t.size; at += cuda_detail::kAdamwChunk)
      chunks.push_back({t.offset + at, std::int32_t(std::min<std::int64_t>(cuda_detail::kAdamwChunk, t.size - at)), t.is_2d() ? 1 : 0});
  }
  const cudaStream_t stream = s.stream();
  s.m = DeviceArray<float>(std::size_t(s.total));
  s.v = DeviceArray<float>(std::size_t(s.total));
  s.m.zero(stream);
  s.v.zero(stream);
  s.n_chunks = int(chunks.size());
  s.chunks = DeviceArray<cuda_detail::AdamwChunk>(chunks.size());
  if (!chunks.empty()) s.chunks.upload(chunks.data(), chunks.size(), stream);
  s.x = DeviceArray<__nv_bfloat16>(std::size_t(max_wide));
  s.y = DeviceArray<__nv_bfloat16>(std::size_t(max_wide));
  s.gram = DeviceArray<__nv_bfloat16>(std::size_t(max_gram));
  s.poly = DeviceArray<__nv_bfloat16>(std::size_t(max_gram));
  s.partials = DeviceArray<double>(cuda_detail::kMaxPartials);
  s.sum = DeviceArray<double>(1);
  check_cuda(cudaMallocHost(&s.host_sum, sizeof(double)), "cudaMallocHost (gradient norm)");
  // `chunks` is a local: the upload must finish before it goes away.
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize (optimizer setup)");
}

CudaOptimizer::~CudaOptimizer() = default;

double CudaOptimizer::clip_grad_norm(const float* grads, double max_norm) {
  Impl& s = *impl_;
  const cudaStream_t stream = s.stream();
  cuda_detail::launch_sum_squares(grads, s.total, s.partials.get(), s.sum.get(), stream);
  check_cuda(cudaMemcpyAsync(s.host_sum, s.sum.get(), sizeof(double), cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync (gradient norm)");
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize (gradient norm)");
  const double norm = std::sqrt(*s.host_sum);
  // Lazy clipping: no pass over the gradients here; step() multiplies each one by the factor as it
  // reads it (the same FP32 product an in-place rescale would store).
  s.clip_factor = max_norm > 0 && norm > max_norm ? float(max_norm / (norm + 1e-6)) : 1.0f;
  return norm;
}

void CudaOptimizer::step(float* params, __nv_bfloat16* params_bf16, const float* grads, double lr) {
  Impl& s = *impl_;
  ++t_;
  const float grad_scale = s.clip_factor;
  s.clip_factor = 1.0f;  // used by this step only
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
  a.grad_scale = grad_scale;
  cuda_detail::launch_adamw(s.chunks.get(), s.n_chunks, a, {params, params_bf16, grads, s.m.get(), s.v.get()}, s.stream());

  if (s.muon.empty()) return;
  cuda_detail::MuonScalars mu;
  mu.mu = float(config_.muon_momentum);
  mu.one_minus_mu = 1.0f - mu.mu;
  mu.nesterov = config_.muon_nesterov;
  mu.decay = float(1 - lr * config_.weight_decay);
  mu.ns_steps = config_.muon_ns_steps;
  mu.grad_scale = grad_scale;
  const cuda_detail::MuonScratch scratch{s.x.get(), s.y.get(), s.gram.get(), s.poly.get(), s.partials.get(), s.sum.get()};
  for (const auto& t : s.muon) {
    mu.scaled_lr = float(lr * muon_rms_scale(t.rows, t.cols));
    cuda_detail::muon_tensor(t, mu, params, params_bf16, grads, s.m.get(), scratch, s.blas);
  }
}

void CudaOptimizer::download_state(std::span<float> first, std::span<float> second) const {
  const Impl& s = *impl_;
  if (std::int64_t(first.size()) != s.total || std::int64_t(second.size()) != s.total)
    throw std::invalid_argument("optimizer state: asked to download into " + std::to_string(first.size()) + " and " +
                                std::to_string(second.size()) + " values, the model has " + std::to_string(s.total) + " parameters");
  s.m.download(first.data(), first.size(), s.stream());
  s.v.download(second.data(), second.size(), s.stream());
  check_cuda(cudaStreamSynchronize(s.stream()), "cudaStreamSynchronize (optimizer state download)");
}

void CudaOptimizer::load_state(std::int64_t steps_taken, std::span<const float> first, std::span<const float> second) {
  Impl& s = *impl_;
  if (std::int64_t(first.size()) != s.total || std::int64_t(second.size()) != s.total)
    throw std::invalid_argument("optimizer state holds " + std::to_string(first.size()) + " and " + std::to_string(second.size()) +
                                " values, the model has " + std::to_string(s.total) + " parameters");
  if (steps_taken < 0) throw std::invalid_argument("optimizer state: negative step count");
  s.m.upload(first.data(), first.size(), s.stream());
  s.v.upload(second.data(), second.size(), s.stream());
  // The host spans may be freed once we return.
  check_cuda(cudaStreamSynchronize(s.stream()), "cudaStreamSynchronize (optimizer state load)");
  t_ = steps_taken;
}

}  // namespace stableflash::optim
