// StreamGraph (stableflash/model/cuda/stream_graph.hpp): capture, instantiate, replay.
#include "stableflash/model/cuda/stream_graph.hpp"

#include <string>
#include <utility>

#include "stableflash/model/cuda/device_array.hpp"

namespace stableflash::model::cuda {
namespace {

std::string failure(const char* what, cudaError_t err) { return std::string(what) + ": " + cudaGetErrorString(err); }

// Ends a capture that `work` left (normally or by throwing) and drops what it recorded; the
// errors a failed capture leaves behind are not sticky, so they are read off here and later CUDA
// calls do not report them again.
void abandon_capture(cudaStream_t stream) {
  cudaGraph_t graph = nullptr;
  cudaStreamEndCapture(stream, &graph);
  if (graph) cudaGraphDestroy(graph);
  cudaGetLastError();
}

}  // namespace

StreamGraph::~StreamGraph() {
  if (exec_) cudaGraphExecDestroy(exec_);
}

StreamGraph::StreamGraph(StreamGraph&& o) noexcept : exec_(std::exchange(o.exec_, nullptr)), nodes_(std::exchange(o.nodes_, 0)) {}

StreamGraph& StreamGraph::operator=(StreamGraph&& o) noexcept {
  if (this != &o) {
    if (exec_) cudaGraphExecDestroy(exec_);
    exec_ = std::exchange(o.exec_, nullptr);
    nodes_ = std::exchange(o.nodes_, 0);
  }
  return *this;
}

StreamGraph StreamGraph::capture(cudaStream_t stream, const std::function<void()>& work) {
  const cudaError_t begin = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
  if (begin != cudaSuccess) {
    cudaGetLastError();
    throw GraphCaptureError(failure("cudaStreamBeginCapture", begin));
  }
  try {
    work();
  } catch (const std::exception& e) {
    abandon_capture(stream);
    throw GraphCaptureError(std::string("while recording: ") + e.what());
  } catch (...) {
    abandon_capture(stream);
    throw;
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  if (end != cudaSuccess || !graph) {
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    throw GraphCaptureError(failure("cudaStreamEndCapture", end));
  }
  StreamGraph g;
  cudaGraphGetNodes(graph, nullptr, &g.nodes_);
  const cudaError_t made = cudaGraphInstantiate(&g.exec_, graph, 0);
  cudaGraphDestroy(graph);  // the executable graph is independent of it
  if (made != cudaSuccess) {
    g.exec_ = nullptr;
    cudaGetLastError();
    throw GraphCaptureError(failure("cudaGraphInstantiate", made));
  }
  // The device copy of the graph now, not at the first replay (which would pay it inside a step).
  const cudaError_t uploaded = cudaGraphUpload(g.exec_, stream);
  if (uploaded != cudaSuccess) {
    cudaGetLastError();
    throw GraphCaptureError(failure("cudaGraphUpload", uploaded));
  }
  return g;
}

void StreamGraph::launch(cudaStream_t stream) const {
  if (!exec_) throw std::logic_error("StreamGraph::launch: nothing was captured");
  check_cuda(cudaGraphLaunch(exec_, stream), "cudaGraphLaunch");
}

}  // namespace stableflash::model::cuda
