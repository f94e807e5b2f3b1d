// The CUDA entry points in a build without CUDA: they exist so callers need no #ifdefs, and say
// plainly why they cannot run.
#include <stdexcept>

#include "stableflash/attention/cuda.hpp"

namespace stableflash::attention::cuda {
namespace {
[[noreturn]] void unavailable() {
  throw std::runtime_error("this stableflash was built without CUDA (no nvcc at configure time, or STABLEFLASH_CUDA=OFF)");
}
}  // namespace

bool built() { return false; }
bool has_device() { return false; }
std::string device_name() { return "none"; }
void check_supported(const AttentionShape&, const AttentionOptions&) { unavailable(); }
void check_supported_args(const ForwardArgs&, const AttentionOptions&) { unavailable(); }
void check_supported_args(const BackwardArgs&, const AttentionOptions&) { unavailable(); }
void forward(const ForwardArgs&, const AttentionOptions&) { unavailable(); }
void backward(const BackwardArgs&, const AttentionOptions&) { unavailable(); }
void delta(const BackwardArgs&, const AttentionOptions&, float*) { unavailable(); }
std::size_t backward_workspace_bytes(const BackwardArgs&, const AttentionOptions&) { unavailable(); }
void forward_from_host(const ForwardArgs&, const AttentionOptions&, const Kernels&) { unavailable(); }
void backward_from_host(const BackwardArgs&, const AttentionOptions&, const Kernels&) { unavailable(); }
void delta_from_host(const BackwardArgs&, const AttentionOptions&, float*) { unavailable(); }
BenchTiming bench(const AttentionShape&, Layout, const AttentionOptions&, std::uint64_t, double, int, double, const Kernels&) {
  unavailable();
}
}  // namespace stableflash::attention::cuda
