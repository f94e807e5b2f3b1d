// Stream work recorded once into a CUDA graph and replayed with one launch (the CUDA trainer's
// micro-batch, model/cuda/gpt2_cuda.cpp).
//
// Why: between dependent kernels queued one by one, the H200 leaves 1.7-1.9 us; inside a graph
// 0.8-1.0 us (model/cuda/lab/launch_gap.cu, docs/benchmarks.md). A GPT-2 step launches ~316
// kernels.
//
// What a replay cannot see: the host. Everything the recorded work reads must be in device memory
// at fixed addresses (launch parameters, pointers and grid sizes are replayed as recorded), and the
// recording must not synchronize, allocate or do first-use work (cuBLASLt's algorithm timing,
// cudaFuncSetAttribute): the caller runs the same work once without recording first. Capture runs in
// cudaStreamCaptureModeThreadLocal, so that such a call by this thread fails instead of
// silently happening at capture time only (and other threads, the batch loader, stay unaffected).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <functional>
#include <stdexcept>

namespace stableflash::model::cuda {

// A capture that could not be completed (a forbidden call, an invalidated capture, an
// instantiation error): what() names it. The stream is usable again and nothing was queued.
struct GraphCaptureError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class StreamGraph {
 public:
  StreamGraph() = default;
  ~StreamGraph();
  StreamGraph(StreamGraph&& o) noexcept;
  StreamGraph& operator=(StreamGraph&& o) noexcept;
  StreamGraph(const StreamGraph&) = delete;
  StreamGraph& operator=(const StreamGraph&) = delete;

  // Records what `work` queues on `stream` (none of it runs) and instantiates it. Throws
  // GraphCaptureError when the capture fails, or rethrows what `work` threw, after ending the
  // capture either way.
  static StreamGraph capture(cudaStream_t stream, const std::function<void()>& work);

  // Queues one replay on `stream`.
  void launch(cudaStream_t stream) const;
  bool empty() const { return exec_ == nullptr; }
  std::size_t nodes() const { return nodes_; }

 private:
  cudaGraphExec_t exec_ = nullptr;
  std::size_t nodes_ = 0;
};

}  // namespace stableflash::model::cuda
