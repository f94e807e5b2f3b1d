// Host-pointer conveniences of the CUDA path: copy host tensors to the GPU, run, copy back.
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "plan.hpp"
#include "stableflash/attention/cuda.hpp"

namespace stableflash::attention::cuda {
namespace {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(err));
}

// A device copy of a host array (or an uninitialized buffer), freed on scope exit.
template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(std::size_t n, const T* host = nullptr) : n_(n) {
    check(cudaMalloc(&ptr_, n * sizeof(T) + 16), "cudaMalloc");
    if (host) check(cudaMemcpy(ptr_, host, n * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy to device");
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() { cudaFree(ptr_); }
  T* get() const { return ptr_; }
  void copy_to(T* host) const {
    if (host) check(cudaMemcpy(host, ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy to host");
  }

 private:
  T* ptr_ = nullptr;
  std::size_t n_;
};

// Optional host pointers become optional device arrays.
template <class T>
std::unique_ptr<DeviceArray<T>> maybe(const T* host, std::size_t n, bool upload) {
  if (!host) return nullptr;
  return std::make_unique<DeviceArray<T>>(n, upload ? host : nullptr);
}
template <class T>
T* ptr(const std::unique_ptr<DeviceArray<T>>& a) {
  return a ? a->get() : nullptr;
}

// The copies below are of packed tensors; strided host views would need gathers nobody uses.
void require_packed(bool strided) {
  if (strided)
    throw std::invalid_argument("strides: the host staging helpers copy packed tensors; pass device pointers to "
                                "cuda::forward / backward for strided views");
}
bool any_set(const ForwardStrides& s) { return s.q || s.k || s.v || s.o; }
bool any_set(const BackwardStrides& s) { return s.q || s.k || s.v || s.o || s.d_o || s.dq || s.dk || s.dv; }

}  // namespace

void forward_from_host(const ForwardArgs& h, const AttentionOptions& options, const Kernels& kernels) {
  require_packed(any_set(h.strides));
  const AttentionShape& s = h.shape;
  const auto nq = std::size_t(s.q_elements()), nk = std::size_t(s.k_elements()), rows = std::size_t(s.rows());
  DeviceArray<bf16> q(nq, h.q), k(nk, h.k), v(nk, h.v), o(nq);
  DeviceArray<float> lse(rows);
  auto residual = maybe(h.o_residual, nq, false);
  ForwardArgs d = h;  // ties stays a host pointer (counters are copied back synchronously)
  d.q = q.get(), d.k = k.get(), d.v = v.get(), d.o = o.get(), d.lse = lse.get(), d.o_residual = ptr(residual);
  AttentionOptions opt = options;
  opt.device = Device::cuda;
  kernels.forward(d, opt);
  // A forward that counts events takes the units walk (plan.hpp). Where the same call without
  // counters takes the pipelined fast path, whose steps (and at D = 128 log2-unit scores) round
  // differently, the outputs handed back are that call's, the ones a user's forward makes: the
  // counts come from the first run, the outputs from a second without counters.
  if ((d.ties || d.head_ties) && takes_fast_path(opt.numerics, opt.policy, /*count_events=*/false)) {
    d.ties = nullptr, d.head_ties = nullptr;
    kernels.forward(d, opt);
  }
  check(cudaDeviceSynchronize(), "forward");
  o.copy_to(h.o), lse.copy_to(h.lse);
  if (residual) residual->copy_to(h.o_residual);
}

void backward_from_host(const BackwardArgs& h, const AttentionOptions& options, const Kernels& kernels) {
  require_packed(any_set(h.strides));
  const AttentionShape& s = h.shape;
  const auto nq = std::size_t(s.q_elements()), nk = std::size_t(s.k_elements()), rows = std::size_t(s.rows());
  DeviceArray<bf16> q(nq, h.q), k(nk, h.k), v(nk, h.v), o(nq, h.o), d_o(nq, h.d_o), dq(nq), dk(nk), dv(nk);
  DeviceArray<float> lse(rows, h.lse);
  auto residual = maybe(h.o_residual, nq, true);
  auto delta = maybe(static_cast<const float*>(h.delta), rows, false);
  BackwardArgs d = h;
  d.q = q.get(), d.k = k.get(), d.v = v.get(), d.o = o.get(), d.d_o = d_o.get(), d.lse = lse.get();
  d.o_residual = ptr(residual), d.delta = ptr(delta);
  d.dq = dq.get(), d.dk = dk.get(), d.dv = dv.get();
  AttentionOptions opt = options;
  opt.device = Device::cuda;
  kernels.backward(d, opt);
  check(cudaDeviceSynchronize(), "backward");
  dq.copy_to(h.dq), dk.copy_to(h.dk), dv.copy_to(h.dv);
  if (delta) delta->copy_to(h.delta);
}

void delta_from_host(const BackwardArgs& h, const AttentionOptions& options, float* delta_out) {
  require_packed(any_set(h.strides));
  const AttentionShape& s = h.shape;
  const auto nq = std::size_t(s.q_elements()), nk = std::size_t(s.k_elements()), rows = std::size_t(s.rows());
  DeviceArray<bf16> q(nq, h.q), k(nk, h.k), v(nk, h.v), o(nq, h.o), d_o(nq, h.d_o);
  DeviceArray<float> lse(rows, h.lse), delta(rows);
  auto residual = maybe(h.o_residual, nq, true);
  BackwardArgs d = h;
  d.q = q.get(), d.k = k.get(), d.v = v.get(), d.o = o.get(), d.d_o = d_o.get(), d.lse = lse.get();
  d.o_residual = ptr(residual), d.dq = d.dk = d.dv = nullptr, d.delta = nullptr;
  AttentionOptions opt = options;
  opt.device = Device::cuda;
  cuda::delta(d, opt, delta.get());
  check(cudaDeviceSynchronize(), "delta");
  delta.copy_to(delta_out);
}

}  // namespace stableflash::attention::cuda
